"""Invariant 9 of a chaos run: what the archive shows the retention job did. Pure: the
archive's rows as :func:`devtools.chaos.retention.archived` reads them back."""

from __future__ import annotations

from typing import Any

from devtools.chaos.evidence import _with_archive
from devtools.chaos.retention import Archived, breaches
from dispatcher.states import ExecutionStatus as S
from tests.unit.test_chaos_units import clean, completed_log, counts


def archived_call(call_id: str, **fields: Any) -> dict[str, Any]:
    row = {
        "tenant": "t",
        "tool_call_id": call_id,
        "run_id": "run-1",
        "status": S.COMPLETED.value,
        "verification_status": "confirmed_success",
        "reconciliation_status": "not_needed",
        "provider_key": f"k-{call_id}",
        "capability_id": "refund",
        "idempotency_key": call_id,
        "input": {},
        "result": None,
        "external_request_id": None,
    }
    return row | fields


def archive_of(call_id: str, **fields: Any) -> Archived:
    """``call_id`` archived whole: the call and the events its completed log holds."""
    events = [
        {**e.model_dump(), "tenant": tenant, "seq": n}
        for n, (tenant, e) in enumerate(completed_log(call_id))
    ]
    return Archived(calls=[archived_call(call_id, **fields)], events=events)


def test_a_finished_call_archived_once_is_no_breach() -> None:
    found = archive_of("b")
    assert breaches(found, {("t", "a")}, completed_log("b") + completed_log("a")) == []


def test_each_wrong_archiving_is_a_breach() -> None:
    twice = archive_of("b")
    twice.calls.append(archived_call("b"))
    assert breaches(twice, set(), []) == ["t/b: archived 2 times"]
    assert breaches(archive_of("b"), {("t", "b")}, []) == ["t/b: archived, and still live"]
    assert breaches(archive_of("b", status="result_unknown"), set(), []) == [
        "t/b: archived while result_unknown"
    ]
    assert breaches(archive_of("b", reconciliation_status="pending"), set(), []) == [
        "t/b: archived while the reconciler still followed it"
    ]
    open_escalation = archive_of("b")
    open_escalation.escalations.append(
        {"tenant": "t", "tool_call_id": "b", "status": "acknowledged", "reason": "r"}
    )
    assert breaches(open_escalation, set(), []) == ["t/b: archived with an escalation open"]
    pending = archive_of("b")
    pending.approvals.append({"tenant": "t", "tool_call_id": "b", "status": "pending"})
    assert breaches(pending, set(), []) == ["t/b: archived with its approval pending"]


def test_a_move_after_archiving_is_a_breach() -> None:
    """An event of an archived call that the archive does not hold was written after."""
    later = completed_log("b")[-1]
    moved = later[1].model_copy(update={"event_id": "b-late", "event_type": "tool.call.x"})
    assert breaches(archive_of("b"), set(), [*completed_log("b"), ("t", moved)]) == [
        "t/b: tool.call.x after it was archived"
    ]
    # Another tenant's call of the same id is not the archived one.
    assert breaches(archive_of("b"), set(), [("u", moved)]) == []


def test_archived_calls_join_the_evidence_and_breaches_violate_9() -> None:
    """The archived call counts as the run's (acknowledged, with its events, its
    effect accounted for); its events, still in the live log too, are taken once."""
    evidence = clean()
    evidence.acknowledged = [("t", "a"), ("t", "b")]
    evidence.effects = {"k-a": 1, "k-b": 1}
    live = [(n, t, e) for n, (t, e) in enumerate(evidence.events, start=100)]
    found = archive_of("b")
    live += [(n, t, e) for n, (t, e) in enumerate(completed_log("b"))]
    evidence.events = [(t, e) for _, t, e in live]
    _with_archive(evidence, live, found, read_only=())
    assert set(evidence.calls) == {("t", "a"), ("t", "b")}
    archived = evidence.calls[("t", "b")]
    assert (archived.status, archived.provider_key, archived.side_effects) == (
        S.COMPLETED,
        "k-b",
        True,
    )
    assert len(evidence.events) == 10
    assert counts(evidence) == {1: 0, 2: 0, 3: 0, 4: 0, 5: 0, 6: 0, 7: 0, 8: 0, 9: 0, 10: 0}

    evidence = clean()
    still_live = archive_of("a")
    _with_archive(evidence, [], still_live, read_only=())
    assert counts(evidence)[9] == 1
