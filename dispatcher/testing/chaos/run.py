"""One chaos run, start to finish: infrastructure, processes, load and faults, settling,
the invariants, the report."""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine

from dispatcher.db.engine import engine_for
from dispatcher.settings import Settings, environment_without_settings, hash_api_key
from dispatcher.testing.chaos.checker import (
    INVARIANTS,
    Evidence,
    check,
    gather,
    unsettled_count,
)
from dispatcher.testing.chaos.diagnose import diagnose
from dispatcher.testing.chaos.faults import Injector
from dispatcher.testing.chaos.infra import Infrastructure, infrastructure
from dispatcher.testing.chaos.load import (
    APPROVED,
    READ_ONLY,
    READ_ONLY_KEYS,
    SIDE_EFFECT_KEYS,
    SIDE_EFFECTS,
    Load,
)
from dispatcher.testing.chaos.proxy import TcpProxy
from dispatcher.testing.chaos.report import ChaosReport
from dispatcher.testing.chaos.schedule import FaultKind, PlannedFault, plan
from dispatcher.testing.chaos.supervisor import Supervisor
from dispatcher.testing.embedded import free_port
from dispatcher.topics import ensure_topics

log = logging.getLogger(__name__)

PLANTS = {
    "blind-retry": ("dispatcher.testing.chaos.blind_worker", FaultKind.PROVIDER_DROP_AFTER_APPLY),
    "stale-fence": ("dispatcher.testing.chaos.stale_fence_worker", FaultKind.ZOMBIE_READ_ONLY),
}
"""Planted defects: the module the workers run instead of the real worker, and the
fault a planted run (a short one) leads with so that the defect has work to do early."""
WORKERS = 2
RELAYS = 2
TENANT = "chaos"


@dataclass(frozen=True)
class ChaosOptions:
    duration: float
    seed: int
    rate: float = 8.0
    plant: str | None = None
    settle_timeout: float = 90.0
    keep: bool = False
    """Keep the run's directory (process logs) even when it passed."""


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
        # Re-sends spread over longer than the longest wire fault (6 s), so one stall
        # does not use them all up.
        # A request may reach the sandbox up to a stall (6 s) after the worker gave up.
        "reconcile = { maxAttempts = 12, initialDelaySeconds = 0.5, maxDelaySeconds = 3, "
        'onNotFound = "redispatch", maxRedispatches = 4, inFlightSeconds = 10 }\n'
    )
    side_effects = (
        'sideEffects = true\nonRunStopped = "compensate"\n'
        f'idempotencyKeyTemplate = "{SIDE_EFFECT_KEYS}{{input.orderId}}:{{correlationId}}"\n'
    )
    return (
        f'[[capability]]\nid = "{SIDE_EFFECTS}"\n{side_effects}{requests}\n{lookups}\n'
        f'[[capability]]\nid = "{APPROVED}"\n{side_effects}requiresApproval = true\n'
        f"{requests}\n{lookups}\n"
        f'[[capability]]\nid = "{READ_ONLY}"\nsideEffects = false\n'
        f'idempotencyKeyTemplate = "{READ_ONLY_KEYS}{{input.orderId}}:{{correlationId}}"\n'
        f"{requests}\n{lookups}"
    )


def chaos_env(
    work: Path, infra: Infrastructure, *, api_port: int, api_key: str, tag: str
) -> dict[str, str]:
    """The service's settings for every process of the run: small pools (the machine
    may be small and its database shared), short leases and intervals (so the run
    settles quickly after its last fault)."""
    return {
        "TOOL_DISPATCHER_DATABASE_URL": infra.database_url,
        "TOOL_DISPATCHER_KAFKA_BOOTSTRAP": infra.kafka_bootstrap,
        "TOOL_DISPATCHER_KAFKA_ENABLE_IDEMPOTENCE": "false",
        "TOOL_DISPATCHER_CAPABILITIES_FILE": str(work / "capabilities.toml"),
        "TOOL_DISPATCHER_STATE_DIR": str(work / "state"),
        "TOOL_DISPATCHER_HTTP_PORT": str(api_port),
        "TOOL_DISPATCHER_API_KEYS": json.dumps(
            [{"sha256": hash_api_key(api_key), "tenant": TENANT, "name": "chaos"}]
        ),
        "TOOL_DISPATCHER_DISPATCH_TOPIC": f"chaos-commands-{tag}",
        "TOOL_DISPATCHER_EVENTS_TOPIC": f"chaos-events-{tag}",
        "TOOL_DISPATCHER_ESCALATIONS_TOPIC": f"chaos-escalations-{tag}",
        "TOOL_DISPATCHER_WORKER_GROUP_ID": f"chaos-workers-{tag}",
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


async def run_chaos(options: ChaosOptions, settings: Settings) -> ChaosReport:
    started = time.monotonic()
    # Kept short ($TMPDIR, default /tmp): the embedded server's Unix socket lives in
    # here, and socket paths are limited to about 100 bytes.
    work = Path(tempfile.mkdtemp(prefix=f"td-chaos-{options.seed}-"))
    async with infrastructure(settings, work, options.seed) as infra:
        report = await _run(options, infra, work, started)
    if report.passed and not options.keep:
        shutil.rmtree(work, ignore_errors=True)
    else:
        report.notes.append(f"process logs kept in {work}")
    return report


async def _run(
    options: ChaosOptions, infra: Infrastructure, work: Path, started: float
) -> ChaosReport:
    sandbox_port, api_port = free_port(), free_port()
    sandbox_url = f"http://127.0.0.1:{sandbox_port}"
    proxy = TcpProxy("127.0.0.1", sandbox_port)
    await proxy.start()
    (work / "capabilities.toml").write_text(
        capabilities_toml(f"http://127.0.0.1:{proxy.port}", sandbox_url)
    )
    (work / "logs").mkdir()
    api_key = "tdk_chaos_" + secrets.token_urlsafe(16)
    tag = f"{options.seed}-{secrets.token_hex(3)}"
    # The run's settings only: nothing of the caller's TOOL_DISPATCHER_* leaks in.
    env = {
        **environment_without_settings(),
        **chaos_env(work, infra, api_port=api_port, api_key=api_key, tag=tag),
    }
    await _make_topics(infra, env)
    supervisor = _supervisor(work / "logs", env, sandbox_port, options.plant)
    engine = engine_for(infra.database_url, pool_size=2)
    load = Load(f"http://127.0.0.1:{api_port}", api_key, seed=options.seed, rate=options.rate)
    injector = Injector(supervisor, infra, proxy, sandbox_url)
    faults = plan(
        options.seed,
        options.duration,
        owns_database=infra.owns_database,
        owns_broker=infra.owns_broker,
        lead=PLANTS[options.plant][1] if options.plant else None,
    )
    watcher: asyncio.Task[None] | None = None
    try:
        supervisor.start_all()
        await _ready(f"{sandbox_url}/v1/health", f"http://127.0.0.1:{api_port}/readyz")
        watcher = asyncio.create_task(supervisor.watch())
        stop_load, stop_approver = asyncio.Event(), asyncio.Event()
        submitting = asyncio.create_task(load.submit_until(stop_load))
        approving = asyncio.create_task(load.approve_until(stop_approver))
        await _inject(injector, faults, options.duration)
        stop_load.set()
        await submitting
        await injector.lift_all()
        lifted = time.monotonic()
        settled = await _settle(engine, options.settle_timeout)
        done = time.monotonic()
        # Taken at once, while whatever kept the run from settling still holds.
        diagnosis = (
            []
            if settled
            else await diagnose(engine, work / "logs", env["TOOL_DISPATCHER_DISPATCH_TOPIC"])
        )
        stop_approver.set()
        await approving
        await load.close()
        evidence = await _evidence(engine, sandbox_url, load, env)
        report = _report(
            options,
            infra,
            work,
            load,
            injector,
            supervisor,
            evidence,
            settle_seconds=done - lifted if settled else None,
            since_last_fault_seconds=done - (injector.last_injected or lifted) if settled else None,
            wall_seconds=time.monotonic() - started,
        )
        report.notes += diagnosis
        return report
    finally:
        if watcher is not None:
            watcher.cancel()
        await asyncio.to_thread(supervisor.stop_all)
        await proxy.stop()
        await engine.dispose()


async def _evidence(
    engine: AsyncEngine, sandbox_url: str, load: Load, env: Mapping[str, str]
) -> Evidence:
    """What the invariants are checked against: the database, the sandbox and the load's stats."""
    return await gather(
        engine,
        sandbox_url,
        [a.tool_call_id for a in load.stats.acks],
        [
            f"{m.original} answered {m.http_status} {m.answered}"
            for m in load.stats.replay_mismatches
        ],
        read_only={READ_ONLY},
        dispatch_topic=env["TOOL_DISPATCHER_DISPATCH_TOPIC"],
        hostile_misanswered=load.stats.hostile_misanswered,
        valid_refused=load.stats.valid_refused,
    )


async def _make_topics(infra: Infrastructure, env: Mapping[str, str]) -> None:
    """The run's own topics, named in its environment."""
    infra.topics = Settings(
        kafka_bootstrap=infra.kafka_bootstrap,
        dispatch_topic=env["TOOL_DISPATCHER_DISPATCH_TOPIC"],
        events_topic=env["TOOL_DISPATCHER_EVENTS_TOPIC"],
        escalations_topic=env["TOOL_DISPATCHER_ESCALATIONS_TOPIC"],
        topic_partitions=int(env["TOOL_DISPATCHER_TOPIC_PARTITIONS"]),
    )
    await ensure_topics(infra.topics)


def _report(
    options: ChaosOptions,
    infra: Infrastructure,
    work: Path,
    load: Load,
    injector: Injector,
    supervisor: Supervisor,
    evidence: Evidence,
    *,
    settle_seconds: float | None,
    since_last_fault_seconds: float | None,
    wall_seconds: float,
) -> ChaosReport:
    violations = check(evidence)
    if supervisor.unexpected_exits.get("sandbox"):
        violations[3].append("the sandbox restarted: its books are incomplete")
    return ChaosReport(
        seed=options.seed,
        duration_seconds=options.duration,
        plant=options.plant,
        infrastructure={
            "database": "embedded PostgreSQL" if infra.owns_database else "configured server",
            "broker": "embedded Tansu" if infra.owns_broker else "configured broker",
        },
        submissions=load.stats.summary(),
        calls_by_status=dict(
            sorted(Counter(c.status.value for c in evidence.calls.values()).items())
        ),
        faults=dict(sorted(injector.injected.items())),
        fault_log=injector.log,
        unexpected_exits=dict(sorted(supervisor.unexpected_exits.items())),
        violations=violations,
        settled=settle_seconds is not None,
        settle_seconds=settle_seconds,
        since_last_fault_seconds=since_last_fault_seconds,
        wall_seconds=wall_seconds,
        effects_applied=sum(evidence.effects.values()),
        commands_reemitted=evidence.commands_reemitted,
        taken_over=evidence.taken_over,
        escalation_reasons=dict(evidence.escalation_reasons),
        fenced=_count_in_logs(work / "logs", "worker-", "not recorded: lease lost"),
    )


def _supervisor(
    logs: Path, env: dict[str, str], sandbox_port: int, plant: str | None
) -> Supervisor:
    """The run's processes: the sandbox, the API, workers, relays and the reconciler."""
    supervisor = Supervisor(logs, env)
    cli = ["-m", "dispatcher"]
    supervisor.add("sandbox", "sandbox", [*cli, "sandbox", "--port", str(sandbox_port)])
    supervisor.add("api", "api", [*cli, "serve"])
    worker = ["-m", PLANTS[plant][0]] if plant else [*cli, "worker"]
    for i in range(WORKERS):
        supervisor.add(f"worker-{i}", "worker", worker)
    for i in range(RELAYS):
        supervisor.add(f"relay-{i}", "relay", [*cli, "relay"])
    supervisor.add("reconciler", "reconciler", [*cli, "reconcile"])
    return supervisor


async def _inject(injector: Injector, faults: list[PlannedFault], duration: float) -> None:
    """The fault phase: each fault at its planned time, then wait out the duration."""
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    for fault in faults:
        await asyncio.sleep(max(0.0, t0 + fault.at - loop.time()))
        await injector.inject(fault, loop.time() - t0)
    await asyncio.sleep(max(0.0, t0 + duration - loop.time()))


def _count_in_logs(logs: Path, prefix: str, needle: str) -> int:
    return sum(
        path.read_text(errors="replace").count(needle) for path in logs.glob(f"{prefix}*.log")
    )


async def _ready(*urls: str, within: float = 60.0) -> None:
    deadline = time.monotonic() + within
    async with httpx.AsyncClient(timeout=2.0) as client:
        for url in urls:
            while True:
                try:
                    if (await client.get(url)).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{url} did not come up")
                await asyncio.sleep(0.2)


async def _settle(engine: AsyncEngine, within: float) -> bool:
    """Wait until every call is settled and the outbox is drained, or ``within`` s."""
    deadline = time.monotonic() + within
    while True:
        try:
            calls, rows = await unsettled_count(engine)
            if calls == 0 and rows == 0:
                return True
        except Exception:  # the database just came back; ask again
            log.exception("settle check failed")
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.5)


__all__ = ["INVARIANTS", "PLANTS", "ChaosOptions", "run_chaos"]
