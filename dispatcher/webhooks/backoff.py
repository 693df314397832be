"""How long a failed delivery (and its subscription) waits: pure, no I/O.

Exponential from the first delay up to a cap, with "full jitter" on the upper half: many
deliveries failing together (a receiver that went down) come back spread out, not as
one burst at the moment it returns.
"""

from __future__ import annotations

import random


def delay(failures: int, *, initial: float, cap: float, rng: random.Random | None = None) -> float:
    """Seconds to wait after ``failures`` failures in a row (1 for the first)."""
    # The exponent is bounded so a long outage cannot overflow the float.
    ceiling = min(cap, initial * 2.0 ** min(max(failures, 1) - 1, 64))
    draw = (rng or _RNG).random()
    return ceiling / 2 + draw * ceiling / 2


# Jitter spreads retries; it is not a secret, so the module's own generator serves.
_RNG = random.Random()  # noqa: S311
