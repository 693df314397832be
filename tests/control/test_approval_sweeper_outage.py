"""The approvals sweeper as a service outlives its database going away: its connections
killed while it loops and no new one admitted, a sweep fails (logged, counted), and
once the database takes connections again the sweeper still closes what comes due.
Real PostgreSQL; the sweeper runs in this process (``run_service``, as `up` runs it)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import psycopg
import pytest
from psycopg import sql
from sqlalchemy import func, update
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.capabilities import CapabilityRegistry
from dispatcher.db.tables import approvals
from dispatcher.intake.service import submit
from dispatcher.schemas import SubmitRequest
from dispatcher.settings import Settings
from tests.fixtures.capabilities import approval_capability
from tests.fixtures.metrics import sample
from tests.fixtures.rows import approval_of, event_types
from tests.fixtures.waiting import eventually
from tool_dispatcher.approvals import LOOP, run_service

pytestmark = pytest.mark.postgres

Sessions = async_sessionmaker[AsyncSession]
CAP = "refund-approved"
REGISTRY = CapabilityRegistry({CAP: approval_capability(CAP)})


async def admit_connections(server_url: str, database: str, *, allowed: bool) -> None:
    """Let clients connect to ``database`` or not; when not, end the sessions it has
    (the sweeper's pooled connections), as a server restart would."""
    async with await psycopg.AsyncConnection.connect(server_url, autocommit=True) as admin:
        await admin.execute(
            sql.SQL("ALTER DATABASE {} WITH ALLOW_CONNECTIONS {}").format(
                sql.Identifier(database), sql.Literal(allowed)
            )
        )
        if not allowed:
            await admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = %s AND pid <> pg_backend_pid()",
                [database],
            )


async def backends(server_url: str, database: str) -> int:
    async with await psycopg.AsyncConnection.connect(server_url, autocommit=True) as admin:
        cur = await admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s", [database]
        )
        row = await cur.fetchone()
    return int(row[0]) if row else 0


@asynccontextmanager
async def sweeper(settings: Settings) -> AsyncIterator[asyncio.Task[None]]:
    """The sweeper service, a sweep every 0.1 s, stopped (not cancelled) after the block."""
    stop = asyncio.Event()
    every = settings.model_copy(update={"approval_sweep_interval_seconds": 0.1})
    task = asyncio.create_task(run_service(every, REGISTRY, stop))
    try:
        yield task
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), 30)


async def propose_due(sessions: Sessions, tool_call_id: str) -> None:
    """A call waiting for an approval that is already past its expiry."""
    async with sessions() as session, session.begin():
        await submit(
            session,
            SubmitRequest(
                run_id="run-1", capability_id=CAP, tool_call_id=tool_call_id, input={"n": 1}
            ),
            tenant="acme",
            registry=REGISTRY,
            submitted_by="alice",
        )
        await session.execute(
            update(approvals)
            .where(approvals.c.tool_call_id == tool_call_id)
            .values(expires_at=func.now() - func.make_interval(0, 0, 0, 0, 0, 0, 1))
        )


def outcome(task: asyncio.Task[None]) -> str:
    """Why the sweeper is not running any more, for an assertion's message."""
    if not task.done():
        return "running"
    return repr(task.exception()) if not task.cancelled() else "cancelled"


async def test_the_sweeper_carries_on_after_its_connections_are_killed(
    settings: Settings, sessions: Sessions, pg_server_url: str, database_url: str
) -> None:
    database = make_url(database_url).database
    assert database is not None
    failures = sample("loop_step_errors_total", loop=LOOP)
    try:
        async with sweeper(settings) as task:

            async def connected() -> bool:
                return task.done() or await backends(pg_server_url, database) > 0

            await eventually(connected, what="the sweeper to connect")
            # No new connection admitted: the pool's pre-ping cannot quietly replace the
            # killed ones, so the next sweep fails for real.
            await admit_connections(pg_server_url, database, allowed=False)

            async def failed() -> bool:
                return task.done() or sample("loop_step_errors_total", loop=LOOP) > failures

            await eventually(failed, what="a sweep to fail on the killed connections")
            assert not task.done(), outcome(task)

            await admit_connections(pg_server_url, database, allowed=True)
            await propose_due(sessions, "tc-due")

            async def expired() -> bool:
                status = (await approval_of(sessions, "tc-due"))["status"]
                return task.done() or status == "expired"

            await eventually(expired, what="the sweeper to expire the approval")
            assert not task.done(), outcome(task)
        assert (await event_types(sessions, "tc-due"))[-1] == "approval.expired"
    finally:
        await admit_connections(pg_server_url, database, allowed=True)
