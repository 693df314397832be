"""events partitioned by day, the retention manifest and its audit log

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-04

Why: nothing ever left the database but published outbox rows. Retention
(``dispatcher.retention``) archives old terminal calls and removes them; the event log
stays append-only, so its rows are never deleted one by one: ``execution_events`` is
partitioned by RANGE on ``occurred_at``, one partition per UTC day, and retention drops
a whole day once none of its events belongs to a live call or run.

- The keys include the partition key (PostgreSQL requires it): the primary key is
  ``(seq, occurred_at)`` and the event id is unique per ``(event_id, occurred_at)``.
  Event ids are random (``dispatcher.ids``), unique by construction; a plain index on
  ``event_id`` serves the lookups by id (the run events' ``after`` cursor).
- ``seq`` stays one identity over the parent: every insert goes through
  ``execution_events`` and is routed by ``occurred_at``; rows carried across keep
  their ``seq`` and the identity restarts after the highest one ever issued.
- A DEFAULT partition takes an event whose day has no partition yet, so an insert never
  fails; ``execution_events_ensure_partition(day)`` creates a day (moving that day's
  rows out of the default partition first, if any landed there) and is what the
  retention job calls for the days ahead.
- The append-only trigger (migration 0001) is on the parent for UPDATE and DELETE
  (row triggers are cloned onto every partition, present and future) and, for
  TRUNCATE, a statement trigger on the parent and on each partition.

Every existing event is copied across in ``seq`` order, under the table's lock: on a
large log that is a long lock (docs/operations.md says how long, and what to do).

``retention_batches`` is the manifest of archive batches (planned -> written ->
verified -> removed, or abandoned): a crash at any step is resumed from it.
``retention_log`` is the audit of what was removed, per tenant and day. The partial
index on terminal calls' ``updated_at`` is how the job finds what is due without
scanning every call.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

_COLUMNS = """
    seq bigint GENERATED ALWAYS AS IDENTITY,
    event_id text NOT NULL,
    event_type text NOT NULL,
    tenant text NOT NULL,
    run_id text NOT NULL,
    turn_id text,
    producer text NOT NULL,
    reasoning_object_id text,
    capability_id text,
    correlation_id text,
    causation_id text,
    tool_call_id text,
    schema_version integer NOT NULL,
    occurred_at timestamptz NOT NULL,
    payload jsonb NOT NULL DEFAULT '{}'::jsonb"""
_NAMES = (
    "seq, event_id, event_type, tenant, run_id, turn_id, producer, reasoning_object_id,"
    " capability_id, correlation_id, causation_id, tool_call_id, schema_version,"
    " occurred_at, payload"
)
_NO_TRUNCATE = (
    "CREATE TRIGGER execution_events_no_truncate BEFORE TRUNCATE ON {table}"
    " FOR EACH STATEMENT EXECUTE FUNCTION execution_events_append_only()"
)
_NO_UPDATE_DELETE = (
    "CREATE TRIGGER execution_events_no_update_delete BEFORE UPDATE OR DELETE ON {table}"
    " FOR EACH ROW EXECUTE FUNCTION execution_events_append_only()"
)
_INDEXES = (
    "CREATE INDEX ix_execution_events_run ON execution_events (tenant, run_id, seq)",
    "CREATE INDEX ix_execution_events_tool_call ON execution_events (tool_call_id, seq)",
)

# Creates the day's partition unless it exists; true when it made one. Rows of that day
# found in the default partition (the job did not run for longer than it creates days
# ahead) are moved into it: the default partition is swapped for an empty one, the day
# created, the stranded rows inserted again through the parent (keeping their seq) and
# the old default dropped; a DELETE would be refused by the append-only trigger, and a
# partition cannot be created while the default holds rows of its range.
_ENSURE_PARTITION = """
CREATE FUNCTION execution_events_ensure_partition(day date) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    name text := 'execution_events_p' || to_char(day, 'YYYYMMDD');
    low timestamptz := day::timestamp AT TIME ZONE 'UTC';
    high timestamptz := (day + 1)::timestamp AT TIME ZONE 'UTC';
    stranded boolean;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('execution_events_partitions'));
    IF to_regclass(name) IS NOT NULL THEN
        RETURN false;
    END IF;
    SELECT EXISTS (
        SELECT 1 FROM execution_events_default WHERE occurred_at >= low AND occurred_at < high
    ) INTO stranded;
    IF stranded THEN
        ALTER TABLE execution_events DETACH PARTITION execution_events_default;
        ALTER TABLE execution_events_default RENAME TO execution_events_stranded;
        CREATE TABLE execution_events_default PARTITION OF execution_events DEFAULT;
        CREATE TRIGGER execution_events_no_truncate BEFORE TRUNCATE
            ON execution_events_default FOR EACH STATEMENT
            EXECUTE FUNCTION execution_events_append_only();
    END IF;
    EXECUTE format(
        'CREATE TABLE %I PARTITION OF execution_events FOR VALUES FROM (%L) TO (%L)',
        name, low, high
    );
    EXECUTE format(
        'CREATE TRIGGER execution_events_no_truncate BEFORE TRUNCATE ON %I'
        ' FOR EACH STATEMENT EXECUTE FUNCTION execution_events_append_only()',
        name
    );
    IF stranded THEN
        INSERT INTO execution_events OVERRIDING SYSTEM VALUE
            SELECT * FROM execution_events_stranded;
        DROP TABLE execution_events_stranded;
    END IF;
    RETURN true;
END $$;
"""

# The migration's own copy of dispatcher.states.TERMINAL_STATES, sorted as the model
# lists them (dispatcher.db.tables).
_TERMINAL = "'cancelled', 'compensated', 'completed', 'confirmed', 'failed', 'rejected'"


def _restart_identity(table: str, old: str) -> None:
    """``table``'s seq identity restarts after the highest seq ``old`` ever issued
    (its sequence may be ahead of its rows: rolled back inserts)."""
    op.execute(
        f"""
        DO $$
        DECLARE next bigint;
        BEGIN
            SELECT greatest(
                coalesce((SELECT max(seq) FROM {old}), 0),
                coalesce(pg_sequence_last_value(pg_get_serial_sequence('{old}', 'seq')::regclass), 0)
            ) + 1 INTO next;
            EXECUTE format('ALTER TABLE {table} ALTER COLUMN seq RESTART WITH %s', next);
        END $$;
        """  # noqa: S608 - table names of this module only
    )


def _partitioned_events() -> None:
    op.execute("ALTER TABLE execution_events RENAME TO execution_events_unpartitioned")
    for old in ("execution_events_pkey", "execution_events_event_id_key"):
        op.execute(
            f"ALTER TABLE execution_events_unpartitioned RENAME CONSTRAINT {old} TO {old}_old"
        )
    for old in ("ix_execution_events_run", "ix_execution_events_tool_call"):
        op.execute(f"ALTER INDEX {old} RENAME TO {old}_old")
    op.execute(
        f"""CREATE TABLE execution_events ({_COLUMNS},
        CONSTRAINT execution_events_pkey PRIMARY KEY (seq, occurred_at),
        CONSTRAINT uq_execution_events_event_id UNIQUE (event_id, occurred_at)
    ) PARTITION BY RANGE (occurred_at)"""
    )
    for statement in _INDEXES:
        op.execute(statement)
    op.execute("CREATE INDEX ix_execution_events_event_id ON execution_events (event_id)")
    op.execute(_NO_UPDATE_DELETE.format(table="execution_events"))
    op.execute(_NO_TRUNCATE.format(table="execution_events"))
    op.execute("CREATE TABLE execution_events_default PARTITION OF execution_events DEFAULT")
    op.execute(_NO_TRUNCATE.format(table="execution_events_default"))
    op.execute(_ENSURE_PARTITION)
    # Every day the stored events cover, and the week ahead.
    op.execute(
        """
        SELECT execution_events_ensure_partition(day::date) FROM generate_series(
            date_trunc('day', coalesce(
                (SELECT min(occurred_at) FROM execution_events_unpartitioned), now()
            ) AT TIME ZONE 'UTC'),
            date_trunc('day', now() AT TIME ZONE 'UTC') + interval '7 days',
            interval '1 day'
        ) AS day
        """
    )
    op.execute(
        f"INSERT INTO execution_events ({_NAMES}) OVERRIDING SYSTEM VALUE"  # noqa: S608
        f" SELECT {_NAMES} FROM execution_events_unpartitioned ORDER BY seq"
    )
    _restart_identity("execution_events", "execution_events_unpartitioned")
    op.execute("DROP TABLE execution_events_unpartitioned")


def _retention_tables() -> None:
    op.create_table(
        "retention_batches",
        sa.Column("batch_id", sa.Text(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("tenant", sa.Text(), nullable=True),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("members", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column(
            "files",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'[]'::jsonb"),
            nullable=False,
        ),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.PrimaryKeyConstraint("batch_id"),
        sa.CheckConstraint("kind IN ('calls', 'partition')", name="ck_retention_batches_kind"),
        sa.CheckConstraint(
            "state IN ('planned', 'written', 'verified', 'removed', 'abandoned')",
            name="ck_retention_batches_state",
        ),
    )
    op.create_index(
        "ix_retention_batches_unfinished",
        "retention_batches",
        ["created_at"],
        postgresql_where=sa.text("state IN ('planned', 'written', 'verified')"),
    )
    op.create_table(
        "retention_log",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column("batch_id", sa.Text(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("calls", sa.Integer(), server_default="0", nullable=False),
        sa.Column("approvals", sa.Integer(), server_default="0", nullable=False),
        sa.Column("escalations", sa.Integer(), server_default="0", nullable=False),
        sa.Column("events_archived", sa.Integer(), server_default="0", nullable=False),
        sa.Column("events_dropped", sa.Integer(), server_default="0", nullable=False),
        sa.Column(
            "removed_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_retention_log_removed_at", "retention_log", ["removed_at"])
    op.create_index(
        "ix_tool_calls_terminal_since",
        "tool_calls",
        ["tenant", "updated_at"],
        postgresql_where=sa.text(f"status IN ({_TERMINAL})"),
    )


def upgrade() -> None:
    _partitioned_events()
    _retention_tables()


def downgrade() -> None:
    op.drop_index("ix_tool_calls_terminal_since", table_name="tool_calls")
    op.drop_index("ix_retention_log_removed_at", table_name="retention_log")
    op.drop_table("retention_log")
    op.drop_index("ix_retention_batches_unfinished", table_name="retention_batches")
    op.drop_table("retention_batches")
    op.execute(
        f"""CREATE TABLE execution_events_unpartitioned ({_COLUMNS},
        CONSTRAINT execution_events_pkey_new PRIMARY KEY (seq),
        CONSTRAINT execution_events_event_id_key_new UNIQUE (event_id)
    )"""
    )
    op.execute(
        f"INSERT INTO execution_events_unpartitioned ({_NAMES}) OVERRIDING SYSTEM VALUE"  # noqa: S608
        f" SELECT {_NAMES} FROM execution_events ORDER BY seq"
    )
    _restart_identity("execution_events_unpartitioned", "execution_events")
    op.execute("DROP TABLE execution_events")
    op.execute("ALTER TABLE execution_events_unpartitioned RENAME TO execution_events")
    for name in ("execution_events_pkey", "execution_events_event_id_key"):
        op.execute(f"ALTER TABLE execution_events RENAME CONSTRAINT {name}_new TO {name}")
    op.execute("DROP FUNCTION execution_events_ensure_partition(date)")
    for statement in _INDEXES:
        op.execute(statement)
    op.execute(_NO_UPDATE_DELETE.format(table="execution_events"))
    op.execute(_NO_TRUNCATE.format(table="execution_events"))
