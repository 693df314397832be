"""leaner calls: the event log's indexes narrowed to its reads, the run guard by key

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-04

Every finished call keeps about four events, and their indexes cost more than the
events' rows (``python -m bench.growth``, bench/README.md). What each index held, what
reads it, and what is kept:

- ``uq_execution_events_event_id (event_id, occurred_at)`` and
  ``ix_execution_events_event_id (event_id)``: the same random 36-character key twice
  per event, about 160 bytes. The one read by event id is the run events' ``after``
  cursor, which names the run too: the run's own index finds it among the run's
  events. The id is unique by construction (128 random bits, ``dispatcher.ids``); the
  constraint held it unique per instant only, which no reader relies on. Both go.
- ``execution_events_pkey (seq, occurred_at)``: about 30 bytes an event. No read looks an
  event up by ``seq`` (the log is read by run or by call, then in ``seq`` order), ``seq``
  is unique by its identity (``GENERATED ALWAYS``), which a key of ``(seq,
  occurred_at)`` could not hold anyway (the same ``seq`` at another instant passes), and
  the log is append-only (its triggers), so logical replication needs no replica
  identity for it. It goes.
- ``ix_execution_events_run (tenant, run_id, seq)`` becomes ``(tenant, run_id)``: every
  read of a run's events reads the run (the run view folds all of them; a page of the
  log and the cursor filter and sort the run's events). Without ``seq`` every entry of a
  run carries the same key, which B-tree deduplication stores once per page with the
  rows' addresses: about 10 bytes an event instead of about 80.
- ``ix_execution_events_tool_call (tool_call_id, seq)`` becomes ``(tool_call_id)``,
  deduplicated the same way (a call's handful of events sort themselves): a call's
  events, an escalation's evidence, retention's batch of calls.
- ``ix_tool_calls_run (tenant, run_id, created_at)`` becomes ``(tenant, run_id)``: the
  stop command's cancel, retention's check of a run's calls and the runs list group or
  filter by run and never read the calls in ``created_at`` order.

The run guard (``stopped_runs_locked``, migration 0005) read the stopped runs by joining
its JSON argument to ``runs``: the planner, expecting a hundred wanted runs, hashed them
and read every stopped run, on every intake statement (69 pages, about 1 ms, behind
6,000 stopped runs). It now names the wanted runs' tenants and ids as arrays on the
primary key's columns, index conditions whatever the statistics say (as
``dispatcher.ledger.transitions.keys_of`` does), and keeps the exact pairs; its locks
and snapshots are as before.

The other primary keys, ``uq_tool_calls_tenant_idempotency_key`` (the exactly-once
key), the other unique constraints and the partial indexes of the live set stay as they
are. The events also carry less in this release (no column changes): ``tool.call.requested``
no longer repeats the call's idempotency key, and a worker's outcome leaves out the
answer's fields that have no value (``docs/events``).

Each index is built anew: on a large log that is a long build, under a lock that holds
writes to ``execution_events`` (docs/operations.md). Downgrade builds the old ones back.
"""

from __future__ import annotations

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


# migration 0005's lock key, frozen here.
_KEY = "1920298611, hashtext(w.tenant || chr(31) || w.run_id)"
_WANTED = "jsonb_to_recordset(wanted) AS w(tenant text, run_id text)"
_LOCKED = f"""
    PERFORM pg_advisory_xact_lock_shared({_KEY})
    FROM (SELECT DISTINCT w.tenant, w.run_id FROM {_WANTED} ORDER BY 1, 2) AS w;"""  # noqa: S608
# VOLATILE plpgsql: each query inside runs with a fresh snapshot (migration 0005).
_GUARD = """
CREATE OR REPLACE FUNCTION stopped_runs_locked(wanted jsonb) RETURNS SETOF runs
LANGUAGE plpgsql VOLATILE AS $$
{declare}BEGIN{locked}
{read}
END $$
"""
_BY_KEY = f"""    SELECT array_agg(w.tenant), array_agg(w.run_id) INTO tenants, run_ids FROM {_WANTED};
    RETURN QUERY
        SELECT r.* FROM runs r
        WHERE r.tenant = ANY (tenants) AND r.run_id = ANY (run_ids)
          AND EXISTS (SELECT 1 FROM unnest(tenants, run_ids) AS k(tenant, run_id)
                      WHERE k.tenant = r.tenant AND k.run_id = r.run_id)
          AND r.stopped_at IS NOT NULL;"""  # noqa: S608 - constant text
_JOINED = f"""    RETURN QUERY
        SELECT r.* FROM runs r
        JOIN {_WANTED}
        ON r.tenant = w.tenant AND r.run_id = w.run_id
        WHERE r.stopped_at IS NOT NULL;"""  # noqa: S608 - constant text


def upgrade() -> None:
    op.execute(
        _GUARD.format(
            declare="DECLARE\n    tenants text[];\n    run_ids text[];\n",
            locked=_LOCKED,
            read=_BY_KEY,
        )
    )
    op.execute("ALTER TABLE execution_events DROP CONSTRAINT uq_execution_events_event_id")
    op.execute("DROP INDEX ix_execution_events_event_id")
    op.execute("ALTER TABLE execution_events DROP CONSTRAINT execution_events_pkey")
    for name, table, columns in _NARROWED:
        op.execute(f"DROP INDEX {name}")
        op.execute(f"CREATE INDEX {name} ON {table} ({columns})")


def downgrade() -> None:
    op.execute(_GUARD.format(declare="", locked=_LOCKED, read=_JOINED))
    for name, table, columns in _WIDE:
        op.execute(f"DROP INDEX {name}")
        op.execute(f"CREATE INDEX {name} ON {table} ({columns})")
    op.execute(
        "ALTER TABLE execution_events ADD CONSTRAINT execution_events_pkey"
        " PRIMARY KEY (seq, occurred_at)"
    )
    op.execute("CREATE INDEX ix_execution_events_event_id ON execution_events (event_id)")
    op.execute(
        "ALTER TABLE execution_events"
        " ADD CONSTRAINT uq_execution_events_event_id UNIQUE (event_id, occurred_at)"
    )


_NARROWED = (
    ("ix_execution_events_run", "execution_events", "tenant, run_id"),
    ("ix_execution_events_tool_call", "execution_events", "tool_call_id"),
    ("ix_tool_calls_run", "tool_calls", "tenant, run_id"),
)
_WIDE = (
    ("ix_execution_events_run", "execution_events", "tenant, run_id, seq"),
    ("ix_execution_events_tool_call", "execution_events", "tool_call_id, seq"),
    ("ix_tool_calls_run", "tool_calls", "tenant, run_id, created_at"),
)
