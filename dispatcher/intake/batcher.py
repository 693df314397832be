"""Group commit for HTTP intake: concurrent submissions share one transaction.

Each caller's future resolves only after the transaction holding its rows has
committed, so an answer never announces a call that could still be rolled back.
A submission is prepared before it is queued: what the request and the registry
alone refuse (an unknown or disabled capability, a derived key outside the contract)
is answered at once with its 4xx, also while the database is down, and never joins
a batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

import psycopg
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from dispatcher.capabilities import CapabilityRegistry
from dispatcher.db.engine import driver_transaction
from dispatcher.db.errors import REFUSED_INPUT, DbErrorClass, classify, refusal, sqlstate
from dispatcher.errors import (
    DispatcherError,
    InternalError,
    ServiceUnavailable,
    ValidationFailed,
)
from dispatcher.intake.plan import VIA_HTTP, Prepared
from dispatcher.intake.service import prepare, record_prepared
from dispatcher.schemas import Submission, SubmitRequest
from dispatcher.settings import Topics
from dispatcher.tracing import Trace

log = logging.getLogger(__name__)

_ATTEMPTS = 3
# Refusals caused by one row's data: the rest of the batch is fine without it.
_ONE_ROW = REFUSED_INPUT | {DbErrorClass.CONSTRAINT}


@dataclass(slots=True)
class _Pending:
    prepared: Prepared
    future: asyncio.Future[Submission]


class IntakeBatcher:
    """Records whatever prepared submissions are waiting (:func:`record_prepared`),
    ``flushers`` transactions at a time."""

    def __init__(
        self,
        engine: AsyncEngine,
        registry: CapabilityRegistry,
        *,
        topics: Topics,
        max_batch: int = 128,
        flushers: int = 2,
    ) -> None:
        self._engine = engine
        self._registry = registry
        self._topics = topics
        self._max_batch = max_batch
        self._flushers = flushers
        self._queue: asyncio.Queue[_Pending] = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._run()) for _ in range(self._flushers)]

    async def stop(self) -> None:
        """Finish every queued submission, then stop."""
        await self._queue.join()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def submit(
        self,
        request: SubmitRequest,
        tenant: str,
        submitted_by: str | None = None,
        trace: Trace = None,
    ) -> Submission:
        """Queue one submission (``trace``: the context it is stored with); answers
        once the batch holding it committed. Raises at once what needs no database."""
        prepared = prepare(request, tenant, self._registry, submitted_by, trace, VIA_HTTP)
        future: asyncio.Future[Submission] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(_Pending(prepared, future))
        # Shielded: a client that hangs up must not cancel a commit in progress; its
        # call is recorded all the same and a replay with its key finds it.
        return await asyncio.shield(future)

    async def _run(self) -> None:
        while True:
            batch = [await self._queue.get()]
            while len(batch) < self._max_batch and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            try:
                await self._flush(batch)
            except Exception:  # every waiting caller must get an answer
                log.exception("intake batch of %d failed", len(batch))
                for pending in batch:
                    if not pending.future.done():
                        pending.future.set_exception(
                            ServiceUnavailable("the submission could not be recorded")
                        )
            finally:
                for _ in batch:
                    self._queue.task_done()

    async def _flush(self, batch: list[_Pending]) -> None:
        outcomes = await self._commit(batch)
        for pending, outcome in zip(batch, outcomes, strict=True):
            if pending.future.done():
                continue
            if isinstance(outcome, DispatcherError):
                pending.future.set_exception(outcome)
            else:
                pending.future.set_result(outcome)

    async def _commit(self, batch: list[_Pending]) -> list[Submission | DispatcherError]:
        """Commit ``batch`` in one transaction; when the database refuses a row of it,
        find the offender by halving, so only its own submission fails.

        Halving rather than a savepoint per submission: the common batch commits in its
        one statement and pays nothing; only a refused batch costs more, about
        ``2 log2(n)`` further transactions per offending row, and every transaction
        holds only rows the database has not yet refused."""
        for attempt in range(1, _ATTEMPTS + 1):
            try:
                return await self._once(batch)
            except (DBAPIError, psycopg.Error) as exc:
                kind = classify(exc)
                # A lost race (deadlock, serialization failure): the batch is safe to
                # run again as a whole.
                if kind is DbErrorClass.CONTENTION and attempt < _ATTEMPTS:
                    continue
                if kind in _ONE_ROW:
                    if len(batch) == 1:
                        return [_refused(exc, kind)]
                    half = len(batch) // 2
                    return await self._commit(batch[:half]) + await self._commit(batch[half:])
                log.warning(
                    "intake batch of %d failed: %s (%s)", len(batch), exc.__class__.__name__, kind
                )
                break
        return [ServiceUnavailable("the database did not accept the batch")] * len(batch)

    async def _once(self, batch: list[_Pending]) -> list[Submission | DispatcherError]:
        # Straight on the pooled psycopg connection: intake's statements go there anyway.
        async with driver_transaction(self._engine) as connection:
            return await record_prepared(
                connection, [p.prepared for p in batch], topics=self._topics
            )


def _refused(exc: DBAPIError | psycopg.Error, kind: DbErrorClass) -> DispatcherError:
    """The answer to the one submission whose row the database refused."""
    if kind in REFUSED_INPUT:
        log.info("intake: the database refused a submission: %s", refusal(exc))
        return ValidationFailed(
            f"the database refused the submission: {refusal(exc)}", sqlstate=sqlstate(exc)
        )
    # A constraint intake does not handle itself: a bug, not the caller's input.
    log.error("intake: a submission violates a constraint", exc_info=exc)
    return InternalError("a submission violates a database constraint")
