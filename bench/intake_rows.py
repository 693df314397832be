"""The rows one intake call writes, as plain SQL: what the ceilings of ``bench.intake``
write (raw psycopg, psycopg in a caller's session, pgbench) and the call they stand for.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from dispatcher.intake.keys import fingerprint
from dispatcher.tenancy import ordering_key

TENANT = "bench"
CAPABILITY = "send-email"  # no approval, no key template: one call, two events, one command
INPUT = {"to": "customer@example.com", "subject": "Your refund", "orderId": "o-1001"}
TOPIC = "tool-dispatcher.commands"
EVENTS_TOPIC = "tool-dispatcher.events"
PRODUCER = "tool-dispatcher.intake"


# One call writes: the tool_calls row (RETURNING *), two execution_events rows
# (requested, authorized), three outbox rows (both events published on the events
# topic, keyed by the tenant's run, and the dispatch command, keyed by the tenant's
# call) and the count of its run's summary (an upsert of the run_summaries row). The
# ceilings write exactly these rows in the fewest plain statements: one per table.

_CALL_COLUMNS = (
    "tool_call_id, tenant, run_id, turn_id, capability_id, input, idempotency_key, "
    "provider_key, request_fingerprint, status, correlation_id, causation_id, reasoning_object_id"
)
_EVENT_COLUMNS = (
    "event_id, event_type, tenant, run_id, turn_id, producer, reasoning_object_id, "
    "capability_id, correlation_id, causation_id, tool_call_id, schema_version, "
    "occurred_at, payload"
)
SUMMARY_SQL = (
    "INSERT INTO run_summaries AS r (tenant, run_id, authorized) VALUES (%s, %s, 1) "
    "ON CONFLICT (tenant, run_id) DO UPDATE SET authorized = r.authorized + 1, updated_at = now()"
)
PSYCOPG_SQL = (
    f"INSERT INTO tool_calls ({_CALL_COLUMNS}) VALUES "
    "(%s, %s, %s, NULL, %s, %s, %s, %s, %s, 'authorized', NULL, NULL, NULL) "
    "ON CONFLICT DO NOTHING RETURNING *",
    f"INSERT INTO execution_events ({_EVENT_COLUMNS}) VALUES "
    "(%s, 'tool.call.requested', %s, %s, NULL, %s, NULL, %s, NULL, NULL, %s, 1, %s, %s), "
    "(%s, 'tool.call.authorized', %s, %s, NULL, %s, NULL, %s, NULL, %s, %s, 1, %s, %s)",
    "INSERT INTO outbox (topic, key, payload, headers) VALUES "
    "(%s, %s, %s, %s), (%s, %s, %s, %s), (%s, %s, %s, %s)",
    SUMMARY_SQL,
)


def event_message(
    event_id: str, event_type: str, run: str, tc: str, causation: str | None, now: str
) -> tuple[str, str, Jsonb, Jsonb]:
    """Outbox values publishing one event (same fields as dispatcher.ledger.events)."""
    body: dict[str, object] = {
        "eventId": event_id,
        "eventType": event_type,
        "tenant": TENANT,
        "runId": run,
        "turnId": None,
        "producer": PRODUCER,
        "reasoningObjectId": None,
        "capabilityId": CAPABILITY,
        "correlationId": None,
        "causationId": causation,
        "toolCallId": tc,
        "schemaVersion": 1,
        "occurredAt": now,
        "payload": {},
    }
    return (
        EVENTS_TOPIC,
        ordering_key(TENANT, run),
        Jsonb(body),
        Jsonb(_headers(event_id, event_type, now)),
    )


def _headers(message_id: str, ce_type: str, now: str) -> dict[str, str]:
    return {
        "ce_id": message_id,
        "ce_type": ce_type,
        "ce_source": f"/tool-dispatcher/{PRODUCER}",
        "ce_specversion": "1.0",
        "ce_time": now,
    }


def pgbench_script(input_json: str, fp: str) -> str:
    """The same rows as a pgbench script; ids come from a 63-bit random."""
    tc = "(:id)::text"
    req = "'evt_' || (:id)::text || 'r'"
    auth = "'evt_' || (:id)::text || 'a'"
    run = "'run-' || (:client_id)::text"

    def event(event_id: str, event_type: str, causation: str) -> str:
        body = (
            f"jsonb_build_object('eventId', {event_id}, 'eventType', '{event_type}', "
            f"'tenant', '{TENANT}', 'runId', {run}, 'turnId', NULL, 'producer', '{PRODUCER}', "
            f"'reasoningObjectId', NULL, 'capabilityId', '{CAPABILITY}', "
            f"'correlationId', NULL, 'causationId', {causation}, 'toolCallId', {tc}, "
            f"'schemaVersion', 1, 'occurredAt', now()::text, 'payload', '{{}}'::jsonb)"
        )
        return f"('{EVENTS_TOPIC}', '{TENANT}/' || {run}, {body}, {headers(event_id, event_type)})"

    def headers(message_id: str, ce_type: str) -> str:
        return (
            f"jsonb_build_object('ce_id', {message_id}, 'ce_type', '{ce_type}', "
            f"'ce_source', '/tool-dispatcher/{PRODUCER}', 'ce_specversion', '1.0', "
            "'ce_time', now()::text)"
        )

    command = (
        f"jsonb_build_object('toolCallId', {tc}, 'tenant', '{TENANT}', 'runId', {run}, "
        f"'capabilityId', '{CAPABILITY}', 'idempotencyKey', {tc}, 'causationId', {auth})"
    )
    return f"""\\set id random(1, 9000000000000000000)
BEGIN;
INSERT INTO tool_calls ({_CALL_COLUMNS}) VALUES ({tc}, '{TENANT}', {run}, NULL, '{CAPABILITY}',
  '{input_json}'::jsonb, {tc}, NULL, '\\x{fp}', 'authorized', NULL, NULL, NULL)
  ON CONFLICT DO NOTHING RETURNING *;
INSERT INTO execution_events ({_EVENT_COLUMNS}) VALUES
  ({req}, 'tool.call.requested', '{TENANT}', {run}, NULL, '{PRODUCER}', NULL,
   '{CAPABILITY}', NULL, NULL, {tc}, 1, now(),
   jsonb_build_object('requiresApproval', false, 'via', '{{"library": {{}}}}'::jsonb)),
  ({auth}, 'tool.call.authorized', '{TENANT}', {run}, NULL, '{PRODUCER}', NULL,
   '{CAPABILITY}', NULL, {req}, {tc}, 1, now(), '{{"reason": "no approval required"}}'::jsonb);
INSERT INTO outbox (topic, key, payload, headers) VALUES
  {event(req, "tool.call.requested", "NULL")},
  {event(auth, "tool.call.authorized", req)},
  ('{TOPIC}', '{TENANT}/' || {tc}, {command},
   {headers("gen_random_uuid()::text", "tool.call.dispatch")});
{SUMMARY_SQL.replace("%s", "{}").format(f"'{TENANT}'", run)};
COMMIT;
"""


def raw_rows(run: str) -> Callable[[psycopg.AsyncConnection[Any]], Awaitable[None]]:
    """The same rows as intake writes, in raw psycopg, on the connection it is given
    (in the transaction open there)."""
    call_sql, events_sql, outbox_sql, summary_sql = PSYCOPG_SQL
    # As intake stores them: the digest's bytes, no namespaced provider key (NULL).
    digest = bytes.fromhex(fingerprint(CAPABILITY, INPUT))

    async def write(conn: psycopg.AsyncConnection[Any]) -> None:
        tc = str(uuid.uuid4())
        req, auth = f"evt_{uuid.uuid4().hex}", f"evt_{uuid.uuid4().hex}"
        now = datetime.now(UTC)
        iso = now.isoformat()
        command = {
            "toolCallId": tc,
            "tenant": TENANT,
            "runId": run,
            "capabilityId": CAPABILITY,
            "idempotencyKey": tc,
            "causationId": auth,
        }
        cur = await conn.execute(
            call_sql,
            (tc, TENANT, run, CAPABILITY, Jsonb(INPUT), tc, None, digest),
        )
        await cur.fetchone()
        await conn.execute(
            events_sql,
            (
                *(req, TENANT, run, PRODUCER, CAPABILITY, tc, now),
                Jsonb({"requiresApproval": False, "via": {"library": {}}}),
                *(auth, TENANT, run, PRODUCER, CAPABILITY, req, tc, now),
                Jsonb({"reason": "no approval required"}),
            ),
        )
        await conn.execute(
            outbox_sql,
            (
                *event_message(req, "tool.call.requested", run, tc, None, iso),
                *event_message(auth, "tool.call.authorized", run, tc, req, iso),
                *(TOPIC, ordering_key(TENANT, tc), Jsonb(command)),
                Jsonb(_headers(str(uuid.uuid4()), "tool.call.dispatch", iso)),
            ),
        )
        await conn.execute(summary_sql, (TENANT, run))

    return write
