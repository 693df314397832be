"""bench.dispatch --rounds: the rounds alternate their order, and a ratio is the
median of the ratios within each round, never of rates from different rounds."""

from __future__ import annotations

from bench.cpu import Round
from bench.dispatch_rounds import median_ratios, schedule


def measured(rate: float, cpu_us: float) -> Round:
    """A round of 1,000 calls at ``rate`` calls/s using ``cpu_us`` µs of CPU each."""
    return Round("r", 1000, 1000 / rate, cpu_us * 1000 / 1e6)


def test_rounds_alternate_their_order() -> None:
    assert list(schedule(["lean", "ideal", "w1"], 3)) == [
        (0, "lean"), (0, "ideal"), (0, "w1"),
        (1, "w1"), (1, "ideal"), (1, "lean"),
        (2, "lean"), (2, "ideal"), (2, "w1"),
    ]  # fmt: skip


def test_a_ratio_is_the_median_of_each_rounds_own_ratio() -> None:
    # The machine was twice as fast in round 1: a ratio across rounds would be 0.2x or
    # 0.8x; within each round the worker is 0.4x, 0.45x and 0.6x of the lean ideal.
    rounds = [
        {"lean": measured(4000, 300), "w1": measured(1600, 690)},
        {"lean": measured(8000, 150), "w1": measured(3600, 345)},
        {"lean": measured(3000, 400), "w1": measured(1800, 880)},
    ]
    assert median_ratios(rounds, "w1", "lean", min_rate=0.5, max_cpu=2.0) == [
        "w1 / lean, calls/s: 0.45x (median of 0.40, 0.45, 0.60)  target >= 0.5x: MISS",
        "w1 / lean, CPU per call: 2.30x (median of 2.30, 2.30, 2.20)  target <= 2.0x: MISS",
    ]


def test_a_round_without_both_sides_is_left_out_and_one_round_shows_no_median() -> None:
    rounds = [{"lean": measured(4000, 300), "w1": measured(2400, 540)}, {"w1": measured(1, 1)}]
    assert median_ratios(rounds, "w1", "lean", min_rate=0.5, max_cpu=2.0) == [
        "w1 / lean, calls/s: 0.60x  target >= 0.5x: PASS",
        "w1 / lean, CPU per call: 1.80x  target <= 2.0x: PASS",
    ]
    assert median_ratios([{"w1": measured(1, 1)}], "w1", "lean", min_rate=0.5, max_cpu=2.0) == []
