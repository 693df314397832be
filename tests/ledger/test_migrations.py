from __future__ import annotations

import psycopg
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, pool

from dispatcher.db import migrate
from dispatcher.db.tables import metadata
from dispatcher.settings import to_sqlalchemy_url

pytestmark = pytest.mark.postgres


def _tables(url: str) -> set[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
        ).fetchall()
    return {r[0] for r in rows}


def test_upgrade_from_empty_then_downgrade_to_base(empty_database_url: str) -> None:
    migrate.upgrade(empty_database_url)
    assert {"tool_calls", "outbox", "execution_events", "alembic_version"} <= _tables(
        empty_database_url
    )
    migrate.downgrade(empty_database_url)
    assert _tables(empty_database_url) <= {"alembic_version"}
    migrate.upgrade(empty_database_url)  # and back up again, cleanly
    assert "tool_calls" in _tables(empty_database_url)


def test_models_and_migrations_agree(database_url: str) -> None:
    engine = create_engine(to_sqlalchemy_url(database_url), poolclass=pool.NullPool)
    with engine.connect() as conn:
        diff = compare_metadata(
            MigrationContext.configure(conn, opts={"compare_type": True}), metadata
        )
    engine.dispose()
    assert diff == []


_CALL = (
    "INSERT INTO tool_calls (tool_call_id, tenant, run_id, capability_id, input,"
    " idempotency_key, request_fingerprint, status)"
    " VALUES (%s, %s, 'run-1', 'refund', '{\"n\": 1}', %s, 'fp', 'escalated')"
)
_ROWS = {
    "tool_calls": "tenant, tool_call_id",
    "approvals": "approval_id",
    "escalations": "escalation_id",
    "execution_events": "seq",
}


def _snapshot(url: str) -> dict[str, list[tuple[object, ...]]]:
    with psycopg.connect(url) as conn:
        return {
            table: conn.execute(f"SELECT * FROM {table} ORDER BY {order}").fetchall()
            for table, order in _ROWS.items()
        }


def _head(url: str) -> str:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT version_num FROM alembic_version").fetchone()
    assert row is not None
    return str(row[0])


def test_0007_keys_calls_per_tenant_and_keeps_every_stored_row(empty_database_url: str) -> None:
    url = empty_database_url
    migrate.upgrade(url, "0006")
    with psycopg.connect(url) as conn:
        conn.execute(_CALL, ("x", "acme", "x"))
        conn.execute(
            "INSERT INTO approvals (approval_id, tool_call_id, tenant, run_id, capability_id,"
            " risk, input_hash, policy_version, expires_at)"
            " VALUES ('apr-1', 'x', 'acme', 'run-1', 'refund', 'high', 'fp', 1, now())"
        )
        conn.execute(
            "INSERT INTO escalations (escalation_id, tool_call_id, tenant, episode, reason,"
            " evidence) VALUES ('esc-1', 'x', 'acme', 1, 'lookups failed', '{}')"
        )
        conn.execute(
            "INSERT INTO execution_events (event_id, event_type, tenant, run_id, producer,"
            " tool_call_id, schema_version, occurred_at)"
            " VALUES ('ev-1', 'tool.call.requested', 'acme', 'run-1', 'intake', 'x', 1, now())"
        )
    before = _snapshot(url)

    migrate.upgrade(url, "0007")
    assert _snapshot(url) == before
    with psycopg.connect(url) as conn:
        # Another tenant may now hold the same toolCallId, with its own approval and
        # escalation episode 1; within one tenant the id is still one call.
        conn.execute(_CALL, ("x", "globex", "globex:x"))
        conn.execute(
            "INSERT INTO escalations (escalation_id, tool_call_id, tenant, episode, reason,"
            " evidence) VALUES ('esc-2', 'x', 'globex', 1, 'lookups failed', '{}')"
        )
        conn.commit()
        with pytest.raises(psycopg.errors.UniqueViolation):
            conn.execute(_CALL, ("x", "acme", "k-other"))

    # Down again is refused while two tenants share an id (the old key cannot hold
    # both), and changes nothing; once they do not, it keeps every row.
    shared = _snapshot(url)
    with pytest.raises(Exception, match=r"UniqueViolation|unique"):
        migrate.downgrade(url, "0006")
    assert _head(url) == "0007" and _snapshot(url) == shared
    with psycopg.connect(url) as conn:
        conn.execute("DELETE FROM escalations WHERE tenant = 'globex'")
        conn.execute("DELETE FROM tool_calls WHERE tenant = 'globex'")
    migrate.downgrade(url, "0006")
    assert _head(url) == "0006" and _snapshot(url) == before
