"""The service's repeated operations, as ``bench.growth`` times and explains them: each
calls the function the service calls (the gauge refresh, the console's overview, the
API's lists and reads, the sweeps, a worker batch, a reconcile pass, intake), against
one database (:class:`Target`), after an untimed ``prepare`` when it needs fresh work.

Every target holds the same live set (``bench.growth_paths.LIVE``), so an operation
returns the same rows from the empty database and the full one: what differs is only
the history behind them.
"""

from __future__ import annotations

import asyncio
import importlib
import itertools
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import psycopg
from sqlalchemy import func, insert, select, text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from bench.plans import Explained, explaining
from devtools.registries import capability, registry_of
from devtools.sandbox import SandboxServer
from dispatcher.capabilities import CapabilityRegistry
from dispatcher.db.engine import engine_for, session_factory
from dispatcher.db.tables import tool_calls
from dispatcher.intake.approvals import approval_ref
from dispatcher.intake.service import submit, submit_many
from dispatcher.provider.client import ProviderClient
from dispatcher.provider.transport import Transport
from dispatcher.schemas import SubmitRequest
from dispatcher.settings import DEFAULT_TOPICS
from dispatcher.states import ApprovalStatus, EscalationStatus
from dispatcher.views import overview, queries, run_view
from dispatcher.worker.executor import Executor
from dispatcher.worker.redrive import redrive_stale
from outbox_relay.queries import Queries, relay_session
from reconciler import Reconciler, metrics

BATCH = 20
"""Calls in a worker batch, a reconcile pass, an expiry sweep."""
RELAY = "bench-relay"


def registry(sandbox_url: str) -> CapabilityRegistry:
    """The history's capabilities on the sandbox, and one whose approvals lapse at once
    (the expiry sweep's work)."""
    return registry_of(
        capability("refund-order-v2", sandbox_url, by_key=True, risk="high"),
        capability("send-email", sandbox_url, by_key=True, reconcile={}),
        capability("lookup-order", sandbox_url, side_effects=False),
        capability("refund-order-approved", sandbox_url, requiresApproval=True, risk="high"),
        capability("approve-fast", sandbox_url, requiresApproval=True, approvalTtlSeconds=0.01),
    )


@dataclass
class Target:
    """One database under measurement, and what its operations share."""

    name: str
    url: str
    engine: AsyncEngine
    sessions: async_sessionmaker[AsyncSession]
    registry: CapabilityRegistry
    transport: Transport
    sandbox_url: str
    tenant: str = "tenant-00"
    call: str = ""
    run: str = ""
    relay: psycopg.AsyncConnection[Any] | None = None
    """The relay's own connection, set up as the relay sets up its connections."""
    serial: itertools.count[int] = field(default_factory=itertools.count)

    @classmethod
    async def open(
        cls, name: str, url: str, sandbox: SandboxServer, transport: Transport
    ) -> Target:
        engine = engine_for(url, pool_size=4)
        target = cls(name, url, engine, session_factory(engine), registry(sandbox.url),
                     transport, sandbox.url)  # fmt: skip
        async with target.sessions() as session:
            # A live call of the tenant (an open escalation's) and its run: the reads'.
            row = (
                await session.execute(
                    select(tool_calls.c.tool_call_id, tool_calls.c.run_id)
                    .where(tool_calls.c.tenant == target.tenant, tool_calls.c.status == "escalated")
                    .order_by(tool_calls.c.tool_call_id)
                    .limit(1)
                )
            ).one()
        target.call, target.run = row
        # Every lane is this relay's, as for a relay running alone.
        target.relay = await psycopg.AsyncConnection.connect(url, autocommit=True)
        await target.relay.execute(
            "UPDATE outbox_lanes SET owner = %s, expires_at = now() + interval '1 day'", (RELAY,)
        )
        await relay_session(target.relay)
        return target

    async def close(self) -> None:
        if self.relay is not None:
            await self.relay.close()
        await self.engine.dispose()

    def fresh(self, prefix: str) -> str:
        return f"{prefix}-{self.name}-{next(self.serial)}"


@dataclass(frozen=True, slots=True)
class Operation:
    name: str
    run: Callable[[Target, Any], Awaitable[object]]
    prepare: Callable[[Target], Awaitable[Any]] | None = None


@dataclass(frozen=True, slots=True)
class Measured:
    operation: str
    target: str
    seconds: float
    """Median wall time of one run."""
    rows: int
    buffers: int
    returned: int
    statements: list[Explained]


async def vacuum(target: Target) -> None:
    """What autovacuum would have done by now (the test server runs without it): the
    dead rows earlier operations left (and their explained, rolled-back writes) are
    cleared and the statistics fresh, in both databases alike."""
    async with await psycopg.AsyncConnection.connect(target.url, autocommit=True) as conn:
        await conn.execute("VACUUM (ANALYZE)")


async def measure(op: Operation, targets: Sequence[Target], repeat: int) -> list[Measured]:
    """``op`` on each target: one explained run (it also warms the caches), then
    ``repeat`` timed ones, the targets taking turns run by run so that each sees the
    machine as the others do (it is shared, and its speed drifts within minutes)."""
    found: list[list[Explained]] = []
    for target in targets:
        await vacuum(target)
        state = await op.prepare(target) if op.prepare else None
        async with explaining() as explained:
            await op.run(target, state)
        found.append(explained)
    times: list[list[float]] = [[] for _ in targets]
    for _ in range(repeat):
        for target, taken in zip(targets, times, strict=True):
            state = await op.prepare(target) if op.prepare else None
            started = time.perf_counter()
            await op.run(target, state)
            taken.append(time.perf_counter() - started)
    return [
        Measured(op.name, t.name, statistics.median(taken), sum(e.rows for e in plans),
                 sum(e.buffers for e in plans), sum(e.returned for e in plans), plans)
        for t, taken, plans in zip(targets, times, found, strict=True)
    ]  # fmt: skip


def _listing(name: str, modules: tuple[str, ...]) -> Callable[..., Awaitable[Any]]:
    """The service's list function ``name``, wherever it lives now (the lists moved to
    keyset pages in ``dispatcher.views.queues``; before, ``dispatcher.control``)."""
    for module in modules:
        found = getattr(importlib.import_module(module), name, None)
        if found is not None:
            return found  # type: ignore[no-any-return]
    raise LookupError(name)


def _read(
    query: Callable[[AsyncSession, Target], Awaitable[object]],
) -> Callable[[Target, Any], Awaitable[object]]:
    async def run(t: Target, _: Any) -> object:
        async with t.sessions() as session:
            return await query(session, t)

    return run


async def _overview(session: AsyncSession, t: Target) -> object:
    await overview.nav_counts(session, t.tenant)
    return await overview.load_overview(session, t.tenant)


# A list's page as both databases fill it: the live set holds 20 approvals, so the
# API's default page (100) would be full only on the full database, five times the rows
# of the empty one's, and the ratio would be the page's, not the history's.
PAGE = 20


def _lists(kind: str, status: object) -> Callable[[AsyncSession, Target], Awaitable[object]]:
    found = _listing(f"list_{kind}", ("dispatcher.views.queues", f"dispatcher.control.{kind}"))
    return lambda s, t: found(s, tenant=t.tenant, status=status, limit=PAGE)


async def _runs(session: AsyncSession, t: Target) -> object:
    # The API's list: run_summaries' keyset pages (migration 0013), else grouped calls.
    try:
        run_list = importlib.import_module("dispatcher.views.run_list")
    except ImportError:
        return await queries.recent_runs(session, t.tenant)  # type: ignore[attr-defined]
    return await run_list.list_runs(session, t.tenant, limit=51)


async def _get_call(session: AsyncSession, t: Target) -> object:
    # What GET /v1/tool-calls/{id} reads (dispatcher.api.tool_calls._view).
    await queries.tool_call_row(session, t.tenant, t.call)
    return await approval_ref(session, t.tenant, t.call)


async def _relay_claim(t: Target, _: Any) -> object:
    assert t.relay is not None
    claim = Queries.for_table("outbox").claim
    cursor = await t.relay.execute(claim, {"owner": RELAY, "limit": 500})
    return await cursor.fetchall()


async def _submitted(t: Target, capability_id: str, n: int) -> list[tuple[str, str]]:
    """``n`` fresh calls of ``capability_id`` through intake, in one transaction."""
    run = t.fresh("bench-run")
    items = [
        (
            SubmitRequest(run_id=run, capability_id=capability_id, input={"n": t.fresh("i")}),
            t.tenant,
        )
        for _ in range(n)
    ]
    async with t.sessions() as session, session.begin():
        done = await submit_many(session, items, registry=t.registry)
    return [(t.tenant, s.view.tool_call_id) for s in done]  # type: ignore[union-attr]


async def _lapsed_approvals(t: Target) -> None:
    await _submitted(t, "approve-fast", BATCH)
    await asyncio.sleep(0.05)


async def _expire(t: Target, _: Any) -> object:
    expire_due = _listing("expire_due", ("dispatcher.control.approvals",))
    async with t.sessions() as session, session.begin():
        return await expire_due(session)


async def _worker_batch(t: Target, calls: list[tuple[str, str]]) -> object:
    executor = Executor(t.sessions, t.registry, ProviderClient(t.transport),
                        worker_id=f"worker:bench:{t.name}", topics=DEFAULT_TOPICS)  # fmt: skip
    return await executor.execute_many(calls)


async def _due_unknowns(t: Target) -> None:
    """``BATCH`` calls in doubt and due, each applied at the sandbox first (found by its
    key, as after a lost answer): what bench.reconcile prepares."""
    keys = [t.fresh("rk") for _ in range(BATCH)]
    async with httpx.AsyncClient(base_url=t.sandbox_url) as client:
        for key in keys:
            await client.post("/v1/requests", json={"n": key}, headers={"Idempotency-Key": key})
    rows = [
        {"tool_call_id": key, "tenant": t.tenant, "run_id": t.run, "capability_id": "send-email",
         "input": {"n": key}, "idempotency_key": key, "provider_key": key,
         "request_fingerprint": b"bench", "status": "result_unknown",
         "verification_status": "pending", "reconciliation_status": "pending",
         "dispatch_attempts": 1, "dispatched_at": func.now(),
         "next_reconcile_at": text("now() - interval '1 second'")}
        for key in keys
    ]  # fmt: skip
    async with t.sessions() as session, session.begin():
        await session.execute(insert(tool_calls).values(rows))


async def _reconcile(t: Target, _: Any) -> object:
    reconciler = Reconciler(t.sessions, t.registry, t.transport, topics=DEFAULT_TOPICS,
                            owner=f"reconciler:bench:{t.name}", batch_size=BATCH)  # fmt: skip
    return await reconciler.run_pass()


async def _intake(t: Target, _: Any) -> object:
    request = SubmitRequest(run_id=t.run, capability_id="send-email", input={"n": t.fresh("in")})
    async with t.sessions() as session, session.begin():
        return await submit(session, request, tenant=t.tenant, registry=t.registry)


OPERATIONS = (
    Operation("gauge refresh (reconciler.metrics.refresh)",
              lambda t, _: metrics.refresh(t.sessions)),
    Operation("console overview + nav counts", _read(_overview)),
    Operation("runs list (GET /v1/runs)", _read(_runs)),
    Operation("approvals list, pending", _read(_lists("approvals", ApprovalStatus.PENDING))),
    Operation(f"approvals list, any status (a page of {PAGE})", _read(_lists("approvals", None))),
    Operation("escalations list, open", _read(_lists("escalations", EscalationStatus.OPEN))),
    Operation(f"escalations list, any status (a page of {PAGE})",
              _read(_lists("escalations", None))),
    Operation("GET a call (row + approval)", _read(_get_call)),
    Operation("a call's events (views.queries.call_events)",
              _read(lambda s, t: queries.call_events(s, t.tenant, t.call))),
    Operation("a run's events (GET /v1/runs/{id}/events)",
              _read(lambda s, t: run_view.run_events(s, t.tenant, t.run))),
    Operation("run view (GET /v1/runs/{id})",
              _read(lambda s, t: run_view.load_run_view(s, t.tenant, t.run))),
    Operation("relay claim read", _relay_claim),
    Operation("redrive sweep (outbox check)",
              lambda t, _: redrive_stale(t.sessions, topics=DEFAULT_TOPICS, older_than_seconds=60)),
    Operation(f"approval expiry sweep ({BATCH} due)", _expire, _lapsed_approvals),
    Operation(f"worker claim+send+record ({BATCH} calls)", _worker_batch,
              lambda t: _submitted(t, "send-email", BATCH)),
    Operation(f"reconcile pass ({BATCH} due calls)", _reconcile, _due_unknowns),
    Operation("intake, library submit()", _intake),
)  # fmt: skip
