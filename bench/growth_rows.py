"""The rows of one chunk of generated calls, as SQL over the temporary tables
``gen_calls`` (one row per call: alias ``c``, or ``o`` where a subquery needs ``c``)
and ``gen_steps`` (alias ``s``): each table's columns by name, so that
``bench.growth_fill`` writes only those the migrated schema has.
"""

from __future__ import annotations

from bench.growth_paths import CAUSED, COMMANDS, PAYLOADS, iso
from dispatcher.ledger.events import envelope_sql, published_sql
from dispatcher.states import ExecutionStatus
from dispatcher.tenancy import ordering_key_sql

OUTBOX_WINDOW_HOURS = 24
"""Published outbox rows are purged after a day (``outbox_relay.retention``)."""

_CAPABILITY = """CASE WHEN p.approval IS NOT NULL THEN 'refund-order-approved'
    WHEN n * 7919 % 100 < 45 THEN 'refund-order-v2'
    WHEN n * 7919 % 100 < 80 THEN 'send-email' ELSE 'lookup-order' END"""

# One row per call of the chunk: everything its rows are made of.
CALLS = f"""
CREATE TEMP TABLE gen_calls AS
SELECT n, p.*, k.*, i.*,
    CASE WHEN k.capability_id = 'refund-order-v2'
         THEN 'refund:ord-' || n || ':' || i.correlation_id
         ELSE k.tenant || ':' || k.tool_call_id END AS idempotency_key
FROM generate_series(%(lo)s::bigint, %(hi)s::bigint) AS n
JOIN gen_paths p ON p.live = %(live)s
    AND (CASE WHEN %(live)s THEN n - %(base)s - 1 ELSE n * 761 % 1000 END) BETWEEN p.lo AND p.hi
CROSS JOIN LATERAL (
    -- History: a run's calls one after another, runs dealt to tenants in turn. Live: the
    -- calls dealt to tenants in turn, so that each tenant has some of every live path.
    SELECT CASE WHEN %(live)s THEN (n - 1) % %(tenants)s
                ELSE (n - 1) / %(per_run)s % %(tenants)s END AS tenant,
        CASE WHEN %(live)s THEN (n - 1) / %(tenants)s / %(per_run)s
             ELSE (n - 1) / %(per_run)s / %(tenants)s END AS run
) AS r
CROSS JOIN LATERAL (
    SELECT 'tenant-' || lpad(r.tenant::text, 2, '0') AS tenant,
        'run-' || lpad(r.run::text, 6, '0') AS run_id,
        'turn-' || ((n - 1) % %(per_run)s + 1) AS turn_id,
        md5('call:' || n)::uuid::text AS tool_call_id,
        {_CAPABILITY} AS capability_id,
        CASE WHEN %(live)s THEN %(anchor)s::timestamptz - interval '30 minutes'
                 + (n - %(base)s) * interval '1 second'
             ELSE %(anchor)s::timestamptz - %(days)s * interval '1 day'
                 + (n - 1) * (%(days)s * 86400 - 900) / %(calls)s * interval '1 second'
        END AS created_at
) AS k
CROSS JOIN LATERAL (
    SELECT CASE WHEN k.capability_id LIKE 'refund%' THEN md5('corr:' || n)::uuid::text
           END AS correlation_id,
        'req_' || left(md5('ext:' || n), 24) AS ext_id,
        'worker:td-worker-6f8d9c7b5-' || left(md5('pod:' || n / 50000), 5) || ':1:'
            || left(md5('run:' || n / 50000), 6) AS worker,
        CASE WHEN p.approval IS NULL THEN 2 ELSE 3 END AS claim_version,
        CASE p.outcome WHEN 'fail' THEN 422 WHEN 'none' THEN NULL
             ELSE CASE WHEN p.accepted IS NULL OR p.status = 'completed' THEN 200 ELSE 202 END
        END AS http_status,
        CASE WHEN p.outcome = 'none' THEN 3 ELSE 1 END AS attempts,
        CASE WHEN p.outcome = 'fail'
             THEN 'provider reports failure: {{''code'': ''card_declined'', ''message'': '
                  || '''the card was declined; nothing was applied''}}'
             ELSE 'no answer after 3 attempts: ReadTimeout' END AS error,
        'apr_' || md5('apr:' || n) AS approval_id,
        'esc_' || md5('esc:' || n) AS escalation_id,
        'reviewer-' || n % 12 AS decider,
        p.approval IS NOT NULL AS needs_approval,
        CASE k.capability_id
            WHEN 'send-email' THEN jsonb_build_object('to', 'customer-' || n || '@example.com',
                'template', 'refund-confirmation', 'orderId', 'ord-' || n)
            WHEN 'lookup-order' THEN jsonb_build_object('orderId', 'ord-' || n)
            ELSE jsonb_build_object('orderId', 'ord-' || n, 'amount', 1000 + n % 90000,
                'currency', 'EUR', 'reason', (ARRAY['damaged item', 'late delivery',
                'wrong size', 'duplicate charge'])[1 + n % 4])
        END AS input
) AS i
"""


def call_columns(*, stores_namespaced_keys: bool = True) -> dict[str, str]:
    """``tool_calls`` column -> SQL over ``c`` (a ``gen_calls`` row). From migration
    0016 on, a namespaced provider key is not stored (NULL: intake's ``key_to_store``)."""
    done = "c.created_at + c.finished * interval '1 ms'"
    return {
        "tool_call_id": "c.tool_call_id",
        "tenant": "c.tenant",
        "run_id": "c.run_id",
        "turn_id": "c.turn_id",
        "capability_id": "c.capability_id",
        "input": "c.input",
        "idempotency_key": "c.idempotency_key",
        "provider_key": "c.tenant || ':' || c.idempotency_key"
        if stores_namespaced_keys
        else "NULL",
        "request_fingerprint": "md5('fp:' || c.n) || md5('fp2:' || c.n)",
        "status": "c.status",
        "verification_status": "c.verification",
        "reconciliation_status": "c.reconciliation",
        "external_request_id": "CASE WHEN c.outcome <> 'none' THEN c.ext_id END",
        "correlation_id": "c.correlation_id",
        "tool_name": "replace(split_part(c.capability_id, '-', 1) || '_'"
        " || split_part(c.capability_id, '-', 2), '-', '_')",
        "dispatched_at": "c.created_at + c.dispatched * interval '1 ms'",
        "accepted_at": "c.created_at + c.accepted * interval '1 ms'",
        "completed_at": done,
        "result": """CASE WHEN c.outcome = 'fail' THEN jsonb_build_object('code', 'card_declined',
                'message', 'the card was declined')
            WHEN c.outcome = 'ok' AND c.status IN ('completed', 'confirmed') THEN
            CASE c.capability_id
                WHEN 'send-email' THEN jsonb_build_object('messageId',
                    '<' || md5('msg:' || c.n) || '@mail.example.com>', 'status', 'queued')
                WHEN 'lookup-order' THEN jsonb_build_object('orderId', 'ord-' || c.n,
                    'status', 'shipped', 'items', 1 + c.n % 5)
                ELSE jsonb_build_object('id', c.ext_id, 'status', 'succeeded',
                    'amount', 1000 + c.n % 90000, 'currency', 'EUR') END END""",
        "last_error": "CASE WHEN c.outcome = 'fail' OR c.status IN ('result_unknown',"
        " 'escalated') THEN c.error END",
        "dispatch_attempts": "CASE WHEN c.dispatched IS NULL THEN 0 ELSE 1 END",
        "reconcile_attempts": "CASE WHEN c.escalation IS NOT NULL THEN 10"
        " WHEN c.reconciliation = 'settled' THEN 2 ELSE 0 END",
        "next_reconcile_at": "CASE WHEN c.reconciliation = 'pending'"
        " THEN %(anchor)s::timestamptz + interval '1 hour' END",
        "lease_owner": "CASE WHEN c.status = 'dispatching' THEN c.worker END",
        "lease_expires_at": "CASE WHEN c.status = 'dispatching'"
        " THEN %(anchor)s::timestamptz + interval '1 hour' END",
        "version": "c.steps",
        "created_at": "c.created_at",
        "updated_at": "coalesce(" + done + ", c.created_at + (SELECT max(after_ms) FROM gen_steps"
        " g WHERE g.path = c.path) * interval '1 ms')",
    }


EVENTS = f"""SELECT c.tenant, c.run_id, c.idempotency_key AS idem, s.kind, t.at,
    {iso("t.at")} AS occurred,
    'evt_' || md5(c.tool_call_id || ':' || s.step) AS event_id, s.event_type, s.producer,
    CASE WHEN s.kind <> 'run_stopped' THEN c.turn_id END AS turn_id,
    NULL::text AS reasoning_object_id,
    CASE WHEN s.kind <> 'run_stopped' THEN c.capability_id END AS capability_id,
    CASE WHEN s.kind <> 'run_stopped' THEN c.correlation_id END AS correlation_id,
    CASE WHEN s.kind IN ({", ".join(f"'{k}'" for k in CAUSED)})
         THEN 'evt_' || md5(c.tool_call_id || ':' || (s.step - 1)) END AS causation_id,
    CASE WHEN s.kind <> 'run_stopped' THEN c.tool_call_id END AS tool_call_id,
    1 AS schema_version, t.at AS occurred_at,
    CASE s.kind {" ".join(f"WHEN '{k}' THEN {v}" for k, v in PAYLOADS.items())} END AS payload
FROM gen_calls c JOIN gen_steps s ON s.path = c.path
CROSS JOIN LATERAL (SELECT c.created_at + s.after_ms * interval '1 ms'
    + s.step * interval '1 microsecond' AS at) AS t"""


def outbox_sql() -> str:
    """The outbox rows of the chunk's last day, in time order: each published event's
    message (:func:`dispatcher.ledger.events.published_sql`), each dispatch command,
    each escalation's messages; published 4 ms after they were written, as the relay
    leaves them, but for the live calls' waiting commands."""
    payload, headers = envelope_sql("e", "e.occurred")
    key = ordering_key_sql("e.tenant", "e.run_id")
    command_key = ordering_key_sql("e.tenant", "e.tool_call_id")
    kinds = ", ".join(f"'{k}'" for k in COMMANDS)
    return f"""
INSERT INTO outbox (topic, key, payload, headers, created_at, published_at)
SELECT topic, key, payload, headers, at,
    CASE WHEN waiting THEN NULL ELSE at + interval '4 ms' END
FROM (
    SELECT 'tool-dispatcher.events' AS topic, {key} AS key, {payload} AS payload,
        {headers} AS headers, e.at, 0 AS part, false AS waiting
    FROM ({EVENTS}) AS e
    WHERE {published_sql("e")}
    UNION ALL
    SELECT 'tool-dispatcher.commands', {command_key},
        jsonb_build_object('toolCallId', e.tool_call_id, 'tenant', e.tenant, 'runId', e.run_id,
            'capabilityId', e.capability_id, 'idempotencyKey', e.idem, 'causationId', e.event_id),
        jsonb_build_object('ce_id', md5('cmd:' || e.event_id)::uuid::text,
            'ce_type', 'tool.call.dispatch', 'ce_source', '/tool-dispatcher/' || e.producer,
            'ce_specversion', '1.0', 'ce_time', e.occurred),
        e.at, 1, e.kind = 'authorized' AND x.status = 'authorized'
    FROM ({EVENTS}) AS e
    JOIN tool_calls x ON x.tenant = e.tenant AND x.tool_call_id = e.tool_call_id
    WHERE e.kind IN ({kinds})
    UNION ALL
    SELECT 'tool-dispatcher.escalations', {command_key}, jsonb_build_object(
            'escalationId', v.escalation_id, 'toolCallId', v.tool_call_id, 'tenant', v.tenant,
            'episode', v.episode, 'status', v.status, 'reason', v.reason,
            'evidence', v.evidence, 'createdAt', {iso("v.created_at")},
            'acknowledgedAt', {iso("v.acknowledged_at")}, 'acknowledgedBy', v.acknowledged_by,
            'resolvedAt', {iso("v.resolved_at")}, 'resolvedBy', v.resolved_by,
            'finding', v.finding, 'resolutionReason', v.resolution_reason),
        jsonb_build_object('ce_id', v.escalation_id || m.suffix, 'ce_type', m.type,
            'ce_source', '/tool-dispatcher/' || e.producer, 'ce_specversion', '1.0'),
        e.at, 2, false
    FROM ({EVENTS}) AS e
    JOIN escalations v ON v.tenant = e.tenant AND v.tool_call_id = e.tool_call_id
    CROSS JOIN LATERAL (SELECT CASE e.kind WHEN 'escalated' THEN '' ELSE ':resolved' END
        AS suffix, CASE e.kind WHEN 'escalated' THEN 'tool.call.escalation.opened'
        ELSE 'tool.call.escalation.resolved' END AS type) AS m
    WHERE e.kind IN ('escalated', 'resolved')
) AS m
WHERE at >= %(anchor)s::timestamptz - interval '{OUTBOX_WINDOW_HOURS} hours'
ORDER BY at, part"""


APPROVALS = {
    "approval_id": "c.approval_id",
    "tool_call_id": "c.tool_call_id",
    "tenant": "c.tenant",
    "run_id": "c.run_id",
    "capability_id": "c.capability_id",
    "risk": "'high'",
    "input_hash": "md5('fp:' || c.n) || md5('fp2:' || c.n)",
    "policy_version": "1",
    "requested_by": "'agent-key-' || c.tenant",
    "status": "c.approval",
    "expires_at": "CASE WHEN c.live THEN %(anchor)s::timestamptz + interval '1 hour'"
    " ELSE c.created_at + interval '1 hour' END",
    "created_at": "c.created_at",
    "closed_at": "CASE WHEN c.approval <> 'pending' THEN c.created_at"
    " + (SELECT max(after_ms) FROM gen_steps g WHERE g.path = c.path) * interval '1 ms' END",
    "decision": "CASE c.approval WHEN 'approved' THEN 'approve' WHEN 'rejected' THEN 'reject' END",
    "decided_by": "CASE WHEN c.approval IN ('approved', 'rejected') THEN c.decider END",
    "decision_reason": "CASE c.approval WHEN 'approved' THEN 'checked the order'"
    " WHEN 'rejected' THEN 'amount too high' END",
}

# The dossier an on-call engineer gets (dispatcher.control.escalations._evidence): the
# call, the last answer, how to look it up, its history, the commands that settle it.
_EVIDENCE = f"""jsonb_build_object(
    'call', jsonb_build_object('toolCallId', o.tool_call_id, 'tenant', o.tenant,
        'runId', o.run_id, 'capabilityId', o.capability_id,
        'idempotencyKey', o.idempotency_key, 'providerKey', o.tenant || ':' || o.idempotency_key,
        'externalRequestId', NULL, 'input', o.input, 'dispatchAttempts', 1,
        'reconcileAttempts', 10, 'dispatchedAt', {iso("o.created_at")},
        'createdAt', {iso("o.created_at")}, 'compensationRequestedAt', NULL),
    'lastError', o.error,
    'lastAnswer', jsonb_build_object('via', 'idempotencyKey', 'httpStatus', 503,
        'observation', 'no_answer', 'error', 'HTTP 503', 'reversed', false),
    'providerLookup', jsonb_build_array('GET https://payments.example.com/v1/refunds?'
        || 'idempotencyKey=' || o.tenant || ':' || o.idempotency_key),
    'history', (SELECT jsonb_agg(jsonb_build_object('eventType', e.event_type,
        'occurredAt', e.occurred, 'producer', e.producer, 'payload', e.payload) ORDER BY e.at)
        FROM ({EVENTS} WHERE c.n = o.n
        AND s.kind NOT IN ('escalated', 'escalation_acknowledged', 'resolved')) AS e),
    'commands', jsonb_build_object(
        'cli', jsonb_build_array('tool-dispatcher escalations ack ' || o.escalation_id,
            'tool-dispatcher escalations resolve ' || o.escalation_id
                || ' --finding confirmed_success --reason "<what you found>"',
            'tool-dispatcher escalations resolve ' || o.escalation_id
                || ' --finding confirmed_failure --reason "<what you found>"',
            'tool-dispatcher escalations resolve ' || o.escalation_id
                || ' --finding compensated --reason "<what you found>"'),
        'http', jsonb_build_array('POST /v1/escalations/' || o.escalation_id || '/acknowledge',
            'POST /v1/escalations/' || o.escalation_id || '/resolve '
                || '{{"finding": "confirmed_success", "reason": "<what you found>"}}',
            'POST /v1/escalations/' || o.escalation_id || '/resolve '
                || '{{"finding": "confirmed_failure", "reason": "<what you found>"}}',
            'POST /v1/escalations/' || o.escalation_id || '/resolve '
                || '{{"finding": "compensated", "reason": "<what you found>"}}')))"""

_AT = "o.created_at + (SELECT after_ms FROM gen_steps g WHERE g.path = o.path AND g.kind = '{}')"
ESCALATIONS = {
    "escalation_id": "o.escalation_id",
    "tool_call_id": "o.tool_call_id",
    "tenant": "o.tenant",
    "episode": "1",
    "status": "o.escalation",
    "reason": "'no definitive answer after 10 lookups'",
    "evidence": _EVIDENCE,
    "created_at": _AT.format("escalated") + " * interval '1 ms'",
    "acknowledged_at": _AT.format("escalation_acknowledged") + " * interval '1 ms'",
    "acknowledged_by": "CASE WHEN o.escalation <> 'open' THEN o.decider END",
    "resolved_at": _AT.format("resolved") + " * interval '1 ms'",
    "resolved_by": "CASE WHEN o.escalation = 'resolved' THEN o.decider END",
    "finding": "CASE WHEN o.escalation = 'resolved' THEN 'confirmed_success' END",
    "resolution_reason": "CASE WHEN o.escalation = 'resolved'"
    " THEN 'the provider dashboard shows the refund' END",
}

RUNS = {
    "tenant": "c.tenant",
    "run_id": "c.run_id",
    "created_at": "c.created_at",
    "stopped_at": "c.created_at + interval '2 seconds'",
    "stopped_by": "c.decider",
    "reason": "'abort'",
}


def summaries(columns: dict[str, str]) -> dict[str, str]:
    """``run_summaries`` (migration 0013) as the ledger keeps it: each run's calls counted
    by status, over ``tool_calls c`` grouped by run and joined to its stop ``r``. Only
    the count columns the table has (``columns``, its column types) are counted."""
    counts = {
        s.value: f"count(*) FILTER (WHERE c.status = '{s.value}')"
        for s in ExecutionStatus
        if s.value in columns
    }
    return {
        "tenant": "c.tenant",
        "run_id": "c.run_id",
        **counts,
        "created_at": "min(c.created_at)",
        "updated_at": "max(c.updated_at)",
        "stopped_at": "min(r.stopped_at)",
    }


SUMMARIES_SOURCE = (
    "FROM tool_calls c LEFT JOIN runs r ON r.tenant = c.tenant AND r.run_id = c.run_id"
    " GROUP BY c.tenant, c.run_id"
)
