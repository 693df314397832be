from __future__ import annotations

import psycopg
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from psycopg.types.json import Jsonb
from sqlalchemy import create_engine, pool

from devtools.databases import unique_name
from dispatcher.db import migrate
from dispatcher.db.tables import PARTITIONS, metadata
from dispatcher.settings import to_sqlalchemy_url
from dispatcher.tenancy import ordering_key
from outbox_relay import run_once
from tests.fixtures.relay import TopicReader, assert_key_order, insert, message, relay_config

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


def _not_a_partition(name: str | None, kind: str, parents: object) -> bool:
    """The days of ``execution_events`` are tables of the schema, not of the models."""
    return not (kind == "table" and name is not None and PARTITIONS.fullmatch(name))


def test_models_and_migrations_agree(database_url: str) -> None:
    engine = create_engine(to_sqlalchemy_url(database_url), poolclass=pool.NullPool)
    with engine.connect() as conn:
        diff = compare_metadata(
            MigrationContext.configure(
                conn, opts={"compare_type": True, "include_name": _not_a_partition}
            ),
            metadata,
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


# Rows as a service of revision 0008 left them: keyed by the bare run or call id, the
# tenant in the payload; some published, some not, two tenants sharing a key.
_TENANTS = ("acme", "globex", "a/b")


def _legacy_outbox(url: str, topic: str) -> list[tuple[str, str, int]]:
    """(tenant, bare key, seq) of each row written, in id order."""
    written = []
    with psycopg.connect(url) as conn:
        for seq in range(12):
            tenant, key = _TENANTS[seq % 3], ("run-1", "tc-1")[seq % 2]
            published = "now()" if seq < 4 else "NULL"
            conn.execute(
                "INSERT INTO outbox (topic, key, payload, headers, published_at)"
                f' VALUES (%s, %s, %s, \'{{"ce_id": "m{seq}"}}\', {published})',
                (topic, key, Jsonb({"tenant": tenant, "key": key, "seq": seq})),
            )
            written.append((tenant, key, seq))
        conn.execute(_CALL, ("x", "acme", "k-legacy"))
    return written


async def test_0009_keys_every_outbox_row_by_tenant_and_keeps_each_keys_order(
    empty_database_url: str, kafka_bootstrap: str
) -> None:
    url, topic = empty_database_url, unique_name("migration-0009")
    migrate.upgrade(url, "0008")
    written = _legacy_outbox(url, topic)

    migrate.upgrade(url, "0009")

    with psycopg.connect(url) as conn:
        keys = conn.execute("SELECT key, payload FROM outbox ORDER BY id").fetchall()
        stored = conn.execute("SELECT idempotency_key, provider_key FROM tool_calls").fetchall()
    assert [k for k, _ in keys] == [ordering_key(t, k) for t, k, _ in written]
    # A call recorded before the upgrade keeps the key the provider already knows.
    assert stored == [("k-legacy", "k-legacy")]
    # Rows written after the upgrade, under the new keys, queue behind the old ones.
    later = [(t, k, 100 + i) for i, (t, k) in enumerate([("acme", "run-1"), ("a/b", "tc-1")])]
    await insert(
        url,
        [
            {**message(topic, ordering_key(t, k), seq), "payload": {"tenant": t, "seq": seq}}
            for t, k, seq in later
        ],
    )
    for _ in range(5):
        await run_once(relay_config(url, kafka_bootstrap))
    async with TopicReader(kafka_bootstrap, topic) as reader:
        got = await reader.distinct(8 + len(later), within=20)
    # Nothing unpublished was lost; within each new key, rows arrive in id order.
    unpublished = [(t, k, s) for t, k, s in written if s >= 4] + later
    assert sorted((m.key, m.seq) for m in got) == sorted(
        (ordering_key(t, k), s) for t, k, s in unpublished
    )
    assert_key_order(got)

    migrate.downgrade(url, "0008")
    with psycopg.connect(url) as conn:
        back = conn.execute("SELECT key FROM outbox WHERE id <= 12 ORDER BY id").fetchall()
    assert [k for (k,) in back] == [k for _, k, _ in written]
