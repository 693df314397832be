"""the run guard keeps one plan per session

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-06

``stopped_runs_locked`` (migration 0005, its read rewritten by 0015) runs in every
intake statement. Its read takes the batch's tenants and runs as arrays; with them
known, PostgreSQL's estimate of each custom plan stays below the generic plan's, so it
planned that read again on every call: about 120 µs of the server's CPU per
submission, a sixth of what the intake costs it (python -m bench.intake,
``library-psycopg``: 710 -> 590 µs per call). The generic plan is the same index scan
of ``runs_pkey`` whatever the arrays hold, behind 300,000 runs as on an empty table.

A setting of the function, not of the caller's session: it applies while the function
runs and is restored when it returns, so a caller's own statements keep their plans.
"""

from __future__ import annotations

from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER FUNCTION stopped_runs_locked(jsonb) SET plan_cache_mode = force_generic_plan")


def downgrade() -> None:
    op.execute("ALTER FUNCTION stopped_runs_locked(jsonb) RESET plan_cache_mode")
