"""One writer of facts: no product module outside ``dispatcher/ledger/`` inserts into,
updates or deletes from ``tool_calls``, ``execution_events`` or ``outbox`` (nor
retention's ``retention_batches`` and ``retention_log``, nor ``run_summaries``, the
runs' counts of their calls), but those listed in :data:`ALLOWED`, each with its reason.

Read with :mod:`ast`. A write is

- a SQLAlchemy statement on one of the tables: ``insert(t)``, ``update(t)`` or
  ``delete(t)`` (imported under another name too, ``pg_insert(t)``, or through a
  module, ``sa.update(t)``), or ``t.insert()``, ``t.update()``, ``t.delete()``, where
  ``t`` names the table (``tool_calls``, an alias of its import, ``tables.outbox``,
  ``table("outbox")``, ``tool_calls.alias()``);
- SQL text that inserts into, updates, deletes from or truncates one of them, in a
  string or an f-string (a placeholder reads as its source, so
  ``f"UPDATE {tool_calls.name}"`` counts).

Docstrings, and any string that is a statement of its own, are prose: never run.
"""

from __future__ import annotations

import ast
import re

import pytest

from tests.fixtures.paths import REPO

# The facts, and retention's manifest and audit: what removes history says so through
# the ledger alone (dispatcher/ledger/retention.py). And each run's counts of its calls,
# written in the transaction of every move of one (dispatcher/ledger/summaries.py).
FACT_TABLES = frozenset(
    {
        "tool_calls",
        "execution_events",
        "outbox",
        "retention_batches",
        "retention_log",
        "run_summaries",
    }
)
PACKAGES = ("dispatcher", "reconciler", "outbox_relay", "telemetry")
WRITES = frozenset({"insert", "update", "delete"})

# Where a fact table may be written besides the ledger: a path (a folder ends with
# "/") and why. ``outbox_relay`` needs no entry: it writes the outbox it relays by the
# table's configured name (``{t}`` in its statements), never a fact table by name.
ALLOWED: dict[str, str] = {
    "dispatcher/ledger/": "the ledger: the only writer of facts",
    "dispatcher/intake/statement.py": (
        "intake's one statement: a batch's calls, their first events, their outbox rows"
        " and their runs' counts in one CTE, one round trip per batch (the ledger's moves"
        " start from a stored call)"
    ),
    "dispatcher/db/migrations/": "the schema, and the data migrations that go with it",
    "dispatcher/bus/recorder.py": (
        "bus intake's replies: one outbox row per request record, in the transaction that"
        " records its batch (a reply answers a record; the call's facts stay intake's)"
    ),
}

_TABLES = "|".join(sorted(FACT_TABLES))
_SQL_WRITE = re.compile(
    r"\b(?:insert\s+into|update|delete\s+from|truncate(?:\s+table)?)\s+(?:only\s+)?"
    rf"(?:\"?public\"?\.)?\"?({_TABLES})\b",
    re.IGNORECASE,
)


class _Writes(ast.NodeVisitor):
    """The fact tables a module writes, with the line of each write."""

    def __init__(self) -> None:
        self.found: list[tuple[int, str]] = []
        self._tables: dict[str, str] = {name: name for name in FACT_TABLES}
        self._writers: set[str] = set()

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        for alias in node.names:
            local = alias.asname or alias.name
            if alias.name in FACT_TABLES:
                self._tables[local] = alias.name
            elif alias.name in WRITES and (node.module or "").startswith("sqlalchemy"):
                self._writers.add(local)

    def visit_Expr(self, node: ast.Expr) -> None:
        if not (isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):
            self.generic_visit(node)  # a bare string is prose (a docstring): never run

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str):
            self._text(node.lineno, node.value)

    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        text = "".join(
            str(part.value) if isinstance(part, ast.Constant) else ast.unparse(part.value)
            for part in node.values
            if isinstance(part, ast.Constant | ast.FormattedValue)
        )
        self._text(node.lineno, text)

    def visit_Call(self, node: ast.Call) -> None:
        func, table = node.func, None
        if isinstance(func, ast.Name) and func.id in self._writers | WRITES:
            table = self._table(node.args[0]) if node.args else None
        elif isinstance(func, ast.Attribute) and func.attr in WRITES:
            table = self._table(func.value)
            if table is None and node.args:
                table = self._table(node.args[0])  # sa.update(tool_calls)
        if table is not None:
            self.found.append((node.lineno, table))
        self.generic_visit(node)

    def _text(self, line: int, text: str) -> None:
        self.found.extend((line, m.group(1).lower()) for m in _SQL_WRITE.finditer(text))

    def _table(self, node: ast.expr) -> str | None:
        """The fact table ``node`` names, if it names one."""
        if isinstance(node, ast.Name):
            return self._tables.get(node.id)
        if isinstance(node, ast.Attribute):
            return node.attr if node.attr in FACT_TABLES else None
        if isinstance(node, ast.Call):
            first = node.args[0] if node.args else None
            if isinstance(first, ast.Constant) and first.value in FACT_TABLES:
                return str(first.value)  # table("outbox"), Table("outbox", ...)
            if isinstance(node.func, ast.Attribute):
                return self._table(node.func.value)  # tool_calls.alias("t")
        return None


def writes_in(source: str) -> list[tuple[int, str]]:
    """``(line, table)`` of every write of a fact table in ``source``."""
    visitor = _Writes()
    visitor.visit(ast.parse(source))
    return sorted(set(visitor.found))


def _allowed(path: str) -> bool:
    return any(
        path.startswith(where) if where.endswith("/") else path == where for where in ALLOWED
    )


def product_writes() -> dict[str, list[tuple[int, str]]]:
    """``{path: [(line, table)]}`` of every product module that writes a fact table."""
    found = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            name = str(path.relative_to(REPO))
            writes = writes_in(path.read_text())
            if writes:
                found[name] = writes
    assert found, "no write found at all: is the check still reading the packages?"
    return found


def test_only_the_ledger_writes_facts() -> None:
    outside = {path: w for path, w in product_writes().items() if not _allowed(path)}
    assert outside == {}, "write facts through dispatcher/ledger/ (or allow the module, with why)"


def test_every_allowance_is_still_needed_and_gives_a_reason() -> None:
    writers = product_writes()
    stale = [where for where in ALLOWED if not any(p.startswith(where) for p in writers)]
    assert stale == [], "no write there now (or gone): drop it from ALLOWED"
    assert [where for where, reason in ALLOWED.items() if not reason.strip()] == []


LEASE_COLUMNS = frozenset({"lease_owner", "lease_expires_at"})
LEASES = "dispatcher/ledger/leases.py"


def lease_settings(source: str) -> list[int]:
    """Lines of ``source`` that set a lease column by hand: a dict key, or a keyword
    of ``.values(...)``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Dict):
            keys = [k.value for k in node.keys if isinstance(k, ast.Constant)]
            found += [node.lineno] if LEASE_COLUMNS & set(keys) else []
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "values"
        ):
            found += [node.lineno] if LEASE_COLUMNS & {k.arg for k in node.keywords} else []
    return found


def test_the_lease_is_taken_and_released_only_through_the_ledger_s_words() -> None:
    """Every claim sets :func:`take_lease`'s values, every release
    ``LEASE_RELEASED``: both are spelled once, in ``dispatcher/ledger/leases.py``."""
    by_hand = {
        str(path.relative_to(REPO)): lines
        for package in PACKAGES
        for path in sorted((REPO / package).rglob("*.py"))
        if (lines := lease_settings(path.read_text()))
    }
    assert set(by_hand) == {LEASES}, "take or release a lease with dispatcher.ledger.leases"
    assert lease_settings("x.values(lease_owner=None)") and lease_settings(
        "fields = {'lease_expires_at': None}"
    )
    assert not lease_settings("move_many(s, m, lease_owner=None)")


@pytest.mark.parametrize(
    "source",
    [
        "from sqlalchemy import update\nupdate(tool_calls).values(status='x')",
        "from sqlalchemy.dialects.postgresql import insert as pg_insert\npg_insert(outbox)",
        "from dispatcher.db.tables import execution_events as ev\nfrom sqlalchemy import delete"
        "\ndelete(ev)",
        "import sqlalchemy as sa\nsa.update(tables.tool_calls)",
        "tool_calls.delete().where(x)",
        "outbox.insert()",
        "update(table('tool_calls'))",
        "update(tool_calls.alias('t'))",
        "text('UPDATE tool_calls SET lease_owner = NULL')",
        "text('''\n  delete   from\n outbox WHERE id = 1''')",
        "conn.execute('insert into public.execution_events (x) values (1)')",
        "q = f'UPDATE {tool_calls.name} SET x = 1'",
        "q = f'INSERT INTO tool_calls ({cols}) VALUES ({values})'",
        "q = 'TRUNCATE outbox'",
    ],
)
def test_the_check_finds_each_form_of_write(source: str) -> None:
    assert writes_in(source) != []


@pytest.mark.parametrize(
    "source",
    [
        "select(tool_calls).with_for_update()",
        "update(approvals).values(status='x')",
        "statuses.update(found)",
        "'''Every move is one conditional UPDATE tool_calls ... statement.'''",
        "def f():\n    '''DELETE FROM outbox, explained.'''",
        "q = 'SELECT * FROM tool_calls'",
        "q = 'UPDATE {t} SET published_at = now()'",
        "q = 'UPDATE outbox_lanes SET owner = NULL'",
    ],
)
def test_the_check_leaves_reads_prose_and_other_tables(source: str) -> None:
    assert writes_in(source) == []


def test_paths_are_allowed_by_folder_or_by_file() -> None:
    assert _allowed("dispatcher/ledger/marks.py")
    assert _allowed("dispatcher/intake/statement.py")
    assert not _allowed("dispatcher/intake/service.py")
    assert not _allowed("dispatcher/ledgers.py")
