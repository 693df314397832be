"""The event log partitioned by day (migration 0014): every stored event carried across
in seq order with its seq, the identity going on after it, each day's partition as
append-only as the log, and an event of a day without a partition kept (the default
partition) and moved into its day when that day is created."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from dispatcher.db import migrate

pytestmark = pytest.mark.postgres

_EVENT = (
    "INSERT INTO execution_events (event_id, event_type, tenant, run_id, producer,"
    " schema_version, occurred_at) VALUES (%s, 'tool.call.authorized', 'acme', 'run-1',"
    " 'tool-dispatcher.worker', 1, {when})"
)
ALL = "SELECT * FROM execution_events ORDER BY seq"


def _add(conn: psycopg.Connection[Any], event_id: str, when: str) -> None:
    conn.execute(_EVENT.format(when=when), (event_id,))  # type: ignore[arg-type]


def test_0014_carries_every_event_across_with_its_seq_and_back(empty_database_url: str) -> None:
    url = empty_database_url
    migrate.upgrade(url, "0013")
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        for n, when in enumerate(
            ["now() - interval '3 days'", "now()", "now() - interval '1 day'"]
        ):
            _add(conn, f"ev-{n}", when)
        # A rolled-back insert leaves a gap the identity must not fill again.
        with pytest.raises(psycopg.errors.NotNullViolation), conn.transaction():
            conn.execute("INSERT INTO execution_events (event_id) VALUES ('ev-lost')")
        before = conn.execute(ALL).fetchall()

    migrate.upgrade(url, "0014")

    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        assert conn.execute(ALL).fetchall() == before
        kind = conn.execute(
            "SELECT relkind FROM pg_class WHERE relname = 'execution_events'"
        ).fetchone()
        assert kind == {"relkind": "p"}
        _add(conn, "ev-next", "now()")
        seq = conn.execute("SELECT seq FROM execution_events WHERE event_id = 'ev-next'").fetchone()
        assert seq is not None and seq["seq"] > max(r["seq"] for r in before)
        empty = conn.execute("SELECT count(*) AS n FROM execution_events_default").fetchone()
        assert empty == {"n": 0}
        after = conn.execute(ALL).fetchall()

    migrate.downgrade(url, "0013")
    with psycopg.connect(url, row_factory=dict_row) as conn:
        assert conn.execute(ALL).fetchall() == after


@pytest.mark.parametrize("table", ["today", "execution_events_default"])
@pytest.mark.parametrize(
    "statement",
    ["UPDATE {t} SET payload = '{{}}'", "DELETE FROM {t}", "TRUNCATE {t}"],
    ids=["update", "delete", "truncate"],
)
def test_each_partition_refuses_changes_like_the_log(
    database_url: str, table: str, statement: str
) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        _add(conn, "ev-1", "now()")
        _add(conn, "ev-far", "now() + interval '400 days'")  # no partition: the default's
        name = conn.execute(
            "SELECT tableoid::regclass::text FROM execution_events WHERE event_id = 'ev-1'"
        ).fetchone()
        assert name is not None and name[0].startswith("execution_events_p")
        target = name[0] if table == "today" else table
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="append-only"):
            conn.execute(statement.format(t=target))
        assert conn.execute("SELECT count(*) FROM execution_events").fetchone() == (2,)


def test_events_stranded_in_the_default_partition_move_into_their_day(database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True, row_factory=dict_row) as conn:
        _add(conn, "ev-old", "'2001-02-03 10:00+00'")
        _add(conn, "ev-other", "'2001-02-04 10:00+00'")
        before = conn.execute(ALL).fetchall()
        made = conn.execute("SELECT execution_events_ensure_partition('2001-02-03') AS made")
        assert made.fetchone() == {"made": True}
        assert conn.execute(ALL).fetchall() == before
        where = conn.execute(
            "SELECT event_id, tableoid::regclass::text AS part FROM execution_events"
            " WHERE event_id LIKE 'ev-o%' ORDER BY event_id"
        ).fetchall()
        assert where == [
            {"event_id": "ev-old", "part": "execution_events_p20010203"},
            {"event_id": "ev-other", "part": "execution_events_default"},
        ]
        again = conn.execute("SELECT execution_events_ensure_partition('2001-02-03') AS made")
        assert again.fetchone() == {"made": False}
        # The new default partition refuses a truncate like the one it replaced.
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("TRUNCATE execution_events_default")
