"""The ceiling of a library call inside the caller's SQLAlchemy transaction:
the SQL ``submit()`` sends, sent through the caller's ``AsyncSession``.

The statements are captured from ``submit()`` itself, once per run, at the driver: every
cursor the engine's psycopg connections open records what it executes. (SQLAlchemy's
``before_cursor_execute`` would miss the intake statement, which ``submit()`` sends on
the session's psycopg connection, below SQLAlchemy's execution layer.) Each replayed
call sends the same statements with parameters of the same kind (``Jsonb`` of the same
rows), its ids and timestamps fresh, through ``AsyncConnection.exec_driver_sql`` of
the session, in a transaction of its own.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg.types.json import Jsonb
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from bench.harness import Call
from dispatcher.ids import time_ordered_uuid

# What a captured parameter's ids and timestamps look like: a uuid of any version (a
# toolCallId is time-ordered, version 7; an outbox message id a uuid4), 32 hex digits
# (an event id's), an ISO 8601 instant. A fresh uuid is time-ordered: the ids of a
# replayed call keep the order intake gives them.
_UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[1-8][0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"
_FRESH: dict[str, Callable[[], str]] = {
    _UUID: time_ordered_uuid,
    r"(?<![0-9a-f-])[0-9a-f]{32}(?![0-9a-f])": lambda: uuid.uuid4().hex,
    r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?\+00:00": lambda: datetime.now(UTC).isoformat(),
}
_TOKEN = re.compile("|".join(f"({pattern})" for pattern in _FRESH))
_MAKERS = list(_FRESH.values())


@dataclass(frozen=True)
class Statement:
    """One statement as the driver got it, its parameters unwrapped from ``Jsonb``."""

    sql: str
    params: dict[str, Any]
    jsonb: frozenset[str]
    rows: int
    """Rows it returned or wrote: a replay that did less (a clash on an id left
    stale) would be cheaper than the call it stands for, so it counts as an error."""


class _Recorder:
    """A psycopg cursor class that appends each statement it executes to ``seen``."""

    def __init__(self) -> None:
        self.seen: list[Statement] = []
        recorder = self

        class Cursor(psycopg.AsyncCursor[Any]):
            async def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
                done = await super().execute(query, params, **kwargs)
                recorder.seen.append(_statement(query, params, self.rowcount))
                return done

        self.cursor = Cursor


def _statement(query: Any, params: Any, rows: int) -> Statement:
    sql = query if isinstance(query, str) else query.as_string(None)
    values = dict(params or {})
    wrapped = frozenset(name for name, value in values.items() if isinstance(value, Jsonb))
    unwrapped = {name: v.obj if name in wrapped else v for name, v in values.items()}
    return Statement(sql, unwrapped, wrapped, rows)


async def capture(engine: AsyncEngine, call: Callable[[], Any]) -> list[Statement]:
    """The statements ``call()`` sends on ``engine`` (run it once first, unrecorded:
    a new connection's own set-up statements are not part of a call)."""
    recorder = _Recorder()

    @event.listens_for(engine.sync_engine, "connect")
    def _record(dbapi_connection: Any, _: Any) -> None:
        dbapi_connection.driver_connection.cursor_factory = recorder.cursor

    # Connections opened before the listener record too.
    await engine.dispose()
    await call()
    recorder.seen.clear()
    await call()
    event.remove(engine.sync_engine, "connect", _record)
    await engine.dispose()  # the connections measured later are plain ones
    return list(recorder.seen)


class _Refresher:
    """Copies a captured parameter value with new ids and timestamps: each distinct
    id of the capture gets one new id per copy, wherever it appears (a toolCallId in
    the call, its events, its messages and its idempotency key)."""

    def __init__(self, statements: list[Statement]) -> None:
        self._templates: dict[str, list[str | tuple[str, int]]] = {}
        self._tokens: dict[str, int] = {}
        for statement in statements:
            for value in statement.params.values():
                self._scan(value)

    def _scan(self, value: Any) -> None:
        if isinstance(value, dict):
            for item in value.values():
                self._scan(item)
        elif isinstance(value, list):
            for item in value:
                self._scan(item)
        elif isinstance(value, str) and value not in self._templates and _TOKEN.search(value):
            parts: list[str | tuple[str, int]] = []
            last = 0
            for match in _TOKEN.finditer(value):
                parts.append(value[last : match.start()])
                kind = match.lastindex or 1
                self._tokens.setdefault(match.group(), kind - 1)
                parts.append((match.group(), kind - 1))
                last = match.end()
            parts.append(value[last:])
            self._templates[value] = parts

    @property
    def fresh_tokens(self) -> int:
        return len(self._tokens)

    def table(self) -> dict[str, str]:
        """Captured string -> its new value, for one copy."""
        new = {token: _MAKERS[kind]() for token, kind in self._tokens.items()}
        return {
            text: "".join(p if isinstance(p, str) else new[p[0]] for p in parts)
            for text, parts in self._templates.items()
        }


def _copy(value: Any, table: dict[str, str]) -> Any:
    if isinstance(value, dict):
        return {k: _copy(v, table) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v, table) for v in value]
    if isinstance(value, str):
        return table.get(value, value)
    return value


def replay_client(
    sessions: async_sessionmaker[AsyncSession],
    statements: list[Statement],
    renamed: dict[str, str] | None = None,
) -> Call:
    """One client's call: ``statements`` through a session, in one transaction;
    ``renamed`` maps captured strings to this client's (its run)."""
    refresher = _Refresher(statements)
    fixed = dict(renamed or {})

    async def call() -> None:
        table = {**refresher.table(), **fixed}
        async with sessions() as session, session.begin():
            conn = await session.connection()
            for s in statements:
                params = {
                    name: Jsonb(_copy(v, table)) if name in s.jsonb else _copy(v, table)
                    for name, v in s.params.items()
                }
                result = await conn.exec_driver_sql(s.sql, params)
                rows = len(result.mappings().all()) if result.returns_rows else result.rowcount
                if rows != s.rows:
                    raise RuntimeError(f"replayed statement did {rows} rows, captured {s.rows}")

    return call


def describe(statements: list[Statement]) -> str:
    """One line: how many statements, their parameters and the fresh values per call."""
    shown = "; ".join(
        f"{' '.join(s.sql.split())[:48]}... ({', '.join(sorted(s.params))})" for s in statements
    )
    tokens = _Refresher(statements).fresh_tokens
    return f"{len(statements)} statement(s) captured from submit(): {shown}; {tokens} fresh ids"
