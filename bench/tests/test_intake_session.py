"""The intake benchmark's session ceiling (bench.intake_session) replays submit()'s
statements with fresh ids: every id of the capture gets one new id per call, the same
wherever it appears, and nothing else changes."""

from __future__ import annotations

import uuid

from bench.intake_session import Statement, _copy, _Refresher

CALL = str(uuid.uuid4())
EVENT = uuid.uuid4().hex
FINGERPRINT = "ab" * 32
AT = "2026-12-01T17:50:01.123456+00:00"
CAPTURED = Statement(
    sql="SELECT %(calls)s::JSONB, %(events)s::JSONB",
    params={
        "calls": [{"tool_call_id": CALL, "idempotency_key": f"bench:{CALL}", "fp": FINGERPRINT}],
        "events": [{"event_id": f"evt_{EVENT}", "tool_call_id": CALL, "occurred_at": AT}],
    },
    jsonb=frozenset({"calls", "events"}),
    rows=1,
)


def test_each_id_is_renewed_the_same_wherever_it_appears() -> None:
    refresher = _Refresher([CAPTURED])
    copy = _copy(CAPTURED.params, refresher.table())
    [call], [event] = copy["calls"], copy["events"]
    assert call["tool_call_id"] != CALL
    assert event["tool_call_id"] == call["tool_call_id"]
    assert call["idempotency_key"] == f"bench:{call['tool_call_id']}"
    assert event["event_id"].startswith("evt_") and event["event_id"] != f"evt_{EVENT}"
    assert len(event["event_id"]) == len(f"evt_{EVENT}")
    assert event["occurred_at"] != AT and event["occurred_at"].endswith("+00:00")
    assert call["fp"] == FINGERPRINT


def test_every_copy_gets_new_ids() -> None:
    refresher = _Refresher([CAPTURED])
    first, second = refresher.table(), refresher.table()
    assert first[CALL] != second[CALL]
