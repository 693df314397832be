"""The one way an approval or an escalation changes status (a call's own status moves
only through :mod:`dispatcher.ledger.transitions`).

Each move is checked against its table in :mod:`dispatcher.states` before any SQL
runs, and its UPDATE matches only rows still in the state the caller saw: a row another
transaction moved first is left alone, and matching nothing tells the caller so.
"""

from __future__ import annotations

from sqlalchemy import Update, update

from dispatcher.db.tables import approvals, escalations
from dispatcher.states import (
    ApprovalStatus,
    EscalationStatus,
    check_approval_transition,
    check_escalation_transition,
)


def approval_update(expected: ApprovalStatus, target: ApprovalStatus) -> Update:
    """``UPDATE approvals SET status = target`` of the rows still ``expected``; the
    caller adds which approvals and the other columns."""
    check_approval_transition(expected, target)
    return update(approvals).where(approvals.c.status == expected.value).values(status=target.value)


def escalation_update(expected: EscalationStatus, target: EscalationStatus) -> Update:
    """``UPDATE escalations SET status = target`` of the rows still ``expected``; the
    caller adds which escalation and the other columns."""
    check_escalation_transition(expected, target)
    return (
        update(escalations)
        .where(escalations.c.status == expected.value)
        .values(status=target.value)
    )
