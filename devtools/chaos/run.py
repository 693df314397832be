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
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine

from devtools.chaos import bus_evidence, retention
from devtools.chaos.checker import INVARIANTS, Evidence, check
from devtools.chaos.dead_letters import DeadLetterDesk
from devtools.chaos.diagnose import diagnose
from devtools.chaos.evidence import gather, unsettled_count
from devtools.chaos.faults import Injector
from devtools.chaos.infra import Infrastructure, infrastructure
from devtools.chaos.load import MAX_MESSAGE_BYTES, READ_ONLY, TENANTS, Load
from devtools.chaos.proxy import TcpProxy
from devtools.chaos.report import ChaosReport, bus_figures, tenancy
from devtools.chaos.schedule import FaultKind, PlannedFault, plan
from devtools.chaos.stack import capabilities_toml, chaos_env
from devtools.chaos.supervisor import Supervisor
from devtools.embedded import free_port
from dispatcher.db.engine import engine_for
from dispatcher.settings import BusSettings, Settings, environment_without_settings
from dispatcher.topics import ensure_topics

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Plant:
    """A defect planted on purpose: what runs instead of the real code, and the fault a
    planted run (a short one) leads with so that the defect has work to do early."""

    lead: FaultKind | None
    worker: str | None = None
    """The module the workers run instead of the real worker."""
    cli: str | None = None
    """The module every process of the service (API, workers, relays, reconciler)
    runs instead of the CLI, ``python -m tool_dispatcher``."""
    retention: str | None = None
    """The module the retention passes run instead of the CLI."""
    bus: str | None = None
    """The module the bus intake processes run instead of the CLI."""


PLANTS = {
    "blind-retry": Plant(FaultKind.PROVIDER_DROP_AFTER_APPLY, worker="devtools.chaos.blind_worker"),
    "stale-fence": Plant(FaultKind.ZOMBIE_READ_ONLY, worker="devtools.chaos.stale_fence_worker"),
    # Tenants meet from the first submission: no fault is needed to provoke it.
    "shared-keys": Plant(None, cli="devtools.chaos.shared_keys"),
    # Calls wait on approvals and escalations from the first seconds: no fault needed.
    "eager-retention": Plant(None, retention="devtools.chaos.eager_retention"),
    # Killed with a batch in hand, it has committed what it never recorded.
    "early-commit": Plant(FaultKind.KILL_BUS_INTAKE, bus="devtools.chaos.early_commit"),
}
WORKERS = 2
RELAYS = 2
BUS_INTAKES = 2


@dataclass(frozen=True)
class ChaosOptions:
    duration: float
    seed: int
    rate: float = 8.0
    plant: str | None = None
    settle_timeout: float = 90.0
    keep: bool = False
    """Keep the run's directory (process logs) even when it passed."""


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
    # One API key a tenant: each tenant submits, approves and handles its dead letters
    # through its own.
    api_keys = {tenant: "tdk_chaos_" + secrets.token_urlsafe(16) for tenant in TENANTS}
    env = _environment(work, infra, api_port, api_keys, options.seed)
    bus = (await _make_topics(infra, env)).bus
    routes = bus.routes()
    plant = PLANTS[options.plant] if options.plant else None
    supervisor = _supervisor(work / "logs", env, sandbox_port, plant)
    engine = engine_for(infra.database_url, pool_size=2)
    load = Load(
        f"http://127.0.0.1:{api_port}",
        api_keys,
        seed=options.seed,
        rate=options.rate,
        kafka_bootstrap=infra.kafka_bootstrap,
        request_topics={route.tenant: topic for topic, route in routes.items()},
    )
    infra.on_broker_restart.append(load.broker_restarted)
    caught_up = partial(bus_evidence.caught_up, engine, infra.kafka_bootstrap, routes, bus.group_id)
    desk = DeadLetterDesk(engine, load, oversized=load.stats.oversized, limit=MAX_MESSAGE_BYTES)
    cli = (plant and (plant.retention or plant.cli)) or "tool_dispatcher"
    job = retention.RetentionJob(env, work / "logs", seed=options.seed, cli=cli)
    injector = Injector(supervisor, infra, proxy, sandbox_url)
    faults = plan(
        options.seed,
        options.duration,
        owns_database=infra.owns_database,
        owns_broker=infra.owns_broker,
        lead=plant.lead if plant else None,
    )
    watcher: asyncio.Task[None] | None = None
    retaining: asyncio.Task[None] | None = None
    try:
        supervisor.start_all()
        await _ready(f"{sandbox_url}/v1/health", f"http://127.0.0.1:{api_port}/readyz")
        watcher = asyncio.create_task(supervisor.watch())
        stop_load, stop_approver, stop_retention = asyncio.Event(), asyncio.Event(), asyncio.Event()
        submitting = asyncio.create_task(load.submit_until(stop_load))
        approving = asyncio.create_task(load.approve_until(stop_approver))
        retaining = asyncio.create_task(job.run_until(stop_retention))
        await _inject(injector, faults, options.duration)
        stop_load.set()
        await submitting
        await injector.lift_all()
        lifted = time.monotonic()
        settled = await _settle(engine, options.settle_timeout, desk, caught_up)
        done = time.monotonic()
        # Taken at once, while whatever kept the run from settling still holds.
        notes = (
            []
            if settled
            else await diagnose(engine, work / "logs", env["TOOL_DISPATCHER_DISPATCH_TOPIC"])
        )
        stop_approver.set()
        await approving
        notes += await _last_sweep(desk)
        await load.close()
        notes += await _last_retention(job, stop_retention, retaining)
        archived = await asyncio.to_thread(
            retention.archived, env["TOOL_DISPATCHER_ARCHIVE_URL"], TENANTS
        )
        evidence = await _evidence(engine, sandbox_url, load, desk, env, archived)
        await bus_evidence.join(evidence, engine, infra.kafka_bootstrap, routes, load.stats.bus)
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
        report.notes += notes
        report.retention = {**job.summary(), "archivedCalls": evidence.archived_calls}
        return report
    finally:
        for task in (watcher, retaining):
            if task is not None:
                task.cancel()
        await asyncio.to_thread(supervisor.stop_all)
        await proxy.stop()
        await engine.dispose()
        job.close()


def _environment(
    work: Path, infra: Infrastructure, api_port: int, api_keys: Mapping[str, str], seed: int
) -> dict[str, str]:
    """The run's settings only: nothing of the caller's TOOL_DISPATCHER_* leaks in."""
    tag = f"{seed}-{secrets.token_hex(3)}"
    return {
        **environment_without_settings(),
        **chaos_env(work, infra, api_port=api_port, api_keys=api_keys, tag=tag),
        **retention.environment(work),
    }


async def _evidence(
    engine: AsyncEngine,
    sandbox_url: str,
    load: Load,
    desk: DeadLetterDesk,
    env: Mapping[str, str],
    archived: retention.Archived,
) -> Evidence:
    """What the invariants are checked against: the database, the sandbox, the load's
    stats, the dead letters the tenants handled and what retention archived."""
    return await gather(
        engine,
        sandbox_url,
        load.stats,
        desk,
        read_only={READ_ONLY},
        dispatch_topic=env["TOOL_DISPATCHER_DISPATCH_TOPIC"],
        max_message_bytes=MAX_MESSAGE_BYTES,
        archive=archived,
    )


async def _last_retention(
    job: retention.RetentionJob, stop: asyncio.Event, passes: asyncio.Task[None]
) -> list[str]:
    """Stop the passes, then one more, unarmed: it resumes whatever a killed pass left,
    so that the archive and the database are checked as a finished job leaves them."""
    stop.set()
    await passes
    code = await job.one_pass()
    return [] if code == 0 else [f"the last retention pass exited {code} (logs/retention.log)"]


async def _last_sweep(desk: DeadLetterDesk) -> list[str]:
    """The dead letters made while the run settled (the last escalations): every row is
    published or dead by now. Notes on what kept them from being handled."""
    try:
        await desk.sweep()
    except Exception as exc:  # the checker then finds them unhandled: say why
        log.exception("the last dead-letter sweep failed")
        return [f"the last dead-letter sweep failed: {type(exc).__name__}: {exc}"]
    return []


async def _make_topics(infra: Infrastructure, env: Mapping[str, str]) -> Settings:
    """The run's own topics, named in its environment (bus intake's included)."""
    infra.topics = Settings(
        kafka_bootstrap=infra.kafka_bootstrap,
        dispatch_topic=env["TOOL_DISPATCHER_DISPATCH_TOPIC"],
        events_topic=env["TOOL_DISPATCHER_EVENTS_TOPIC"],
        escalations_topic=env["TOOL_DISPATCHER_ESCALATIONS_TOPIC"],
        topic_partitions=int(env["TOOL_DISPATCHER_TOPIC_PARTITIONS"]),
        bus=BusSettings(
            topics=json.loads(env["TOOL_DISPATCHER_BUS__TOPICS"]),
            group_id=env["TOOL_DISPATCHER_BUS__GROUP_ID"],
        ),
    )
    await ensure_topics(infra.topics)
    return infra.topics


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
        tenancy=tenancy(evidence),
        bus=bus_figures(evidence),
    )


def _supervisor(
    logs: Path, env: dict[str, str], sandbox_port: int, plant: Plant | None
) -> Supervisor:
    """The run's processes: sandbox, API, workers, relays, reconciler and bus intake."""
    supervisor = Supervisor(logs, env)
    sandbox = ["-m", "devtools", "sandbox", "--port", str(sandbox_port)]
    supervisor.add("sandbox", "sandbox", sandbox)
    cli = ["-m", plant.cli if plant and plant.cli else "tool_dispatcher"]
    supervisor.add("api", "api", [*cli, "serve"])
    worker = ["-m", plant.worker] if plant and plant.worker else [*cli, "worker"]
    for i in range(WORKERS):
        supervisor.add(f"worker-{i}", "worker", worker)
    for i in range(RELAYS):
        supervisor.add(f"relay-{i}", "relay", [*cli, "relay"])
    supervisor.add("reconciler", "reconciler", [*cli, "reconcile"])
    bus = ["-m", plant.bus, "bus-intake"] if plant and plant.bus else [*cli, "bus-intake"]
    for i in range(BUS_INTAKES):
        # Both on bus intake's default ops port: the second finds it taken and runs
        # without ops endpoints (a default port is not required), as a second worker does.
        supervisor.add(f"bus-intake-{i}", "bus-intake", bus)
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


async def _settle(
    engine: AsyncEngine, within: float, desk: DeadLetterDesk, bus: Callable[[], Awaitable[bool]]
) -> bool:
    """Wait until bus intake has dealt with every request record, every call is settled
    and the outbox is drained, or ``within`` s. Meanwhile each tenant handles its dead
    letters (the desk's sweep), so that rows waiting behind one the run made on purpose
    flow again."""
    deadline, caught_up = time.monotonic() + within, False
    while True:
        try:
            # Bus intake first: what it records now is counted below.
            caught_up = await bus()
            calls, rows = await unsettled_count(engine)
            if caught_up and calls == 0 and rows == 0:
                return True
            await desk.sweep()
        except Exception:  # the database just came back; ask again
            log.exception("settle check failed")
        if time.monotonic() > deadline:
            if not caught_up:
                log.warning("not settled: bus intake had not dealt with every request record")
            return False
        await asyncio.sleep(0.5)


__all__ = ["INVARIANTS", "PLANTS", "ChaosOptions", "run_chaos"]
