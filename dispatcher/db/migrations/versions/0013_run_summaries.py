"""a summary row per run, kept by the ledger, and the runs counted once to fill it

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-04

A list of runs grouped every call of the tenant by run for every page, and paged by
OFFSET: the first page of a tenant with 2 million calls read all 2 million, and page 50
read them again. ``run_summaries`` holds each run's calls counted by status (one integer
column per status, with the total and ``busy`` generated from them), its first and last
change and its stop; the ledger keeps it in the transaction of every move
(``dispatcher.ledger.summaries``), and a page of runs is a range of one of its indexes.

The upgrade counts the calls already recorded, once, in its own transaction: the calls
as they are when it runs. A process of the previous release that moves a call after
that (both releases run side by side during a rollout) does not count its move; count
again once no old process runs: ``tool-dispatcher runs recount``
(``dispatcher.ledger.summaries.recount``), exact while the service runs.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

# This revision's own copy of the statuses (the code's may grow; this table's columns
# are the ones this revision made).
_STATUSES = (
    "proposed", "authorized", "dispatching", "accepted", "completed", "failed",
    "result_unknown", "confirmed", "compensated", "escalated", "rejected", "cancelled",
)  # fmt: skip
_BUSY = ("authorized", "dispatching", "accepted", "result_unknown")

_COUNTS = ", ".join(_STATUSES)
_COUNTED = ", ".join(f"count(*) FILTER (WHERE c.status = '{s}')" for s in _STATUSES)
# Each run with calls, as its calls show it; then each run stopped before any call was
# recorded, as its stop does (dispatcher.control.runs).
_FILL = f"""
INSERT INTO run_summaries (tenant, run_id, {_COUNTS}, created_at, updated_at, stopped_at)
SELECT c.tenant, c.run_id, {_COUNTED}, min(c.created_at), max(c.updated_at),
    min(r.stopped_at)
FROM tool_calls c
LEFT JOIN runs r ON r.tenant = c.tenant AND r.run_id = c.run_id
GROUP BY c.tenant, c.run_id
"""  # noqa: S608 - constant text
_FILL_STOPPED = """
INSERT INTO run_summaries (tenant, run_id, created_at, updated_at, stopped_at)
SELECT tenant, run_id, stopped_at, stopped_at, stopped_at FROM runs
WHERE stopped_at IS NOT NULL
ON CONFLICT (tenant, run_id) DO NOTHING
"""


def upgrade() -> None:
    op.create_table(
        "run_summaries",
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("run_id", sa.Text(), nullable=False),
        *(sa.Column(s, sa.Integer(), nullable=False, server_default="0") for s in _STATUSES),
        sa.Column(
            "calls",
            sa.Integer(),
            sa.Computed(" + ".join(_STATUSES), persisted=True),
            nullable=False,
        ),
        sa.Column(
            "busy",
            sa.Boolean(),
            sa.Computed(f"{' + '.join(_BUSY)} > 0", persisted=True),
            nullable=False,
        ),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.Column("stopped_at", sa.DateTime(timezone=True)),
        sa.PrimaryKeyConstraint("tenant", "run_id"),
        # Room on each page for a row's next version: a move's update stays a HOT one.
        postgresql_with={"fillfactor": 80},
    )
    op.execute(_FILL)
    op.execute(_FILL_STOPPED)
    op.create_index("ix_run_summaries_recent", "run_summaries", ["tenant", "created_at", "run_id"])
    op.create_index(
        "ix_run_summaries_busy", "run_summaries", ["tenant", "busy", "created_at", "run_id"]
    )
    # Statistics from the start: without them the planner reads a tenant's every run for
    # a page (a bitmap scan and a sort) instead of a range of the index.
    op.execute("ANALYZE run_summaries")


def downgrade() -> None:
    op.drop_table("run_summaries")
