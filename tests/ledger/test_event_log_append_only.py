"""The event log is append-only by the database's own rule: UPDATE, DELETE and TRUNCATE
of ``execution_events`` fail in PostgreSQL itself, whoever sends them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

pytestmark = pytest.mark.postgres

SELECT_ALL = "SELECT * FROM execution_events ORDER BY seq"


@pytest.fixture
def conn(database_url: str) -> Iterator[psycopg.Connection[dict[str, Any]]]:
    """A plain connection holding one recorded event."""
    with psycopg.connect(database_url, autocommit=True, row_factory=dict_row) as connection:
        connection.execute(
            "INSERT INTO execution_events (event_id, event_type, tenant, run_id, producer,"
            " schema_version, occurred_at, payload)"
            " VALUES ('evt_1', 'tool.call.requested', 'acme', 'run-1',"
            " 'tool-dispatcher.worker', 1, now(),"
            " '{\"k\": 1}')"
        )
        yield connection


@pytest.mark.parametrize(
    "statement",
    [
        pytest.param("UPDATE execution_events SET payload = '{}'", id="update"),
        pytest.param("UPDATE execution_events SET event_type = event_type", id="noop-update"),
        pytest.param("DELETE FROM execution_events", id="delete"),
        pytest.param("DELETE FROM execution_events WHERE event_id = 'evt_1'", id="delete-one"),
        pytest.param("TRUNCATE execution_events", id="truncate"),
    ],
)
def test_changing_a_recorded_event_is_refused(
    conn: psycopg.Connection[dict[str, Any]], statement: str
) -> None:
    before = conn.execute(SELECT_ALL).fetchall()
    assert len(before) == 1

    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="append-only"):
        conn.execute(statement)

    assert conn.execute(SELECT_ALL).fetchall() == before


def test_the_refusal_aborts_the_whole_transaction(
    conn: psycopg.Connection[dict[str, Any]],
) -> None:
    before = conn.execute(SELECT_ALL).fetchall()

    with pytest.raises(psycopg.errors.InsufficientPrivilege), conn.transaction():
        conn.execute(
            "INSERT INTO execution_events (event_id, event_type, tenant, run_id, producer,"
            " schema_version, occurred_at) VALUES ('evt_2', 'tool.call.authorized', 'acme',"
            " 'run-1', 'tool-dispatcher.worker', 1, now())"
        )
        conn.execute("DELETE FROM execution_events WHERE event_id = 'evt_1'")

    assert conn.execute(SELECT_ALL).fetchall() == before


def test_appending_is_allowed(conn: psycopg.Connection[dict[str, Any]]) -> None:
    conn.execute(
        "INSERT INTO execution_events (event_id, event_type, tenant, run_id, producer,"
        " schema_version, occurred_at) VALUES ('evt_2', 'tool.call.authorized', 'acme',"
        " 'run-1', 'tool-dispatcher.worker', 1, now())"
    )
    assert [r["event_id"] for r in conn.execute(SELECT_ALL)] == ["evt_1", "evt_2"]
