"""``bench.dispatch --rounds``: the rounds' order and the ratios over them.

On a shared machine the speed drifts from minute to minute, so every round measures
each ceiling and the worker again, the order reversed from one round to the next, and
a ratio is the median of each round's own ratio: never one of rates measured in
different rounds.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator, Mapping, Sequence

from bench.cpu import Round, verdict


def schedule(names: Sequence[str], rounds: int) -> Iterator[tuple[int, str]]:
    """``(round, name)`` in the order to measure them: forward, then backward."""
    for r in range(rounds):
        for name in names if r % 2 == 0 else list(reversed(names)):
            yield r, name


def median_ratios(
    measured: Sequence[Mapping[str, Round]],
    subject: str,
    ceiling: str,
    *,
    min_rate: float,
    max_cpu: float,
) -> list[str]:
    """Two lines, ``subject``'s calls/s and CPU per call against ``ceiling``'s, each the
    median of the ratios of the rounds that measured both, with its target's verdict."""
    pairs = [
        (m[subject], m[ceiling])
        for m in measured
        if subject in m and ceiling in m and m[ceiling].rate and m[ceiling].cpu_per_call_us
    ]
    if not pairs:
        return []
    rates = [s.rate / c.rate for s, c in pairs]
    cpus = [s.cpu_per_call_us / c.cpu_per_call_us for s, c in pairs]
    return [
        median_line(
            f"{subject} / {ceiling}, calls/s", rates, f">= {min_rate}x", min_rate, above=True
        ),
        median_line(
            f"{subject} / {ceiling}, CPU per call", cpus, f"<= {max_cpu}x", max_cpu, above=False
        ),
    ]


def median_line(label: str, values: list[float], target: str, bound: float, *, above: bool) -> str:
    """``label``: the median of ``values`` (each listed when there are several), and its
    verdict against ``bound`` (a floor when ``above``, else a ceiling)."""
    value = statistics.median(values)
    each = f" (median of {', '.join(f'{v:.2f}' for v in values)})" if len(values) > 1 else ""
    ok = value >= bound if above else value <= bound
    return f"{label}: {value:.2f}x{each}  target {target}: {verdict(ok)}"
