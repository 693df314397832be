"""The service's configuration in a chaos run: its capability registry and the settings
every process of the run is started with."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from devtools.chaos.infra import Infrastructure
from devtools.chaos.load import (
    APPROVED,
    ATTACH,
    ATTACH_KEYS,
    MAX_MESSAGE_BYTES,
    READ_ONLY,
    READ_ONLY_KEYS,
    SIDE_EFFECT_KEYS,
    SIDE_EFFECTS,
    TENANTS,
)
from devtools.chaos.retention import WINDOW_SECONDS
from dispatcher.settings import hash_api_key

# The provider's idempotency window is short, so that the retention job (which keeps a
# call while its window is open) archives calls while the run goes on.
_RECONCILE = (
    "initialDelaySeconds = 0.5, maxDelaySeconds = 3, "
    'onNotFound = "redispatch", maxRedispatches = 4, inFlightSeconds = 10, '
    f"idempotencyWindowSeconds = {WINDOW_SECONDS:g}"
)


def capabilities_toml(proxy_url: str, sandbox_url: str) -> str:
    """Requests go through the proxy (wire faults); lookups, reversals go straight to
    the sandbox: the proxy stands between the workers and the provider only."""
    requests = (
        f'request = {{ method = "POST", url = "{proxy_url}/v1/requests", timeoutSeconds = 2 }}'
    )
    by_id = f"{sandbox_url}/v1/requests/{{externalRequestId}}"
    lookups = (
        f'statusLookup = {{ method = "GET", url = "{by_id}" }}\n'
        f'lookupByKey = {{ method = "GET", '
        f'url = "{sandbox_url}/v1/requests?idempotencyKey={{idempotencyKey}}" }}\n'
        f'compensation = {{ method = "POST", url = "{by_id}/reverse" }}\n'
        "retry = { maxAttempts = 3, initialBackoffSeconds = 0.05, maxBackoffSeconds = 0.2 }\n"
    )
    # Re-sends spread over longer than the longest wire fault (6 s), so one stall does
    # not use them all up. A request may reach the sandbox up to a stall (6 s) after
    # the worker gave up.
    reconcile = f"reconcile = {{ maxAttempts = 12, {_RECONCILE} }}\n"
    # The documents the provider never finishes: two lookups, then a human is asked.
    gives_up = reconcile.replace("maxAttempts = 12", "maxAttempts = 2")
    side_effects = 'sideEffects = true\nonRunStopped = "compensate"\n'

    def keys(prefix: str) -> str:
        return f'idempotencyKeyTemplate = "{prefix}{{input.orderId}}:{{correlationId}}"\n'

    return (
        f'[[capability]]\nid = "{SIDE_EFFECTS}"\n{side_effects}{keys(SIDE_EFFECT_KEYS)}'
        f"{requests}\n{lookups}{reconcile}\n"
        f'[[capability]]\nid = "{APPROVED}"\n{side_effects}{keys(SIDE_EFFECT_KEYS)}'
        f"requiresApproval = true\n{requests}\n{lookups}{reconcile}\n"
        f'[[capability]]\nid = "{ATTACH}"\n{side_effects}{keys(ATTACH_KEYS)}'
        f"{requests}\n{lookups}{gives_up}\n"
        f'[[capability]]\nid = "{READ_ONLY}"\nsideEffects = false\n{keys(READ_ONLY_KEYS)}'
        f"{requests}\n{lookups}{reconcile}"
    )


def request_topics(tag: str) -> dict[str, str]:
    """Bus intake's request topic of each tenant of the load (tenant -> topic); a topic's
    name may not hold the twin tenant's ``/``."""
    return {tenant: f"chaos-{tag}.requests.{tenant.replace('/', '-')}" for tenant in TENANTS}


def chaos_env(
    work: Path, infra: Infrastructure, *, api_port: int, api_keys: Mapping[str, str], tag: str
) -> dict[str, str]:
    """The service's settings for every process of the run: one API key a tenant
    (``api_keys``: tenant -> key), one request topic a tenant for bus intake, small
    pools (the machine may be small and its database shared), short leases and
    intervals (so the run settles quickly after its last fault), and a relay that
    refuses messages over the load's limit."""
    return {
        "TOOL_DISPATCHER_DATABASE_URL": infra.database_url,
        "TOOL_DISPATCHER_KAFKA_BOOTSTRAP": infra.kafka_bootstrap,
        "TOOL_DISPATCHER_KAFKA_ENABLE_IDEMPOTENCE": "false",
        "TOOL_DISPATCHER_CAPABILITIES_FILE": str(work / "capabilities.toml"),
        "TOOL_DISPATCHER_STATE_DIR": str(work / "state"),
        "TOOL_DISPATCHER_HTTP_PORT": str(api_port),
        "TOOL_DISPATCHER_API_KEYS": json.dumps(
            [
                {"sha256": hash_api_key(key), "tenant": tenant, "name": f"load of {tenant}"}
                for tenant, key in api_keys.items()
            ]
        ),
        "TOOL_DISPATCHER_RELAY__MAX_MESSAGE_BYTES": str(MAX_MESSAGE_BYTES),
        "TOOL_DISPATCHER_DISPATCH_TOPIC": f"chaos-commands-{tag}",
        "TOOL_DISPATCHER_EVENTS_TOPIC": f"chaos-events-{tag}",
        "TOOL_DISPATCHER_ESCALATIONS_TOPIC": f"chaos-escalations-{tag}",
        "TOOL_DISPATCHER_WORKER_GROUP_ID": f"chaos-workers-{tag}",
        "TOOL_DISPATCHER_BUS__TOPICS": json.dumps(
            {topic: tenant for tenant, topic in request_topics(tag).items()}
        ),
        "TOOL_DISPATCHER_BUS__GROUP_ID": f"chaos-bus-{tag}",
        "TOOL_DISPATCHER_TOPIC_PARTITIONS": "8",
        "TOOL_DISPATCHER_DB_POOL_SIZE": "3",
        "TOOL_DISPATCHER_WORKER_BATCH_SIZE": "16",
        "TOOL_DISPATCHER_WORKER_CONCURRENCY": "16",
        "TOOL_DISPATCHER_PROVIDER_MAX_CONNECTIONS": "8",
        "TOOL_DISPATCHER_MIN_LEASE_SECONDS": "1",
        "TOOL_DISPATCHER_LEASE_MARGIN_SECONDS": "0.5",
        "TOOL_DISPATCHER_RECOVERY_INTERVAL_SECONDS": "0.5",
        "TOOL_DISPATCHER_REDRIVE_AFTER_SECONDS": "5",
        "TOOL_DISPATCHER_REDRIVE_INTERVAL_SECONDS": "1",
        "TOOL_DISPATCHER_KAFKA_SESSION_TIMEOUT_MS": "6000",
        # A client that saw a topic Tansu auto-created after a restart, with too few
        # partitions, sees it again with all of them soon after (chaos.topics repairs it).
        "TOOL_DISPATCHER_KAFKA_METADATA_MAX_AGE_MS": "1000",
        "TOOL_DISPATCHER_RECONCILE_INTERVAL_SECONDS": "0.5",
        "TOOL_DISPATCHER_RECONCILE_LEASE_SECONDS": "5",
        "TOOL_DISPATCHER_RECONCILE_CONCURRENCY": "16",
    }
