"""bench.intake --rounds: the modes alternate direction from round to round, and a
ratio is the median of the ratios within each round, never of rates from different
rounds."""

from __future__ import annotations

from bench.harness import Cell
from bench.intake import ratios, schedule


def cell(mode: str, rate: float, round_: int) -> Cell:
    return Cell(mode, 16, calls=int(rate), seconds=1.0, round=round_)


def test_rounds_alternate_the_order_of_the_modes() -> None:
    assert list(schedule(["a", "b", "c"], [1, 16], 2)) == [
        (1, 0, "a"), (1, 0, "b"), (1, 0, "c"), (1, 1, "c"), (1, 1, "b"), (1, 1, "a"),
        (16, 0, "a"), (16, 0, "b"), (16, 0, "c"), (16, 1, "c"), (16, 1, "b"), (16, 1, "a"),
    ]  # fmt: skip


def test_a_ratio_is_the_median_of_each_rounds_own_ratio() -> None:
    # The machine was twice as fast in round 1: a ratio across rounds would be 0.4x or
    # 1.4x; within each round the library is 0.8x, 0.7x and 1.2x of psycopg (mean 0.9x).
    cells = [
        cell("library", 400, 0), cell("psycopg", 500, 0),
        cell("library", 700, 1), cell("psycopg", 1000, 1),
        cell("library", 600, 2), cell("psycopg", 500, 2),
    ]  # fmt: skip
    [line] = [line for line in ratios(cells, [16]) if line.startswith("library / psycopg")]
    assert line == (
        "library / psycopg at 16 clients: 0.80x (median of 0.80, 0.70, 1.20)  target >= 0.75: PASS"
    )


def test_a_round_without_both_sides_is_left_out() -> None:
    cells = [cell("library", 400, 0), cell("psycopg", 500, 0), cell("library", 900, 1)]
    [line] = [line for line in ratios(cells, [16]) if line.startswith("library / psycopg")]
    assert line == "library / psycopg at 16 clients: 0.80x  target >= 0.75: PASS"


def test_the_session_ceilings_own_ratio_is_printed_without_a_target() -> None:
    cells = [cell("session", 600, 0), cell("psycopg", 1000, 0)]
    assert ratios(cells, [16]) == ["session / psycopg at 16 clients: 0.60x"]
