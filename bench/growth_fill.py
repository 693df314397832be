"""Writing a history into a migrated database with ``generate_series``: calls, their
events, approvals, escalations, stopped runs and the outbox's last 24 hours, as
``bench.growth`` measures them.

Calls are written a chunk at a time: each chunk's calls go into a temporary table, and
every real table is filled from it by one INSERT ... SELECT, in time order (events by
``occurred_at``, so ``seq`` follows time as it does in service). Indexes stay in place
while rows go in, so each one has the shape that growing gives it, not the packed
shape of a fresh build. Only the columns the schema has are written (``--revision``):
a column the fill does not know must be nullable or have a default.

Call ``n`` (1-based) belongs to run ``(n - 1) / calls_per_run``, whose tenant is that
number modulo ``tenants`` and whose id counts per tenant (``run-000042``): every
tenant has the same run ids. Its path (``bench.growth_paths``) is fixed by ``n``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

import psycopg
from psycopg.sql import Literal

from bench import growth_rows as rows
from bench.growth_paths import EVENT_TYPES, HISTORY, LIVE, Path
from bench.growth_paths import producer as producer_of

LIVE_TENANTS = 5


@dataclass(frozen=True, slots=True)
class Shape:
    calls: int
    days: float = 60.0
    tenants: int = 50
    calls_per_run: int = 8
    chunk: int = 50_000

    @property
    def live_calls(self) -> int:
        return sum(p.weight for p in LIVE)


def _paths_sql() -> str:
    """``gen_paths``: one row per path, with the range of ``n`` it owns (history: a
    bucket range of ``n * 761 % 1000``, a permutation of the residues; live: offsets)."""
    rows, low = [], 0
    for i, path in enumerate(HISTORY):
        rows.append(_path_row(i, path, low, low + path.weight - 1))
        low += path.weight
    low = 0
    for i, path in enumerate(LIVE, start=len(HISTORY)):
        rows.append(_path_row(i, path, low, low + path.weight - 1))
        low += path.weight
    return (
        "CREATE TEMP TABLE gen_paths (path int, live bool, lo int, hi int, status text,"
        " verification text, reconciliation text, outcome text, approval text,"
        " escalation text, dispatched int, accepted int, finished int, steps int)"
        " ON COMMIT PRESERVE ROWS;"
        f" INSERT INTO gen_paths VALUES {', '.join(rows)}"
    )


def _path_row(i: int, path: Path, lo: int, hi: int) -> str:
    at = dict(path.steps)
    accepted = at.get("accepted", at.get("completed"))
    finished = None if path.live else path.steps[-1][1]

    def text(v: str | None) -> str:
        return "NULL" if v is None else f"'{v}'"

    def num(v: int | None) -> str:
        return "NULL" if v is None else str(v)

    return (
        f"({i}, {path.live}, {lo}, {hi}, '{path.status}', '{path.verification}',"
        f" '{path.reconciliation}', '{path.outcome}', {text(path.approval)},"
        f" {text(path.escalation)}, {num(at.get('dispatching'))}, {num(accepted)},"
        f" {num(finished)}, {len(path.steps)})"
    )


def _steps_sql() -> str:
    rows = [
        f"({i}, {step}, '{kind}', '{EVENT_TYPES[kind]}', '{producer_of(kind)}', {after})"
        for i, path in enumerate((*HISTORY, *LIVE))
        for step, (kind, after) in enumerate(path.steps)
    ]
    return (
        "CREATE TEMP TABLE gen_steps (path int, step int, kind text, event_type text,"
        " producer text, after_ms int); "
        f"INSERT INTO gen_steps VALUES {', '.join(rows)}"
    )


class Columns:
    """The columns each table has at the migrated revision, with their SQL types."""

    def __init__(self, conn: psycopg.Connection[tuple[object, ...]]) -> None:
        rows = conn.execute(
            "SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod),"
            " a.attnotnull AND a.atthasdef IS FALSE AND a.attidentity = ''"
            " AND a.attgenerated = ''"
            " FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid"
            " JOIN pg_namespace s ON s.oid = c.relnamespace"
            " WHERE s.nspname = 'public' AND a.attnum > 0 AND NOT a.attisdropped"
        ).fetchall()
        self.types: dict[str, dict[str, str]] = {}
        self.required: dict[str, set[str]] = {}
        for table, column, type_, required in rows:
            self.types.setdefault(str(table), {})[str(column)] = str(type_)
            if required:
                self.required.setdefault(str(table), set()).add(str(column))

    def insert(self, table: str, known: dict[str, str], source: str, order: str = "") -> str:
        """``INSERT INTO table`` of the known columns it has, each cast to its type."""
        have = self.types[table]
        missing = self.required.get(table, set()) - set(known)
        if missing:
            raise SystemExit(f"{table}: the fill does not know {sorted(missing)}")
        names = [c for c in known if c in have]
        values = ", ".join(self._value(known[c], have[c]) for c in names)
        return f"INSERT INTO {table} ({', '.join(names)}) SELECT {values} {source} {order}"

    @staticmethod
    def _value(sql: str, type_: str) -> str:
        # A digest column is written as hex digits; bytea (migration 0016) holds the bytes.
        return f"decode({sql}, 'hex')" if type_ == "bytea" else f"({sql})::{type_}"


def bind(
    conn: psycopg.Connection[tuple[object, ...]], sql: str, params: dict[str, object]
) -> bytes:
    """``sql`` with each ``%(name)s`` replaced by its value as a literal: the statements
    go without parameters, so ``%`` stays the modulo operator."""
    for name, value in params.items():
        sql = sql.replace(f"%({name})s", Literal(value).as_string(conn))
    return sql.encode()


def _chunk(
    conn: psycopg.Connection[tuple[object, ...]], cols: Columns, params: dict[str, object]
) -> None:
    """One chunk of calls and everything they wrote."""
    events = {c: f"e.{c}" for c in cols.types["execution_events"] if c != "seq"}
    stopped = (
        "WHERE EXISTS (SELECT 1 FROM gen_steps g WHERE g.path = c.path AND g.kind = 'run_stopped')"
    )
    statements = [
        "DROP TABLE IF EXISTS gen_calls",
        rows.CALLS,
        "CREATE INDEX ON gen_calls (n)",
        "ANALYZE gen_calls",
        cols.insert(
            "tool_calls",
            rows.call_columns(stores_namespaced_keys="provider_key" in cols.required["tool_calls"]),
            "FROM gen_calls c",
            "ORDER BY c.n",
        ),
        cols.insert("execution_events", events, f"FROM ({rows.EVENTS}) AS e", "ORDER BY e.at"),
        cols.insert("approvals", rows.APPROVALS, "FROM gen_calls c WHERE c.approval IS NOT NULL"),
        cols.insert(
            "escalations", rows.ESCALATIONS, "FROM gen_calls o WHERE o.escalation IS NOT NULL"
        ),
        cols.insert("runs", rows.RUNS, f"FROM gen_calls c {stopped}", "ON CONFLICT DO NOTHING"),
        rows.outbox_sql(),
    ]
    with conn.transaction():
        for statement in statements:
            conn.execute(bind(conn, statement, params))


def fill(url: str, shape: Shape, *, history: bool, say: Callable[[str], None] = print) -> datetime:
    """Write the live set, and the history first when ``history``; returns the anchor
    (the build's "now"). The live set is the same whatever ``history``."""
    with psycopg.connect(url, autocommit=True) as conn:
        # The fill may lose its last commits in a crash: a lost fill is built again.
        for setting in ("synchronous_commit = off", "work_mem = '256MB'", "temp_buffers = '512MB'"):
            conn.execute(f"SET {setting}")
        anchor = conn.execute("SELECT date_trunc('second', now())").fetchone()[0]  # type: ignore[index]
        _partitions(conn, shape)
        conn.execute(_paths_sql())
        conn.execute(_steps_sql())
        cols = Columns(conn)
        base = {"anchor": anchor, "per_run": shape.calls_per_run, "tenants": shape.tenants,
                "days": shape.days, "calls": shape.calls, "base": shape.calls}  # fmt: skip
        started = time.monotonic()
        if history:
            for lo in range(1, shape.calls + 1, shape.chunk):
                hi = min(shape.calls, lo + shape.chunk - 1)
                _chunk(conn, cols, {**base, "lo": lo, "hi": hi, "live": False})
                rate = hi / (time.monotonic() - started)
                say(f"  {hi:,} of {shape.calls:,} calls ({rate:,.0f} calls/s)")
        live = {"lo": shape.calls + 1, "hi": shape.calls + shape.live_calls, "live": True}
        base["tenants"] = min(shape.tenants, LIVE_TENANTS)
        _chunk(conn, cols, {**base, **live})
        if "run_summaries" in cols.types:
            # Kept by the ledger as calls move; written here once, runs in time order.
            known = rows.summaries(cols.types["run_summaries"])
            order = "ORDER BY min(c.created_at)"
            conn.execute(cols.insert("run_summaries", known, rows.SUMMARIES_SOURCE, order))
        conn.execute("VACUUM ANALYZE")
    return anchor  # type: ignore[no-any-return]


def _partitions(conn: psycopg.Connection[tuple[object, ...]], shape: Shape) -> None:
    """Every day of the history gets its partition, as the retention job would have made
    them (a schema without daily partitions has no such function)."""
    ensure = conn.execute("SELECT to_regproc('execution_events_ensure_partition')").fetchone()
    if ensure is None or ensure[0] is None:
        return
    conn.execute(
        "SELECT execution_events_ensure_partition(d::date) FROM generate_series("
        "(now() - %s * interval '1 day') AT TIME ZONE 'UTC', (now() AT TIME ZONE 'UTC')"
        " + interval '7 days', interval '1 day') AS d",
        (shape.days + 1,),
    )
