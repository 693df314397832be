"""What a finished batch writes back: its published rows marked, its dead letters and
its failed attempts counted (:func:`record`), once :mod:`outbox_relay.settle` has
decided which rows are which."""

from __future__ import annotations

import psycopg
from psycopg.rows import TupleRow

from outbox_relay.queries import Queries
from outbox_relay.settle import Settlement


async def record(
    conn: psycopg.AsyncConnection[TupleRow], queries: Queries, result: Settlement
) -> None:
    """Write ``result`` on ``conn`` (autocommit), in one transaction."""
    if not result.dead and not result.failed:
        # The usual batch: one statement, no BEGIN and COMMIT round trips around it.
        if result.published:
            await conn.execute(queries.mark_published, {"ids": [r.id for r in result.published]})
        return
    async with conn.transaction():
        if result.published:
            await conn.execute(queries.mark_published, {"ids": [r.id for r in result.published]})
        async with conn.cursor() as cur:
            if result.dead:
                await cur.executemany(
                    queries.dead_letter, [{"id": r.id, "error": e} for r, e in result.dead]
                )
            if result.failed:
                await cur.executemany(
                    queries.record_failure, [{"id": r.id, "error": e} for r, e in result.failed]
                )
