"""How long the provider client waits between attempts: a throttled request waits the
provider's Retry-After (capped by the policy), any other retried one backs off from
the policy's initial backoff and never beyond its maximum. Mutants of
``dispatcher/provider/client.py`` that the answer-by-answer tests cannot see
(``python -m bench.mutation --module dispatcher/provider/client.py``)."""

from __future__ import annotations

import socket
import time

import httpx
import pytest

from dispatcher.provider.client import DispatchRequest, OutcomeKind, ProviderClient
from dispatcher.testing.registries import capability
from dispatcher.testing.sandbox import SandboxServer
from tests.fixtures.sandbox import add_fault, books


def _closed_port() -> int:
    """A local port nothing listens on: a connection to it is refused at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_a_throttled_request_waits_the_providers_retry_after(
    sandbox: SandboxServer,
) -> None:
    await add_fault(sandbox.url, {"kind": "rate_limit", "idempotencyKey": "k-ra", "times": 1})
    refund = capability("refund", sandbox.url, attempts=2, backoff=(0.001, 5.0))
    async with httpx.AsyncClient() as http:
        started = time.monotonic()
        outcome = await ProviderClient(http).dispatch(
            refund, DispatchRequest("call-1", "k-ra", {"n": 1}, "call-1")
        )
    # Retry-After: 1 (the sandbox's), not the policy's millisecond backoff.
    assert time.monotonic() - started >= 1.0
    assert (outcome.kind, outcome.attempts) == (OutcomeKind.COMPLETED, 2)
    assert (await books(sandbox.url))["received"] == {"k-ra": 2}


@pytest.mark.parametrize(
    ("attempts", "backoff"),
    # From 1 ms doubling: 15 ms of waits in all (from 1 s they would take seconds).
    # Capped at 10 ms: at most 110 ms (doubling from 10 ms uncapped: over 10 s).
    [(5, (0.001, 10.0)), (12, (0.01, 0.01))],
    ids=["from-initial", "capped-at-max"],
)
async def test_an_unsent_request_backs_off_from_the_initial_backoff_up_to_the_maximum(
    attempts: int, backoff: tuple[float, float]
) -> None:
    down = capability(
        "refund", f"http://127.0.0.1:{_closed_port()}", attempts=attempts, backoff=backoff
    )
    async with httpx.AsyncClient() as http:
        started = time.monotonic()
        outcome = await ProviderClient(http).dispatch(
            down, DispatchRequest("call-1", "k-down", {}, "call-1")
        )
    assert time.monotonic() - started < 0.6
    assert (outcome.kind, outcome.attempts) == (OutcomeKind.NOT_SENT, attempts)
