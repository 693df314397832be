"""How long the relay waits after a batch that left rows unpublished: pure, no I/O.

The wait doubles only across consecutive attempts that published nothing. An attempt
that got some rows through shows the broker is taking writes again, so the next
attempt comes soon: otherwise a relay that had backed off to the cap during an
outage would keep sleeping the full cap between batches that mostly succeed, and
settle up to that long after the broker recovered.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Backoff:
    """Capped exponential backoff that restarts whenever an attempt made progress."""

    initial: float
    cap: float
    failures: int = 0
    """Failed attempts since the last success or progress (a progress one counts as 1)."""

    @property
    def delay(self) -> float:
        """The wait after the latest failed attempt; 0 after a success."""
        if not self.failures:
            return 0.0
        # The exponent is bounded so a long outage cannot overflow the float.
        return min(self.cap, self.initial * 2.0 ** min(self.failures - 1, 64))

    def after(self, *, progress: bool) -> float:
        """Record a failed attempt; returns how long to wait before the next one.

        ``progress`` is true when the attempt published at least one row.
        """
        self.failures = 1 if progress else self.failures + 1
        return self.delay

    def reset(self) -> None:
        """Record an attempt that published everything it read."""
        self.failures = 0
