"""The CHECK constraints a freshly migrated database really has admit exactly the
values of the status enums, so the migrations and ``dispatcher.states`` cannot drift
apart (``compare_metadata`` does not compare CHECK constraints)."""

from __future__ import annotations

from enum import StrEnum

import psycopg
import pytest

from dispatcher.states import (
    ApprovalStatus,
    CapabilityStatus,
    EscalationStatus,
    ExecutionStatus,
    ReconciliationStatus,
    VerificationStatus,
    WebhookDeliveryStatus,
)

pytestmark = pytest.mark.postgres

STATUS_COLUMNS: dict[tuple[str, str], type[StrEnum]] = {
    ("tool_calls", "status"): ExecutionStatus,
    ("tool_calls", "verification_status"): VerificationStatus,
    ("tool_calls", "reconciliation_status"): ReconciliationStatus,
    ("approvals", "status"): ApprovalStatus,
    ("escalations", "status"): EscalationStatus,
    ("capability_states", "status"): CapabilityStatus,
    ("webhook_deliveries", "status"): WebhookDeliveryStatus,
}
# Every value of every status enum, and a few near misses.
CANDIDATES = sorted(
    {member.value for enum in STATUS_COLUMNS.values() for member in enum}
    | {"", "PENDING", " open", "unknown"}
)


def test_every_status_column_is_checked_here(database_url: str) -> None:
    with psycopg.connect(database_url) as conn:
        found = conn.execute(
            "SELECT table_name, column_name FROM information_schema.columns"
            " WHERE table_schema = 'public'"
            " AND (column_name = 'status' OR column_name LIKE '%\\_status')"
        ).fetchall()
    assert set(found) == set(STATUS_COLUMNS)


@pytest.mark.parametrize(("table", "column"), list(STATUS_COLUMNS), ids="{0[0]}.{0[1]}".format)
def test_the_migrated_check_admits_exactly_the_enum(
    database_url: str, table: str, column: str
) -> None:
    with psycopg.connect(database_url) as conn:
        # The CHECKs on this column alone (the approvals' status also appears in
        # constraints tying it to other columns).
        definitions = [
            row[0]
            for row in conn.execute(
                "SELECT pg_get_constraintdef(c.oid) FROM pg_constraint c"
                " JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = c.conkey[1]"
                " WHERE c.contype = 'c' AND c.conrelid = %s::regclass"
                " AND cardinality(c.conkey) = 1 AND a.attname = %s",
                (table, column),
            )
        ]
        assert definitions, f"no CHECK on {table}.{column}"
        predicate = " AND ".join(d.removeprefix("CHECK ") for d in definitions)
        admitted = {
            row[0]
            for row in conn.execute(
                f"SELECT {column} FROM unnest(%s::text[]) AS candidate({column}) WHERE {predicate}",
                (CANDIDATES,),
            )
        }
    assert admitted == {member.value for member in STATUS_COLUMNS[(table, column)]}
