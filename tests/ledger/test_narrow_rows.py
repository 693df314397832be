"""Migration 0016's narrow rows: event types and producers as enum labels, the request
fingerprint as its bytes, the namespaced provider key not stored twice. What each
promises: every label the code writes exists, the release before keeps writing while it
runs beside this one, and downgrade gives back the text it had."""

from __future__ import annotations

import hashlib

import psycopg
import pytest
from psycopg.types.json import Jsonb

from dispatcher.db import migrate
from dispatcher.intake.keys import same_request
from dispatcher.ledger.events import EventType
from dispatcher.ledger.messages import Producer
from dispatcher.tenancy import provider_key

pytestmark = pytest.mark.postgres

_LABELS = "SELECT enumlabel FROM pg_enum WHERE enumtypid = %s::regtype ORDER BY enumsortorder"
_CALL = (
    "INSERT INTO tool_calls (tool_call_id, tenant, run_id, capability_id, input,"
    " idempotency_key, provider_key, request_fingerprint, status)"
    " VALUES (%s, %s, 'run-1', 'refund', '{}', %s, %s, %s, 'completed')"
)
# Tenants whose namespaced form escapes something: the separator, "%", "/", a space,
# letters outside ASCII.
_TENANTS = ("acme", "a:b", "50%/x", "ünï cörn")
_DIGEST = hashlib.sha256(b"request").hexdigest()


def test_every_event_type_and_producer_the_code_writes_is_a_label(database_url: str) -> None:
    with psycopg.connect(database_url) as conn:
        types = [r[0] for r in conn.execute(_LABELS, ("execution_event_type",))]
        producers = [r[0] for r in conn.execute(_LABELS, ("execution_event_producer",))]
    assert set(types) == {t.value for t in EventType}
    assert set(producers) == {p.value for p in Producer}


def test_a_statement_that_types_them_as_text_still_writes_them(database_url: str) -> None:
    # The release before 0016 builds its events as text records (and its fingerprint
    # as hex digits): it keeps running beside this one during a rollout.
    event = {"event_id": "evt_old", "event_type": "tool.call.requested", "tenant": "acme",
             "run_id": "run-old", "producer": "tool-dispatcher.intake", "schema_version": 1,
             "occurred_at": "2026-12-05T00:00:00+00:00"}  # fmt: skip
    with psycopg.connect(database_url) as conn:
        conn.execute(
            "INSERT INTO execution_events (event_id, event_type, tenant, run_id, producer,"
            " schema_version, occurred_at) SELECT event_id, event_type, tenant, run_id,"
            " producer, schema_version, occurred_at::timestamptz FROM jsonb_to_recordset(%s)"
            " AS (event_id text, event_type text, tenant text, run_id text, producer text,"
            " schema_version int, occurred_at text)",
            (Jsonb([event]),),
        )
        conn.execute(
            "INSERT INTO tool_calls SELECT * FROM jsonb_populate_record(NULL::tool_calls, %s)",
            (
                Jsonb(
                    {
                        "tool_call_id": "tc-old",
                        "tenant": "acme",
                        "run_id": "run-old",
                        "capability_id": "refund",
                        "input": {},
                        "idempotency_key": "k-old",
                        "provider_key": "acme:k-old",
                        "request_fingerprint": _DIGEST,
                        "status": "authorized",
                        "verification_status": "not_observed",
                        "reconciliation_status": "not_needed",
                        "dispatch_attempts": 0,
                        "reconcile_attempts": 0,
                        "version": 1,
                        "created_at": "2026-12-05T00:00:00+00:00",
                        "updated_at": "2026-12-05T00:00:00+00:00",
                    }
                ),
            ),
        )
        (kind,) = conn.execute(
            "SELECT event_type FROM execution_events WHERE event_id = 'evt_old'"
        ).fetchone() or (None,)
        (stored,) = conn.execute(
            "SELECT request_fingerprint FROM tool_calls WHERE tool_call_id = 'tc-old'"
        ).fetchone() or (None,)
    assert kind == "tool.call.requested"
    # Its digits landed as text in the bytea column; a replay of it still matches.
    assert stored == _DIGEST.encode() and same_request(stored, _DIGEST)
    assert not same_request(stored, hashlib.sha256(b"other").hexdigest())


def test_0016_narrows_every_row_and_its_downgrade_gives_back_the_text(
    empty_database_url: str,
) -> None:
    url = empty_database_url
    migrate.upgrade(url, "0015")
    with psycopg.connect(url) as conn:
        conn.execute(_CALL, ("tc-hex", "acme", "k-1", "acme:k-1", _DIGEST))
        conn.execute(_CALL, ("tc-text", "acme", "k-2", "k-2", "fp"))
        conn.execute(
            "INSERT INTO execution_events (event_id, event_type, tenant, run_id, producer,"
            " schema_version, occurred_at) VALUES ('evt_1', 'tool.call.requested', 'acme',"
            " 'run-1', 'tool-dispatcher.intake', 1, now())"
        )

    migrate.upgrade(url, "0016")
    with psycopg.connect(url) as conn:
        fingerprints = dict(
            conn.execute("SELECT tool_call_id, request_fingerprint FROM tool_calls").fetchall()
        )
        for i, tenant in enumerate(_TENANTS):
            conn.execute(_CALL, (f"tc-{i}", tenant, f"k:{i}", None, bytes.fromhex(_DIGEST)))
        conn.commit()
        with pytest.raises(psycopg.errors.InvalidTextRepresentation):
            conn.execute(
                "INSERT INTO execution_events (event_id, event_type, tenant, run_id, producer,"
                " schema_version, occurred_at) VALUES ('evt_2', 'no.such.type', 'acme',"
                " 'run-1', 'tool-dispatcher.intake', 1, now())"
            )
    # 64 hex digits became their 32 bytes; anything else kept its text.
    assert fingerprints == {"tc-hex": bytes.fromhex(_DIGEST), "tc-text": b"fp"}

    migrate.downgrade(url, "0015")
    with psycopg.connect(url) as conn:
        calls = dict(
            conn.execute(
                "SELECT tool_call_id, (provider_key, request_fingerprint) FROM tool_calls"
            ).fetchall()
        )
        (kind,) = conn.execute(
            "SELECT pg_typeof(event_type)::text FROM execution_events"
        ).fetchone() or (None,)
    # Every key NULL at 0016 is written out as the namespaced form the provider got.
    assert calls == {
        "tc-hex": ("acme:k-1", _DIGEST),
        "tc-text": ("k-2", "fp"),
        **{f"tc-{i}": (provider_key(t, f"k:{i}"), _DIGEST) for i, t in enumerate(_TENANTS)},
    }
    assert kind == "text"
