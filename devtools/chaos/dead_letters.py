"""The dead letters of a chaos run, handled as each tenant's operator would: found,
looked for through each tenant's API key, and discarded by their own tenant when the
run caused them on purpose, which lets the rows of their key flow again.

What each one was when found (its tenant, size, error, and the rows waiting behind
it) is kept for the checker: a discarded dead letter is gone from the database.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Collection
from dataclasses import replace

from sqlalchemy import Text, cast, func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from devtools.chaos.checker import CallId, DeadLetterSeen, Waiting, explained
from devtools.chaos.load import TENANTS, Load
from dispatcher.db.tables import outbox

log = logging.getLogger(__name__)

_DEAD = outbox.c.dead_lettered_at.is_not(None)
_TENANT = outbox.c.payload["tenant"].astext


class DeadLetterDesk:
    """Sweeps the outbox's dead letters (:meth:`sweep`), remembering every one seen."""

    def __init__(
        self, engine: AsyncEngine, load: Load, *, oversized: Collection[CallId], limit: int
    ) -> None:
        self._engine = engine
        self._load = load
        self._oversized = oversized
        self._limit = limit
        self.seen: dict[int, DeadLetterSeen] = {}
        self.listed: defaultdict[str, set[int]] = defaultdict(set)
        """The dead letters each tenant's API key was shown."""
        self.discarded: dict[int, str] = {}
        """The answer to the latest discard of each dead letter, by its tenant."""

    async def sweep(self) -> None:
        """Find the dead letters, list each tenant's through its API key, and discard
        the run's own (each by its tenant) that are not discarded yet."""
        found = await self._find()
        for dead in found:
            before = self.seen.get(dead.id)
            waited = {*dead.waiting, *(before.waiting if before else ())}
            self.seen[dead.id] = replace(dead, waiting=tuple(sorted(waited, key=lambda w: w.id)))
        for tenant in TENANTS:
            shown = await self._load.dead_letters(tenant)
            if shown is not None:
                self.listed[tenant].update(shown)
        for dead in found:
            if self.discarded.get(dead.id) == "200" or dead.tenant is None:
                continue
            if explained(dead, self._oversized, self._limit):
                self.discarded[dead.id] = answer = await self._load.discard(dead.tenant, dead.id)
                log.info("dead letter %d of %s discarded by it: %s", dead.id, dead.tenant, answer)

    async def _find(self) -> list[DeadLetterSeen]:
        size = (
            func.octet_length(outbox.c.key)
            + func.octet_length(cast(outbox.c.payload, Text))
            + func.octet_length(cast(outbox.c.headers, Text))
        )
        async with self._engine.connect() as conn:
            dead = (
                await conn.execute(
                    select(
                        outbox.c.id,
                        outbox.c.topic,
                        outbox.c.key,
                        _TENANT,
                        outbox.c.payload["toolCallId"].astext,
                        size,
                        outbox.c.last_error,
                    )
                    .where(_DEAD)
                    .order_by(outbox.c.id)
                )
            ).all()
            waiting = (
                await conn.execute(
                    select(outbox.c.id, outbox.c.key, _TENANT).where(
                        outbox.c.published_at.is_(None),
                        outbox.c.dead_lettered_at.is_(None),
                        outbox.c.key.in_(select(outbox.c.key).where(_DEAD)),
                    )
                )
            ).all()
        behind: defaultdict[str, list[Waiting]] = defaultdict(list)
        for row_id, key, tenant in waiting:
            behind[key].append(Waiting(row_id, tenant))
        return [
            DeadLetterSeen(
                id=row_id,
                topic=topic,
                key=key,
                tenant=tenant,
                tool_call_id=call,
                size=int(nbytes),
                error=error,
                waiting=tuple(behind[key]),
            )
            for row_id, topic, key, tenant, call, nbytes, error in dead
        ]
