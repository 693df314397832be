"""The growth benchmark's arithmetic (``bench/growth_report.py``, ``bench/plans.py``): what
a plan examined, what the history added per call, the projected size, and how a ratio
is judged against its bound."""

from __future__ import annotations

import math

import pytest

from bench.growth_report import (
    CEILING,
    Growth,
    Part,
    Row,
    Sizes,
    human,
    operations_table,
    projected_bytes,
    ratio,
    statements_detail,
    verdict,
)
from bench.plans import Explained, buffers, explainable, rows_examined

# A plan as EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) gives it: a nested loop whose outer
# side is a filtered seq scan and whose inner side an index scan looped per outer row,
# and a bitmap heap scan (its bitmap index scan has no relation of its own).
PLAN = {
    "Node Type": "Nested Loop",
    "Actual Rows": 6,
    "Actual Loops": 1,
    "Shared Hit Blocks": 40,
    "Shared Read Blocks": 2,
    "Plans": [
        {
            "Node Type": "Seq Scan",
            "Relation Name": "approvals",
            "Actual Rows": 3,
            "Actual Loops": 1,
            "Rows Removed by Filter": 97,
        },
        {
            "Node Type": "Index Scan",
            "Relation Name": "tool_calls",
            "Actual Rows": 2,
            "Actual Loops": 3,
        },
        {
            "Node Type": "Hash",
            "Actual Rows": 5,
            "Actual Loops": 1,
            "Plans": [
                {
                    "Node Type": "Bitmap Heap Scan",
                    "Relation Name": "execution_events",
                    "Actual Rows": 5,
                    "Actual Loops": 1,
                    "Rows Removed by Index Recheck": 4,
                    "Plans": [
                        {"Node Type": "Bitmap Index Scan", "Actual Rows": 9, "Actual Loops": 1}
                    ],
                }
            ],
        },
    ],
}


def test_rows_examined_are_every_scan_s_rows_and_what_its_filters_threw_away_per_loop() -> None:
    # approvals 3 + 97, tool_calls 2 x 3 loops, events 5 + 4 rechecked; the join's own
    # rows, the hash's and the bitmap index scan's are not reads of a table.
    assert rows_examined(PLAN) == 100 + 6 + 9


def test_buffers_are_the_root_s_hits_and_reads_and_what_it_returned_the_root_s_rows() -> None:
    assert buffers(PLAN) == 42
    assert Explained.of("  SELECT *\n FROM t", [{"Plan": PLAN}]) == Explained(
        "SELECT * FROM t", 115, 42, 6
    )


@pytest.mark.parametrize(
    ("statement", "explained"),
    [
        ("SELECT 1", True),
        ("\n  with x AS (SELECT 1) SELECT * FROM x", True),
        ("(SELECT 1) UNION (SELECT 2)", True),
        ("UPDATE t SET a = 1", True),
        ("BEGIN", False),
        ("SET enable_seqscan = off", False),
        ("LISTEN outbox_inserted", False),
        ("SAVEPOINT s", False),
    ],
)
def test_only_statements_that_read_or_write_rows_are_explained(
    statement: str, explained: bool
) -> None:
    assert explainable(statement) is explained


def test_the_projection_keeps_each_call_for_the_retention_and_the_outbox_for_its_window() -> None:
    day = 86_400
    assert projected_bytes(10, 30, retained=1_000, outbox=500) == 10 * (
        30 * day * 1_000 + day * 500
    )
    assert (
        projected_bytes(100, 7, retained=2_000, outbox=0, window_hours=12) == 100 * 7 * day * 2_000
    )
    # At 1,000 calls/s for 30 days, 3 KB a call is about 7 TiB.
    assert human(projected_bytes(1_000, 30, 3_000, 0)) == "7.1 TB"


def _sizes(events: Part, outbox: Part, finished: int, window: int) -> Sizes:
    return Sizes(
        {"execution_events": events, "outbox": outbox},
        {"ix_run": ("execution_events", events.indexes)},
        finished,
        window,
    )


def test_what_the_history_added_is_the_full_database_less_the_empty_one_per_finished_call() -> None:
    empty = _sizes(Part(8_192, 0, 16_384, 10), Part(8_192, 0, 8_192, 5), 0, 3)
    full = _sizes(
        Part(8_192 + 400_000, 8_000, 16_384 + 100_000, 4_010),
        Part(8_192 + 50_000, 0, 8_192, 105),
        1_000,
        13,
    )
    growth = Growth.between(full, empty)
    assert growth.calls == 1_000 and growth.outbox_calls == 10
    assert growth.tables["execution_events"] == Part(400_000, 8_000, 100_000, 4_000)
    assert growth.indexes == {"ix_run": ("execution_events", 100_000)}
    # Kept with the call: everything but the outbox; the outbox per call of its window.
    assert growth.retained == pytest.approx(508.0)
    assert growth.outbox == pytest.approx(5_000.0)
    assert growth.total == pytest.approx(558.0)


def test_a_ratio_of_nothing_to_nothing_is_even_and_of_something_to_nothing_unbounded() -> None:
    assert ratio(3.0, 2.0) == 1.5
    assert ratio(0, 0) == 1.0
    assert math.isinf(ratio(5, 0))


def test_a_verdict_is_ok_up_to_its_bound_and_names_the_bound_past_it() -> None:
    assert verdict(CEILING, ceiling=CEILING) == "ok"
    assert verdict(1.51, ceiling=1.5) == "OVER 1.5x"
    assert verdict(0.95, floor=0.95) == "ok"
    assert verdict(0.9, floor=0.95) == "UNDER 0.95x"


def test_an_operation_is_judged_by_the_worse_of_its_time_and_its_rows() -> None:
    steady = Row("steady", 2.0, 2.5, 100, 120, 10, 11)
    grown = Row("grown", 2.0, 2.2, 100, 50_000, 10, 900)
    failed = Row("failed", math.nan, math.nan, 0, 0, 0, 0, note="failed")
    lines = operations_table([steady, grown, failed]).splitlines()
    assert lines[2].startswith("| steady |") and lines[2].endswith("| ok |")
    assert "| 1.25x |" in lines[2] and "| 1.20x |" in lines[2]
    assert "| 500.00x |" in lines[3] and lines[3].endswith("| OVER 1.5x |")
    assert lines[4].count("| - ") == 7
    assert lines[4].endswith("| failed |")


def test_a_full_page_is_not_growth_but_rows_beyond_what_was_returned_are() -> None:
    # The empty database had 20 approvals to show, the full one a page of 100.
    page = Row("page", 1.0, 1.0, 20, 100, 1, 5, returned=100)
    assert page.rows_ratio == 1.0
    scan = Row("scan", 1.0, 1.0, 20, 5_000, 1, 90, returned=100)
    assert scan.rows_ratio == 50.0
    assert "| 100 | 1.00x |" in operations_table([page])


def test_only_statements_that_grew_past_the_ceiling_are_listed() -> None:
    detail = {
        "op": [("SELECT a", 100, 140), ("SELECT b", 10, 5_000), ("SELECT c", 1, 60)],
    }
    assert statements_detail(detail) == ["- op: `SELECT b` 10 -> 5,000 rows"]
