"""While a capability is paused the reconciler still looks calls up and settles what it
finds, but a re-send or a compensation (both would reach the provider that is down) is
put off until it resumes, and no look counts toward the attempts meanwhile."""

from __future__ import annotations

import pytest

from devtools.registries import capability
from dispatcher.states import ExecutionStatus as S
from reconciler.due import DueCall
from reconciler.rulings import (
    Compensation,
    Escalation,
    Redispatch,
    Retry,
    held_if_paused,
)

REFUND = capability("refund", "http://provider.invalid")
CALL = DueCall(
    "tc-1", "acme", "run-1", "refund", S.RESULT_UNKNOWN, "k", None, 2, 0, 1, 0, False, None
)


@pytest.mark.parametrize(
    "work",
    [Redispatch(CALL, REFUND, {"why": "not found"}), Compensation(CALL, REFUND, None, {})],  # type: ignore[arg-type]
    ids=["redispatch", "compensation"],
)
@pytest.mark.parametrize("scope", ["acme", ""], ids=["its tenant", "every tenant"])
def test_a_resend_or_a_compensation_of_a_paused_capability_is_put_off_uncounted(
    work: Redispatch | Compensation, scope: str
) -> None:
    held = held_if_paused(work, frozenset({("refund", scope)}))
    assert isinstance(held, Retry)
    assert held.counted is False
    assert held.delay_seconds == REFUND.reconcile.max_delay_seconds
    assert held.evidence["heldBy"] == "capability paused"


def test_another_tenants_pause_or_another_capabilitys_holds_nothing() -> None:
    work = Redispatch(CALL, REFUND, {})
    paused = frozenset({("refund", "globex"), ("send", "")})
    assert held_if_paused(work, paused) is work


def test_a_look_that_settled_nothing_is_not_counted_while_paused() -> None:
    look = Retry(CALL, 2.0, {"decision": "retry"}, "provider unreachable")
    held = held_if_paused(look, frozenset({("refund", "")}))
    assert isinstance(held, Retry)
    assert (held.counted, held.delay_seconds, held.error) == (False, 2.0, "provider unreachable")
    assert held_if_paused(look, frozenset()) is look


def test_what_a_lookup_settles_goes_on() -> None:
    escalation = Escalation(CALL, "gave up", {})
    assert held_if_paused(escalation, frozenset({("refund", "")})) is escalation
