"""A few lines on why a chaos run did not settle, for the report's notes.

A CI machine keeps nothing after the run, so what the report prints is all there is to
go on: which sessions of the run's database were busy or waiting (a lock held by a
transaction left open stalls every claim behind it), whether the commands of the calls
still ``authorized`` were published (and how long ago), and when each worker last moved
a call and what it last said.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from dispatcher.tenancy import ordering_key_sql

_ACTIVITY = text(
    "SELECT application_name, state, wait_event_type, wait_event,"
    " extract(epoch FROM now() - xact_start) AS xact_age,"
    " cardinality(pg_blocking_pids(pid)) AS blocked_by, left(query, 70) AS query"
    " FROM pg_stat_activity"
    " WHERE datname = current_database() AND pid <> pg_backend_pid() AND state <> 'idle'"
    " ORDER BY xact_start NULLS LAST LIMIT 6"
)
_COMMANDS = text(
    "SELECT count(*) AS calls,"  # noqa: S608 - constant text
    " count(*) FILTER (WHERE c.newest IS NULL) AS without_command,"
    " count(*) FILTER (WHERE c.unpublished > 0) AS command_waiting,"
    " extract(epoch FROM now() - max(c.newest)) AS youngest_age"
    " FROM tool_calls t LEFT JOIN LATERAL ("
    "   SELECT max(o.published_at) AS newest,"
    "     count(*) FILTER (WHERE o.published_at IS NULL) AS unpublished"
    f"   FROM outbox o WHERE o.key = {ordering_key_sql('t.tenant', 't.tool_call_id')}"
    "     AND o.topic = :topic) c ON true"
    " WHERE t.status = 'authorized'"
)
_TRANSITION = "tool_dispatcher.transitions"
_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)")


async def diagnose(engine: AsyncEngine, logs: Path, dispatch_topic: str) -> list[str]:
    """Notes on a run that did not settle; never raises (a diagnosis must not hide the
    report it belongs to)."""
    notes: list[str] = []
    try:
        async with engine.connect() as conn:
            busy = (await conn.execute(_ACTIVITY)).all()
            commands = (await conn.execute(_COMMANDS, {"topic": dispatch_topic})).one()
    except (OSError, SQLAlchemyError) as exc:  # the database may be what went wrong
        notes.append(f"diagnosis: database not readable ({type(exc).__name__})")
    else:
        notes.append(
            f"diagnosis: {commands.calls} call(s) authorized; {commands.without_command} "
            f"without a published command, {commands.command_waiting} with one unpublished;"
            f" newest command published {_age(commands.youngest_age)} ago"
        )
        notes += [
            f"  db session {r.application_name or '?'}: {r.state}, transaction "
            f"{_age(r.xact_age)} old, waiting {r.wait_event_type or '-'}/{r.wait_event or '-'}"
            f", blocked by {r.blocked_by}: {' '.join((r.query or '').split())}"
            for r in busy
        ]
    return notes + await asyncio.to_thread(_workers, logs)


def _workers(logs: Path) -> list[str]:
    return [f"  {path.stem}: {worker_summary(path)}" for path in sorted(logs.glob("worker-*.log"))]


def worker_summary(path: Path) -> str:
    """When the worker last moved a call, and its last log record that is not a move or
    the broker client's (a traceback's lines are not records: they carry no time)."""
    last_move = last_said = ""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError as exc:
        return f"log not readable ({exc})"
    for line in lines:
        match = _STAMP.match(line)
        if match is None:
            continue
        if _TRANSITION in line:
            last_move = match.group(1)
        elif " aiokafka" not in line:
            last_said = line
    return f"last move {last_move or 'never'}; last said: {last_said[:160] or 'nothing'}"


def _age(seconds: float | None) -> str:
    return "-" if seconds is None else f"{float(seconds):.1f} s"
