"""What a statement read, from PostgreSQL's own account of running it (``EXPLAIN
(ANALYZE, BUFFERS, FORMAT JSON)``), and every statement an operation sends, explained
as it goes.

The counting is ``tests/fixtures/plans.py``'s (the plan tests' ``rows_examined``),
copied here because the benchmarks import nothing from ``tests/``; this copy also counts
the rows a bitmap heap scan's recheck threw away, which it read all the same.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql
from psycopg.pq import TransactionStatus

EXPLAIN = "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "
_EXPLAINED = ("select", "insert", "update", "delete", "with")


def nodes(plan: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    """Every node of a plan tree, the root first."""
    pending = [plan]
    while pending:
        node = pending.pop()
        yield node
        pending.extend(node.get("Plans", ()))


def rows_examined(plan: Mapping[str, Any]) -> int:
    """Rows every scan of a table produced plus the rows its filters (and a bitmap heap
    scan's recheck) threw away, times its loops: what the statement read to answer.
    A bitmap index scan's rows are its heap scan's, counted there."""
    total = 0
    for node in nodes(plan):
        if "Relation Name" in node:
            produced = (
                node.get("Actual Rows", 0)
                + node.get("Rows Removed by Filter", 0)
                + node.get("Rows Removed by Index Recheck", 0)
            )
            total += round(produced * node.get("Actual Loops", 1))
    return total


def buffers(plan: Mapping[str, Any]) -> int:
    """Shared buffers the statement touched (hit or read); the root's counts include
    its children's."""
    return int(plan.get("Shared Hit Blocks", 0) + plan.get("Shared Read Blocks", 0))


def returned(plan: Mapping[str, Any]) -> int:
    """Rows the statement gave back (its root's)."""
    return round(plan.get("Actual Rows", 0) * plan.get("Actual Loops", 1))


@dataclass(frozen=True, slots=True)
class Explained:
    """One statement as it ran: its first words, rows examined, buffers touched, rows
    returned."""

    statement: str
    rows: int
    buffers: int
    returned: int = 0

    @classmethod
    def of(cls, statement: str, document: Any) -> Explained:
        found = json.loads(document) if isinstance(document, str | bytes) else document
        plan = found[0]["Plan"]
        head = " ".join(statement.split())[:60]
        return cls(head, rows_examined(plan), buffers(plan), returned(plan))


def explainable(statement: str) -> bool:
    """A statement that reads or writes rows (not BEGIN, SET, LISTEN...)."""
    return statement.lstrip(" \n\t(").lower().startswith(_EXPLAINED)


def _text(cursor: psycopg.AsyncCursor[Any], query: Any) -> str:
    if isinstance(query, sql.Composable):
        return query.as_string(cursor.connection)
    return query.decode() if isinstance(query, bytes) else str(query)


@contextlib.asynccontextmanager
async def explaining() -> AsyncIterator[list[Explained]]:
    """Within the block, every statement any psycopg async cursor of this process runs is
    first run under ``EXPLAIN (ANALYZE, BUFFERS)`` and undone (rolled back to a
    savepoint, or in a transaction of its own on an idle connection), then run for
    real: the plan sees the rows exactly as the statement then does. Yields the list the
    explained statements are appended to. SQLAlchemy's psycopg dialect and intake's own
    statement both go through these cursors."""
    original = psycopg.AsyncCursor.execute
    found: list[Explained] = []

    async def undone(cursor: psycopg.AsyncCursor[Any], text: str, params: Any) -> None:
        conn = cursor.connection
        plain = conn.cursor()
        status = conn.info.transaction_status
        if status == TransactionStatus.INTRANS:
            await original(plain, "SAVEPOINT bench_explain")
            await original(plain, EXPLAIN + text, params)
            found.append(Explained.of(text, (await plain.fetchone())[0]))  # type: ignore[index]
            await original(plain, "ROLLBACK TO SAVEPOINT bench_explain")
            await original(plain, "RELEASE SAVEPOINT bench_explain")
        elif status == TransactionStatus.IDLE:
            if conn.autocommit:
                await original(plain, "BEGIN")
            await original(plain, EXPLAIN + text, params)
            found.append(Explained.of(text, (await plain.fetchone())[0]))  # type: ignore[index]
            await original(plain, "ROLLBACK")

    async def execute(
        self: psycopg.AsyncCursor[Any], query: Any, params: Any = None, **options: Any
    ) -> psycopg.AsyncCursor[Any]:
        text = _text(self, query)
        if explainable(text):
            await undone(self, text, params)
        return await original(self, query, params, **options)

    psycopg.AsyncCursor.execute = execute  # type: ignore[method-assign]
    try:
        yield found
    finally:
        psycopg.AsyncCursor.execute = original  # type: ignore[method-assign]
