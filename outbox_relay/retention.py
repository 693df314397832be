"""Deleting published rows, so the outbox does not grow without bound.

Deletes go in bounded batches, each its own short transaction, so a large backlog of
old rows never turns into one long lock-holding statement.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg

from outbox_relay.config import libpq_url
from outbox_relay.queries import Queries


async def purge_batches(
    conn: psycopg.AsyncConnection[Any],
    queries: Queries,
    *,
    older_than: timedelta,
    batch_size: int,
    max_batches: int | None = None,
) -> int:
    """Delete published rows older than ``older_than``; returns how many went."""
    total = 0
    batches = 0
    while max_batches is None or batches < max_batches:
        async with conn.transaction():
            cur = await conn.execute(queries.purge, {"age": older_than, "limit": batch_size})
        total += cur.rowcount
        batches += 1
        if cur.rowcount < batch_size:
            break
    return total


async def purge_published(
    database_url: str,
    *,
    table: str = "outbox",
    older_than: timedelta = timedelta(hours=24),
    batch_size: int = 5000,
    max_batches: int | None = None,
) -> int:
    """Delete rows of outbox ``table`` published more than ``older_than`` ago, in
    batches of ``batch_size``; returns the number deleted. Unpublished and
    dead-lettered rows are never touched."""
    async with await psycopg.AsyncConnection.connect(
        libpq_url(database_url), autocommit=True
    ) as conn:
        return await purge_batches(
            conn,
            Queries.for_table(table),
            older_than=older_than,
            batch_size=batch_size,
            max_batches=max_batches,
        )
