"""Registries for local runs, tests and benchmarks. The sandbox registry has
capabilities whose providers are the sandbox on its default port; only `up`, `demo`,
`chaos` and the tests use it, since a production process is given its registry by
TOOL_DISPATCHER_CAPABILITIES_FILE. :func:`capability` builds one capability on a
sandbox at any URL, and :func:`registry_toml` writes a registry as the file a process
reads."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dispatcher.capabilities import Capability, CapabilityRegistry, load_registry

SANDBOX_REGISTRY = Path(__file__).with_name("sandbox_registry.toml")

# The discard port: nothing answers there, for capabilities whose calls never execute.
NOWHERE = "http://127.0.0.1:9"

# Reconciler backoffs short enough that a test or a benchmark never waits them out.
_FAST_RECONCILE = {"initialDelaySeconds": 0.01, "maxDelaySeconds": 0.05}


def sandbox_registry() -> CapabilityRegistry:
    return load_registry(SANDBOX_REGISTRY)


def capability(
    cap_id: str,
    base_url: str = NOWHERE,
    *,
    side_effects: bool = True,
    path: str = "/v1/requests",
    timeout: float | None = 2.0,
    attempts: int | None = 3,
    backoff: tuple[float, float] = (0.01, 0.05),
    lookup: bool = True,
    lookup_timeout: float | None = None,
    by_key: bool = False,
    compensation: bool = False,
    reconcile: Mapping[str, Any] | None = None,
    **fields: Any,
) -> Capability:
    """A capability whose provider is the sandbox at ``base_url``.

    ``timeout`` and ``attempts`` set the request timeout and the retry policy (retries
    back off from ``backoff[0]`` to at most ``backoff[1]`` seconds); ``None`` leaves
    either to the registry's default. ``lookup``, ``by_key`` and ``compensation`` add
    the sandbox's status lookup, lookup by idempotency key and reversal, the lookups
    with ``lookup_timeout``. ``reconcile`` is a reconcile policy, laid over backoffs of
    10 to 50 ms. ``fields`` are further registry fields, spelt as in the TOML file
    (``requiresApproval``, ``risk``, ...), and win over everything above."""
    spec: dict[str, Any] = {
        "id": cap_id,
        "sideEffects": side_effects,
        "request": _endpoint("POST", base_url + path, timeout),
    }
    if lookup:
        url = base_url + "/v1/requests/{externalRequestId}"
        spec["statusLookup"] = _endpoint("GET", url, lookup_timeout)
    if by_key:
        url = base_url + "/v1/requests?idempotencyKey={idempotencyKey}"
        spec["lookupByKey"] = _endpoint("GET", url, lookup_timeout)
    if compensation:
        url = base_url + "/v1/requests/{externalRequestId}/reverse"
        spec["compensation"] = _endpoint("POST", url, None)
    if attempts is not None:
        spec["retry"] = {
            "maxAttempts": attempts,
            "initialBackoffSeconds": backoff[0],
            "maxBackoffSeconds": backoff[1],
        }
    if reconcile is not None:
        spec["reconcile"] = {**_FAST_RECONCILE, **reconcile}
    return Capability.model_validate({**spec, **fields})


def _endpoint(method: str, url: str, timeout: float | None) -> dict[str, Any]:
    endpoint: dict[str, Any] = {"method": method, "url": url}
    if timeout is not None:
        endpoint["timeoutSeconds"] = timeout
    return endpoint


def registry_of(*capabilities: Capability) -> CapabilityRegistry:
    return CapabilityRegistry({c.id: c for c in capabilities})


def refund_and_lookup(
    sandbox_url: str,
    *,
    timeout: float = 2.0,
    attempts: int = 3,
    breaker: Mapping[str, Any] | None = None,
    by_key: bool = False,
) -> CapabilityRegistry:
    """A side-effecting ``refund`` and a read-only ``lookup`` on the sandbox: what the
    process tests and the dispatch benchmark run their workers with; ``breaker``: the
    refund's circuit breaker, spelt as in the TOML file; ``by_key``: the refund can be
    looked up by its idempotency key (a request lost before any answer can be asked)."""
    options: dict[str, Any] = {"timeout": timeout, "attempts": attempts, "backoff": (0.02, 0.1)}
    guarded: dict[str, Any] = {"breaker": dict(breaker)} if breaker else {}
    return registry_of(
        capability("refund", sandbox_url, by_key=by_key, **options, **guarded),
        capability("lookup", sandbox_url, side_effects=False, **options),
    )


def registry_toml(registry: CapabilityRegistry) -> str:
    """``registry`` as a capabilities file: ``load_registry`` reads it back equal."""
    tables = []
    for cap in registry:
        fields = cap.model_dump(by_alias=True, exclude_defaults=True, mode="json")
        lines = [f"{name} = {_toml_value(value)}" for name, value in fields.items()]
        tables.append("[[capability]]\n" + "\n".join(lines) + "\n")
    return "\n".join(tables)


def _toml_value(value: Any) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + " }"
    # A JSON string, number or boolean is the same value in TOML.
    return json.dumps(value)
