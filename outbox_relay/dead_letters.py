"""Rows the broker will never take, and what an operator can do about them.

A dead letter stops its own key (later rows of the key wait, so the key's order
survives) but never other keys. The operator either retries it (after fixing the
cause: creating the topic, raising the size limit) or discards it; either way the
key's waiting rows then flow again.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import psycopg

from outbox_relay.config import libpq_url
from outbox_relay.queries import Queries


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One dead-lettered row and how many rows of its key wait behind it."""

    id: int
    topic: str
    key: str
    message_id: str | None
    attempts: int
    last_error: str | None
    dead_lettered_at: datetime
    created_at: datetime
    blocked_rows: int

    def describe(self) -> str:
        """One line for an operator."""
        line = (
            f"dead letter id {self.id} (topic {self.topic!r}, key {self.key!r}, "
            f"attempts {self.attempts}): {self.last_error}"
        )
        if self.blocked_rows:
            line += (
                f"; {self.blocked_rows} later row(s) of key {self.key!r} "
                f"blocked behind dead letter id {self.id}"
            )
        return line


async def list_dead_letters(
    database_url: str, *, table: str = "outbox", limit: int = 100
) -> list[DeadLetter]:
    """Dead-lettered rows of outbox ``table``, oldest first, with their blocked rows."""
    async with await psycopg.AsyncConnection.connect(libpq_url(database_url)) as conn:
        cur = await conn.execute(Queries.for_table(table).list_dead, {"limit": limit})
        return [DeadLetter(*row) for row in await cur.fetchall()]


async def retry_dead_letter(database_url: str, row_id: int, *, table: str = "outbox") -> bool:
    """Put a dead letter back in line (it is sent again, then its key's waiting rows).
    False when ``row_id`` is not a dead letter."""
    return await _resolve(database_url, Queries.for_table(table).retry_dead, row_id)


async def discard_dead_letter(database_url: str, row_id: int, *, table: str = "outbox") -> bool:
    """Delete a dead letter for good, releasing its key's waiting rows.
    False when ``row_id`` is not a dead letter."""
    return await _resolve(database_url, Queries.for_table(table).discard_dead, row_id)


async def _resolve(database_url: str, statement: psycopg.sql.Composed, row_id: int) -> bool:
    async with await psycopg.AsyncConnection.connect(libpq_url(database_url)) as conn:
        cur = await conn.execute(statement, {"id": row_id})
        found = await cur.fetchone() is not None
        await conn.commit()
        return found
