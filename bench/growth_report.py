"""What ``bench.growth`` prints: the bytes each table and index holds, per finished call;
the database's projected steady-state size; each operation on the empty database and
the full one, with their ratio against the ceiling. The arithmetic is pure (and
``bench/tests/test_growth.py`` holds it); :func:`sizes` is the one query.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import psycopg

from bench.harness import render_table
from dispatcher.states import TERMINAL_STATES

CEILING = 1.5
"""An operation may cost at most this many times on the full database what it costs on
the empty one."""
HTTP_FLOOR = 0.95
"""HTTP intake on the full database keeps at least this share of its empty-DB rate."""
RATES = (10, 100, 1_000)
"""Calls per second the projection is made for."""
OUTBOX = "outbox"


@dataclass(frozen=True, slots=True)
class Part:
    """Bytes of one table (partitions summed into their parent), or of one index."""

    heap: int = 0
    toast: int = 0
    indexes: int = 0
    rows: int = 0

    @property
    def total(self) -> int:
        return self.heap + self.toast + self.indexes

    def __sub__(self, other: Part) -> Part:
        return Part(self.heap - other.heap, self.toast - other.toast,
                    self.indexes - other.indexes, self.rows - other.rows)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Sizes:
    tables: dict[str, Part]
    indexes: dict[str, tuple[str, int]]
    """Index name -> (its table, bytes)."""
    finished: int
    """Calls in a terminal status."""
    window_calls: int
    """Calls created within the outbox's window (its rows are purged after it)."""

    @property
    def total(self) -> int:
        return sum(p.total for p in self.tables.values())


_TABLES = """
SELECT coalesce(pg_partition_root(c.oid), c.oid)::regclass::text,
    sum(pg_relation_size(c.oid, 'main') + pg_relation_size(c.oid, 'fsm')
        + pg_relation_size(c.oid, 'vm')),
    sum(coalesce(pg_total_relation_size(nullif(c.reltoastrelid, 0)), 0)),
    sum(pg_indexes_size(c.oid))
FROM pg_class c
WHERE c.relkind = 'r' AND c.relnamespace = 'public'::regnamespace
GROUP BY 1"""
_INDEXES = """
SELECT coalesce(pg_partition_root(i.indexrelid), i.indexrelid)::regclass::text,
    coalesce(pg_partition_root(c.oid), c.oid)::regclass::text,
    sum(pg_relation_size(i.indexrelid))
FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid
WHERE c.relkind = 'r' AND c.relnamespace = 'public'::regnamespace
GROUP BY 1, 2"""


def sizes(url: str, window_hours: int) -> Sizes:
    """Every table's and index's bytes now, with exact row counts."""
    terminal = ", ".join(f"'{s.value}'" for s in TERMINAL_STATES)
    with psycopg.connect(url, autocommit=True) as conn:
        tables = {}
        for name, heap, toast, indexes in conn.execute(_TABLES).fetchall():
            counted = conn.execute(f'SELECT count(*) FROM "{name}"').fetchone()
            rows = int(counted[0]) if counted else 0
            tables[str(name)] = Part(int(heap), int(toast), int(indexes), rows)
        found = conn.execute(_INDEXES).fetchall()
        finished, window = conn.execute(
            f"SELECT count(*) FILTER (WHERE status IN ({terminal})),"
            " count(*) FILTER (WHERE created_at >= now() - %s * interval '1 hour')"
            " FROM tool_calls",
            (window_hours,),
        ).fetchone() or (0, 0)
    return Sizes(
        tables, {str(i): (str(t), int(b)) for i, t, b in found}, int(finished), int(window)
    )


@dataclass(frozen=True, slots=True)
class Growth:
    """What the history added, per finished call: the full database less the empty one
    (both hold the same live set), so fixed costs (empty pages, catalogs) drop out."""

    calls: int
    tables: dict[str, Part]
    indexes: dict[str, tuple[str, int]]
    outbox_calls: int

    @classmethod
    def between(cls, full: Sizes, empty: Sizes) -> Growth:
        names = set(full.tables) | set(empty.tables)
        tables = {n: full.tables.get(n, Part()) - empty.tables.get(n, Part()) for n in names}
        indexes = {
            n: (t, b - empty.indexes.get(n, (t, 0))[1]) for n, (t, b) in full.indexes.items()
        }
        return cls(full.finished - empty.finished, tables, indexes,
                   full.window_calls - empty.window_calls)  # fmt: skip

    def per_call(self, part: Part | int) -> float:
        value = part.total if isinstance(part, Part) else part
        return value / self.calls if self.calls else 0.0

    @property
    def retained(self) -> float:
        """Bytes per call of everything kept as long as the call: all but the outbox."""
        return self.per_call(sum(p.total for n, p in self.tables.items() if n != OUTBOX))

    @property
    def outbox(self) -> float:
        """Outbox bytes per call written within its window."""
        held = self.tables.get(OUTBOX, Part()).total
        return held / self.outbox_calls if self.outbox_calls else 0.0

    @property
    def total(self) -> float:
        return self.per_call(sum(p.total for p in self.tables.values()))


def projected_bytes(
    rate: float, retention_days: float, retained: float, outbox: float, window_hours: float = 24
) -> float:
    """Steady-state bytes at ``rate`` calls/s: every call of the retention kept with its
    rows, plus the outbox's rows of its window."""
    return rate * (retention_days * 86_400 * retained + window_hours * 3_600 * outbox)


def ratio(full: float, empty: float) -> float:
    return full / empty if empty else float("inf") if full else 1.0


def verdict(value: float, *, ceiling: float | None = None, floor: float | None = None) -> str:
    """``ok`` within the bound, else how it is out of it."""
    if ceiling is not None and value > ceiling:
        return f"OVER {ceiling:g}x"
    if floor is not None and value < floor:
        return f"UNDER {floor:g}x"
    return "ok"


def human(n: float) -> str:
    """Bytes in the largest unit that keeps a number >= 1 (1,024 to a unit)."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1024 or unit == "TB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def size_tables(growth: Growth) -> tuple[str, str]:
    """Per table and per index, bytes per finished call (markdown)."""
    rows = []
    for name, part in sorted(growth.tables.items(), key=lambda kv: -kv[1].total):
        if not part.total and not part.rows:
            continue
        rows.append([
            name, f"{part.rows / growth.calls:.2f}" if growth.calls else "-",
            *(f"{growth.per_call(v):,.0f}" for v in (part.heap, part.toast, part.indexes, part)),
        ])  # fmt: skip
    rows.append(["all tables", "", "", "", "", f"{growth.total:,.0f}"])
    tables = render_table(
        rows,
        ["table", "rows/call", "heap B", "toast B", "indexes B", "total B/call"],
        markdown=True,
    )
    index_rows = [
        [name, table, f"{growth.per_call(b):,.1f}"]
        for name, (table, b) in sorted(growth.indexes.items(), key=lambda kv: -kv[1][1])
        if b > 0
    ]
    indexes = render_table(index_rows, ["index", "table", "B/call"], markdown=True)
    return tables, indexes


def projection_table(growth: Growth, retentions: Sequence[float]) -> str:
    header = ["calls/s", *(f"{d:g} days kept" for d in retentions)]
    rows = [
        [f"{rate:,}", *(human(projected_bytes(rate, d, growth.retained, growth.outbox))
                        for d in retentions)]
        for rate in RATES
    ]  # fmt: skip
    return render_table(rows, header, markdown=True)


@dataclass(frozen=True, slots=True)
class Row:
    """One operation on both databases."""

    operation: str
    empty_ms: float
    full_ms: float
    empty_rows: int
    full_rows: int
    empty_buffers: int
    full_buffers: int
    returned: int = 0
    """Rows the full database's statements gave back: a page of 100 rows examines 100
    rows however few the empty database had to show."""
    note: str = ""

    @property
    def rows_ratio(self) -> float:
        """Rows examined on the full database against the empty one's, or against what
        the full one returned when that is more."""
        return ratio(self.full_rows, max(self.empty_rows, self.returned))


def operations_table(rows: Sequence[Row]) -> str:
    header = ["operation", "empty ms", "full ms", "time ratio", "rows examined (empty/full)",
              "returned (full)", "rows ratio", "buffers (empty/full)",
              f"verdict (<= {CEILING:g}x)"]  # fmt: skip
    out = []
    for r in rows:
        if r.note:
            out.append([r.operation, *("-",) * 7, r.note])
            continue
        time_ratio = ratio(r.full_ms, r.empty_ms)
        rows_ratio = r.rows_ratio
        worst = max(time_ratio, rows_ratio)
        out.append([
            r.operation, f"{r.empty_ms:.2f}", f"{r.full_ms:.2f}", f"{time_ratio:.2f}x",
            f"{r.empty_rows:,} / {r.full_rows:,}", f"{r.returned:,}", f"{rows_ratio:.2f}x",
            f"{r.empty_buffers:,} / {r.full_buffers:,}", verdict(worst, ceiling=CEILING),
        ])  # fmt: skip
    return render_table(out, header, markdown=True)


def statements_detail(by_op: Mapping[str, Sequence[tuple[str, int, int]]]) -> list[str]:
    """Each operation's statements whose rows examined grew past the ceiling: the
    statement's first words, rows empty -> full."""
    lines = []
    for op, statements in by_op.items():
        for head, empty, full in statements:
            if ratio(full, empty) > CEILING and full - empty > 100:
                lines.append(f"- {op}: `{head}` {empty:,} -> {full:,} rows")
    return lines
