from __future__ import annotations

import pytest

from dispatcher.states import ExecutionStatus as S
from dispatcher.worker.recovery import Recovery, decide


@pytest.mark.parametrize("side_effects", [True, False])
@pytest.mark.parametrize("status", [s for s in S if s is not S.DISPATCHING])
def test_a_recorded_outcome_is_reused(status: S, side_effects: bool) -> None:
    assert decide(status, side_effects) is Recovery.REUSE_RECORDED


def test_no_outcome_and_read_only_runs_again() -> None:
    assert decide(S.DISPATCHING, side_effects=False) is Recovery.REDISPATCH


def test_no_outcome_and_side_effects_is_unknown() -> None:
    assert decide(S.DISPATCHING, side_effects=True) is Recovery.MARK_UNKNOWN
