"""run locks: the stop guard as advisory locks, so intake writes no runs row

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30
"""

from __future__ import annotations

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

# The two-int advisory key space keeps these apart from every one-bigint lock; the
# class (b"runs") keeps them apart from any other two-int user. A hash collision
# between two runs only makes them wait for each other's stop.
_KEY = "1920298611, hashtext({tenant} || chr(31) || {run_id})"

# VOLATILE plpgsql: each query inside runs with a fresh READ COMMITTED snapshot, so the
# read that follows the lock sees a stop the lock waited for, although the calling
# statement's own snapshot is older. That is what lets intake guard and insert in one
# statement. Locks are taken in key order, so two batches cannot deadlock behind a stop.
_STOPPED_RUNS_LOCKED = f"""
CREATE FUNCTION stopped_runs_locked(wanted jsonb) RETURNS SETOF runs
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared({_KEY.format(tenant="w.tenant", run_id="w.run_id")})
    FROM (
        SELECT DISTINCT w.tenant, w.run_id
        FROM jsonb_to_recordset(wanted) AS w(tenant text, run_id text)
        ORDER BY 1, 2
    ) AS w;
    RETURN QUERY
        SELECT r.* FROM runs r
        JOIN jsonb_to_recordset(wanted) AS w(tenant text, run_id text)
        ON r.tenant = w.tenant AND r.run_id = w.run_id
        WHERE r.stopped_at IS NOT NULL;
END $$
"""  # noqa: S608 - constant text, no values

_LOCK_RUN_EXCLUSIVE = f"""
CREATE FUNCTION lock_run_exclusive(tenant text, run_id text) RETURNS void
LANGUAGE sql VOLATILE AS $$
    SELECT pg_advisory_xact_lock({_KEY.format(tenant="tenant", run_id="run_id")})
$$
"""


def upgrade() -> None:
    op.execute(_STOPPED_RUNS_LOCKED)
    op.execute(_LOCK_RUN_EXCLUSIVE)


def downgrade() -> None:
    op.execute("DROP FUNCTION lock_run_exclusive(text, text)")
    op.execute("DROP FUNCTION stopped_runs_locked(jsonb)")
