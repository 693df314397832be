"""Working an operation through, a batch at a time, so that a crash loses nothing and
repeats nothing.

One batch is one transaction: the operation's row is locked (still running, still this
processor's), the next calls after its cursor are selected, each is touched by its
command, the calls are recorded as touched, and the cursor, counts and lease move on.
A processor killed mid-batch rolls all of it back; its lease lapses and another
processor (or the same one restarted) claims the operation and selects that batch
again. A committed batch's calls are recorded as touched and lie behind the cursor:
never selected again.

Every worker runs :func:`run_operations` beside its consumer; the CLI can work one
operation in the foreground (:func:`work_through`), under the same lease.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.capabilities import CapabilityRegistry
from dispatcher.control.actor import Actor
from dispatcher.db.engine import create_engine, session_factory
from dispatcher.ledger.operations import (
    advance,
    claim_operation,
    hold_operation,
    move_operation,
    record_touched,
    release_operation,
)
from dispatcher.operations.actions import Touch, touch_batch
from dispatcher.operations.models import OperationKind
from dispatcher.operations.sources import source_of
from dispatcher.settings import Settings, Topics
from dispatcher.states import OperationState
from dispatcher.webhooks import notify
from dispatcher.webhooks.events import OPERATION_FINISHED
from kit.owners import owner_id
from kit.periodic import periodic

log = logging.getLogger(__name__)

LOOP = "operations"
"""The ``loop`` label of the processors' step metrics, and the name in their logs."""


@dataclass(frozen=True, slots=True)
class Processor:
    """What working an operation needs; ``owner`` names this processor's leases."""

    sessions: async_sessionmaker[AsyncSession]
    registry: CapabilityRegistry
    topics: Topics
    owner: str
    batch_size: int
    lease_seconds: float


async def run_batch(p: Processor, operation_id: str) -> bool:
    """One batch of the operation, committed or not at all; False once there is no more
    to do here (finished by this batch, cancelled, or no longer this processor's)."""
    async with p.sessions() as session, session.begin():
        op = await hold_operation(session, operation_id, p.owner)
        if op is None:
            return False
        source = source_of(OperationKind(op.kind))
        rows = await source.next_batch(
            session, operation_id, op.filter, op.created_at, op.cursor, p.batch_size
        )
        if not rows:
            await _finish(session, dict(op._mapping), p.owner)
            return False
        touches = [_touch(p, op, r) for r in rows]
        touched = await touch_batch(session, OperationKind(op.kind), touches)
        await record_touched(session, touched)
        done = sum(1 for t in touched if t["outcome"] == "done")
        if not await advance(
            session,
            operation_id,
            owner=p.owner,
            cursor=source.cursor_of(rows[-1]),
            done=done,
            failed=len(touched) - done,
            lease_seconds=p.lease_seconds,
        ):
            # Held under the row's lock since the batch began: cannot happen. Should it,
            # nothing of the batch may stay.
            raise RuntimeError(f"operation {operation_id} slipped out of its lock")
    return True


def _touch(p: Processor, op: Any, row: Any) -> Touch:
    return Touch(
        tenant=row.tenant,
        tool_call_id=row.tool_call_id,
        operation_id=op.operation_id,
        params=dict(op.params),
        actor=Actor(**op.actor),
        registry=p.registry,
        topics=p.topics,
    )


async def _finish(session: AsyncSession, op: Mapping[str, Any], owner: str) -> None:
    finished = await move_operation(
        session, op["operation_id"], OperationState.COMPLETED, owner=owner
    )
    if finished is None:
        return
    await notify_finished(session, dict(finished._mapping))
    log.info(
        "operation %s (%s) completed: %d done, %d refused of %d",
        op["operation_id"], op["kind"], finished.done, finished.failed, finished.total,
    )  # fmt: skip


async def notify_finished(session: AsyncSession, op: Mapping[str, Any]) -> None:
    """The one place a finished operation is announced: the submitter's tenant's
    ``operation.finished`` webhook, written with the move that finished it."""
    await notify(
        session,
        event_type=OPERATION_FINISHED,
        tenant=op["tenant"],
        data={
            "operationId": op["operation_id"],
            "kind": op["kind"],
            "state": op["state"],
            "total": op["total"],
            "done": op["done"],
            "failed": op["failed"],
        },
    )


async def claim(p: Processor, operation_id: str | None = None) -> str | None:
    """Claim one running operation nobody holds (or that one); its id, or None."""
    async with p.sessions() as session, session.begin():
        row = await claim_operation(
            session, owner=p.owner, lease_seconds=p.lease_seconds, operation_id=operation_id
        )
    return None if row is None else str(row.operation_id)


async def work_through(p: Processor, operation_id: str, stop: asyncio.Event | None = None) -> None:
    """Run the claimed operation's batches until it is finished, cancelled or lost, or
    ``stop`` is set: then its lease is given up, so that another processor resumes it
    at once (a killed processor's lease lapses instead)."""
    while (stop is None or not stop.is_set()) and await run_batch(p, operation_id):
        pass
    if stop is not None and stop.is_set():
        async with p.sessions() as session, session.begin():
            await release_operation(session, operation_id, p.owner)


async def step(p: Processor, stop: asyncio.Event) -> None:
    """Claim and work through operations until none is free."""
    while not stop.is_set() and (operation_id := await claim(p)) is not None:
        log.info("operation %s claimed by %s", operation_id, p.owner)
        await work_through(p, operation_id, stop)


async def run_operations(p: Processor, stop: asyncio.Event, every: float) -> None:
    """The worker's operations loop: every ``every`` seconds, claim what is free."""

    async def once() -> None:
        await step(p, stop)

    await periodic(stop, every, once, name=LOOP)


def processor_of(
    settings: Settings, registry: CapabilityRegistry, sessions: async_sessionmaker[AsyncSession]
) -> Processor:
    """A processor as the settings shape it, under a lease name of this process."""
    return Processor(
        sessions=sessions,
        registry=registry,
        topics=settings.topics(),
        owner=owner_id("operations"),
        batch_size=settings.operation_batch_size,
        lease_seconds=settings.operation_lease_seconds,
    )


async def serve_operations(
    settings: Settings, registry: CapabilityRegistry, stop: asyncio.Event
) -> None:
    """What a worker process runs beside its consumer: the operations loop, on an engine
    of its own (a batch holds its connection for its whole transaction)."""
    engine = create_engine(settings)
    try:
        p = processor_of(settings, registry, session_factory(engine))
        await run_operations(p, stop, settings.operation_interval_seconds)
    finally:
        await engine.dispose()
