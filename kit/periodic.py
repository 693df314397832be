"""The one loop every long-running process repeats: a step every so often until asked
to stop, surviving its own errors.

A sweep, a gauge or a reconcile pass that raises must not end its process: the error
is logged with its traceback, counted (``loop_step_errors_total``), and the step is
tried again after a backoff that doubles from ``every`` up to ``backoff_max``, so a
database that is down is not hammered while it comes back. A step that succeeds
resets the backoff. Each step's duration is a metric too (``loop_step_seconds``):
what a step costs shows before it starts to crowd out the work it paces.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from prometheus_client import Counter, Histogram

from kit.signals import sleep_unless

log = logging.getLogger(__name__)

STEP_ERRORS = Counter(
    "loop_step_errors_total",
    "Steps of a periodic loop that raised (the loop carried on)",
    ["loop"],
)
STEP_SECONDS = Histogram(
    "loop_step_seconds",
    "How long each step of a periodic loop took, errors included",
    ["loop"],
    buckets=(0.001, 0.005, 0.025, 0.1, 0.5, 2.5, 10.0, 60.0),
)


async def periodic(
    stop: asyncio.Event,
    every: float,
    step: Callable[[], Awaitable[object]],
    *,
    name: str,
    backoff_max: float | None = None,
    first_delay: float = 0.0,
) -> None:
    """Run ``step`` every ``every`` seconds until ``stop`` is set (checked between
    steps, never in the middle of one). ``name`` labels its log lines and metrics.
    After an error the next step waits ``every * 2**n``, at most ``backoff_max``
    (default ``10 * every``)."""
    cap = backoff_max if backoff_max is not None else 10 * every
    delay = first_delay
    failures = 0
    while not await sleep_unless(stop, delay):
        started = time.monotonic()
        try:
            await step()
        except Exception:  # the loop outlives its step: logged, counted, retried
            failures += 1
            STEP_ERRORS.labels(name).inc()
            delay = min(every * 2**failures, cap)
            log.exception("%s: step failed (%d in a row); next in %.1fs", name, failures, delay)
        else:
            failures = 0
            delay = every
        finally:
            STEP_SECONDS.labels(name).observe(time.monotonic() - started)
