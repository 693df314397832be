"""How long the provider client waits between attempts, as the pure function it
retries with: a throttled request waits the provider's Retry-After (capped by the
policy), any other retried one backs off from the policy's initial backoff and never
beyond its maximum. No clock is read."""

from __future__ import annotations

import pytest
from tenacity import RetryCallState

from dispatcher.capabilities import RetryPolicy
from dispatcher.provider.client import _NotSent, _Throttled, backoff

SAMPLES = 300


def _after(attempt: int, exc: Exception) -> RetryCallState:
    """The retry state once attempt number ``attempt`` raised ``exc``."""
    state = RetryCallState(retry_object=None, fn=None, args=(), kwargs={})  # type: ignore[arg-type]
    state.attempt_number = attempt
    state.set_exception((type(exc), exc, None))
    return state


def test_a_throttled_request_waits_the_providers_retry_after_capped_by_the_maximum() -> None:
    wait = backoff(
        RetryPolicy(max_attempts=3, initial_backoff_seconds=0.001, max_backoff_seconds=5)
    )
    assert wait(_after(1, _Throttled("429", retry_after=1.0, status=429))) == 1.0
    assert wait(_after(1, _Throttled("429", retry_after=60.0, status=429))) == 5.0


def test_a_throttled_request_without_retry_after_backs_off_like_any_other() -> None:
    wait = backoff(RetryPolicy(initial_backoff_seconds=0.001, max_backoff_seconds=5))
    waits = [
        wait(_after(1, _Throttled("429", retry_after=None, status=429))) for _ in range(SAMPLES)
    ]
    assert max(waits) <= 0.002


@pytest.mark.parametrize("attempt", [1, 3, 6])
def test_an_unsent_request_backs_off_from_the_initial_backoff(attempt: int) -> None:
    # Full jitter: each wait is drawn from [0, initial * 2**attempt].
    wait = backoff(RetryPolicy(initial_backoff_seconds=0.001, max_backoff_seconds=10))
    waits = [wait(_after(attempt, _NotSent("refused"))) for _ in range(SAMPLES)]
    ceiling = 0.001 * 2**attempt
    assert max(waits) <= ceiling
    # Jittered, not a fixed wait: spread over the range, never all at zero.
    assert max(waits) > ceiling / 4


def test_an_unsent_request_never_waits_beyond_the_maximum() -> None:
    wait = backoff(RetryPolicy(initial_backoff_seconds=0.01, max_backoff_seconds=0.01))
    waits = [wait(_after(12, _NotSent("refused"))) for _ in range(SAMPLES)]
    assert max(waits) <= 0.01
