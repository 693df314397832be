"""A bulk operation's percentage: 100 when it is completed and never before, so the
console's bar and its state never disagree."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from dispatcher.operations.models import OperationKind, OperationView
from dispatcher.states import OperationState


def view(state: OperationState, total: int, done: int, failed: int = 0) -> OperationView:
    now = datetime.now(UTC)
    return OperationView(
        operation_id="op_1", tenant="acme", kind=OperationKind.RETRY, state=state, filter={},
        params={}, actor={}, total=total, done=done, failed=failed, created_at=now,
        updated_at=now, finished_at=None, cancelled_by=None,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("state", "total", "done", "failed", "percent"),
    [
        (OperationState.RUNNING, 120, 0, 0, 0),
        (OperationState.RUNNING, 120, 60, 0, 50),
        (OperationState.RUNNING, 120, 100, 20, 99),  # every call touched, not completed
        (OperationState.RUNNING, 0, 0, 0, 0),
        (OperationState.CANCELLED, 120, 120, 0, 99),
        (OperationState.COMPLETED, 120, 119, 1, 100),
        (OperationState.COMPLETED, 0, 0, 0, 100),
    ],
)
def test_the_percentage_is_100_only_once_completed(
    state: OperationState, total: int, done: int, failed: int, percent: int
) -> None:
    assert view(state, total, done, failed).percent == percent
