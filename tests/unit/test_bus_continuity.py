"""Telling a redelivery of the same log from a new log (dispatcher.bus.continuity)."""

from __future__ import annotations

import pytest

from dispatcher.bus.continuity import Recorded, Verdict, fingerprint, judge

A = fingerprint(1_700_000_000_000, b"run-1", b'{"a": 1}')
B = fingerprint(1_700_000_000_001, b"run-1", b'{"a": 1}')
ROW = Recorded(next_offset=10, last_record=A)


def test_a_record_has_one_fingerprint_and_its_time_makes_it_another() -> None:
    assert fingerprint(1_700_000_000_000, b"run-1", b'{"a": 1}') == A
    assert A != B  # the same bytes sent again later
    assert fingerprint(1, None, b"x") != fingerprint(1, b"", b"x")
    assert fingerprint(1, b"ab", b"c") != fingerprint(1, b"a", b"bc")


@pytest.mark.parametrize(
    ("first", "records", "row", "highwater", "verdict"),
    [
        (0, {0: A}, None, 1, Verdict.SAME_LOG),  # never recorded
        (10, {10: B}, ROW, 11, Verdict.SAME_LOG),  # starts where the row does
        (0, {0: B}, Recorded(10, None), 1, Verdict.SAME_LOG),  # nothing to compare
        (0, {0: B, 1: B}, ROW, 3, Verdict.NEW_LOG),  # the log ends below the last record
        (9, {9: A, 10: B}, ROW, 11, Verdict.SAME_LOG),  # the last record, as recorded
        (5, {5: B, 9: B}, ROW, 20, Verdict.NEW_LOG),  # another record where it was
        (2, {2: A, 3: A}, ROW, 20, Verdict.LOOK_FURTHER),  # stops before it
    ],
)
def test_a_batch_is_judged_against_its_row(
    first: int, records: dict[int, bytes | None], row: Recorded | None, highwater: int,
    verdict: Verdict,
) -> None:  # fmt: skip
    assert judge(first, records, row, highwater) is verdict
