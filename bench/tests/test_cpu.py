"""The benchmarks' CPU accounting (``bench/cpu.py``): a window's CPU read off the
samples, processes born or gone mid-run, and the comparison with the ideal round."""

from __future__ import annotations

import os

import psutil  # type: ignore[import-untyped]
import pytest

from bench.cpu import (
    Round,
    Sample,
    by_role,
    compare_rows,
    counts_for,
    cpu_between,
    role_of,
    role_rows,
    totals,
    works_for_one_database,
)

A, B = (10, 1.0), (11, 2.0)


def sample(at: float, machine: float, **cpu: float) -> Sample:
    return Sample(at, {{"a": A, "b": B}[k]: v for k, v in cpu.items()}, machine)


def test_a_process_born_late_counts_from_zero_and_one_gone_keeps_its_last_value() -> None:
    samples = [sample(0, 0, a=1.0), sample(1, 0, a=2.0, b=0.5), sample(2, 0, b=1.5)]
    assert totals(samples) == [1.0, 2.5, 3.5]


def test_the_window_is_interpolated_between_samples_and_clamped_at_the_ends() -> None:
    samples = [sample(0, 0.0, a=0.0), sample(1, 4.0, a=1.0), sample(2, 8.0, a=3.0)]
    used, other = cpu_between(samples, 0.5, 1.5)
    assert used == pytest.approx(1.5)  # 0.5 -> 2.0
    assert other == pytest.approx(4.0 - 1.5)
    assert cpu_between(samples, -5, 10) == pytest.approx((3.0, 5.0))


def test_the_rest_of_the_machine_is_never_negative() -> None:
    samples = [sample(0, 0.0, a=0.0), sample(1, 0.5, a=1.0)]
    assert cpu_between(samples, 0, 1) == (1.0, 0.0)


def test_rounds_are_compared_with_the_ideal_and_only_the_targeted_get_verdicts() -> None:
    ideal = Round("ideal", 5000, 2.0, 2.5)  # 2,500 calls/s, 500 µs a call
    fast = Round("ours", 5000, 4.0, 5.0)  # 0.5x the rate, 2x the CPU: both met
    slow = Round("two", 5000, 5.0, 6.0, other_seconds=1.0)
    rows = compare_rows([ideal, fast, slow], ideal, targeted=["ours"], max_cpu=2.0)
    assert rows == [
        ["ideal", "5,000", "2,500", "500", "1.00x", "1.00x", "", "", "0"],
        [
            "ours",
            "5,000",
            "1,250",
            "1,000",
            "0.50x",
            "2.00x",
            "PASS (>= 0.5x)",
            "PASS (<= 2.0x)",
            "0",
        ],
        ["two", "5,000", "1,000", "1,200", "0.40x", "2.40x", "", "", "200"],
    ]
    missed = compare_rows([slow], ideal, targeted=["two"], max_cpu=2.0)[0]
    assert missed[6:8] == ["MISS (>= 0.5x)", "MISS (<= 2.0x)"]
    # Without a CPU target the column is left out.
    assert compare_rows([slow], ideal, targeted=["two"])[0][6:] == ["MISS (>= 0.5x)", "200"]


def test_each_role_gets_the_cpu_of_its_own_processes_in_the_window() -> None:
    samples = [sample(0, 0.0, a=0.0, b=1.0), sample(2, 0.0, a=2.0, b=5.0)]
    roles = {A: "worker", B: "postgres"}
    assert by_role(samples, roles, 1, 2) == pytest.approx({"worker": 1.0, "postgres": 2.0})
    ours = Round("ours", 1000, 1.0, 3.0, roles={"worker": 1.0, "postgres": 2.0})
    ideal = Round("ideal", 1000, 1.0, 0.5, roles={"worker": 0.5})
    assert role_rows([ideal, ours]) == (
        ["round (CPU µs/call by process)", "postgres", "worker"],
        [["ideal", "0", "500"], ["ours", "2,000", "1,000"]],
    )


def test_a_process_takes_its_own_role_or_its_nearest_named_ancestors() -> None:
    me = psutil.Process()
    assert role_of(me, {me.pid: "me", os.getppid(): "parent"}) == "me"
    assert role_of(me, {os.getppid(): "parent"}) == "parent"
    assert role_of(me, {}) == "other"


@pytest.mark.parametrize(
    ("title", "counted"),
    [
        ("postgres: 15/main: postgres td_bench 127.0.0.1(45422) idle", True),
        ("postgres: 15/main: postgres td_test_87 127.0.0.1(45434) idle in transaction", False),
        ("postgres: postgres td_bench [local] idle", True),
        ("postgres: postgres postgres [local] idle", False),
        ("postgres: 15/main: autovacuum worker td_bench", True),
        ("postgres: 15/main: autovacuum worker td_test_87", False),
        ("postgres: 15/main: parallel worker for PID 4242", True),
        ("postgres: 15/main: parallel worker for PID 4343", False),
        ("postgres: 15/main: checkpointer", True),
        ("postgres: 15/main: walwriter", True),
        ("postgres: io worker 0", True),
    ],
)
def test_a_servers_process_counts_for_the_run_unless_it_works_for_another_database(
    title: str, counted: bool
) -> None:
    assert counts_for(title, "td_bench", backends=[4242]) is counted


def test_a_role_of_no_cpu_in_any_round_is_left_out() -> None:
    rounds = [Round("r", 1000, 1.0, 1.0, roles={"worker": 1.0, "other": 0.0001})]
    assert role_rows(rounds) == (["round (CPU µs/call by process)", "worker"], [["r", "1,000"]])


def test_the_servers_shared_processes_are_told_from_those_of_one_database() -> None:
    assert works_for_one_database("postgres: 15/main: postgres td_bench 127.0.0.1(4542) idle")
    assert works_for_one_database("postgres: 15/main: autovacuum worker td_bench")
    assert works_for_one_database("postgres: 15/main: parallel worker for PID 4242")
    assert not works_for_one_database("postgres: 15/main: walwriter")
    assert not works_for_one_database("/usr/lib/postgresql/15/bin/postgres -D /var/lib/x")
