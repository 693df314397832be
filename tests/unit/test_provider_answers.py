"""The worker's reading of each provider answer, status by status, and the pieces of a
send that need no server: Retry-After, the trace of a call's attempts, an unsendable
request."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

import pytest
from multidict import CIMultiDict

from devtools.registries import capability
from dispatcher.provider.client import (
    OutcomeKind,
    ProviderClient,
    ProviderOutcome,
    _not_sendable,
    _NotSent,
    _retry_after,
    _Throttled,
    traceparent,
)
from dispatcher.provider.transport import Reply, Transport

WRITE = capability("refund")
READ = capability("lookup", side_effects=False)
K = OutcomeKind


@pytest.fixture
async def client() -> Any:
    async with Transport() as http:
        yield ProviderClient(http)


def answer(status: int, body: Any = None, **headers: str) -> Reply:
    body = json.dumps(body if body is not None else {}).encode()
    return Reply(status, CIMultiDict(headers), body)


FINAL = {"status": "succeeded", "externalRequestId": "req_1", "result": {"n": 1}}
FAILED = {"status": "failed", "id": "req_2", "result": {"n": 2}, "error": "declined"}


def unknown(status: int, ext: str | None = None) -> ProviderOutcome:
    # What a circuit breaker counts of it: 5xx and 408 are signs of a provider in
    # trouble; 409 (the same key still in flight) is not.
    failure = "http_5xx" if status >= 500 else "timeout" if status == 408 else None
    return ProviderOutcome(
        K.UNKNOWN, 1, status, ext, None, f"no definitive answer: HTTP {status}", failure
    )


def refused(status: int, code: str, attempts: int = 1) -> ProviderOutcome:
    error = f"provider refused the request: HTTP {status} {code}"
    return ProviderOutcome(K.FAILED, attempts, status, None, None, error)


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (200, FINAL, ProviderOutcome(K.COMPLETED, 1, 200, "req_1", {"n": 1})),
        (201, FINAL, ProviderOutcome(K.COMPLETED, 1, 201, "req_1", {"n": 1})),
        (299, FINAL, ProviderOutcome(K.COMPLETED, 1, 299, "req_1", {"n": 1})),
        (202, FINAL, ProviderOutcome(K.ACCEPTED, 1, 202, "req_1", {"n": 1})),
        (
            200,
            FAILED,
            ProviderOutcome(
                K.FAILED, 1, 200, "req_2", {"n": 2}, "provider reports failure: declined"
            ),
        ),
        (202, FAILED, ProviderOutcome(K.ACCEPTED, 1, 202, "req_2", {"n": 2})),
        (200, {"status": "pending", "id": 7}, ProviderOutcome(K.ACCEPTED, 1, 200, "7")),
        (300, FINAL, unknown(300, "req_1")),
        (400, {"code": "bad_amount", "error": "e"}, refused(400, "bad_amount")),
        (422, {"error": "too_big"}, refused(422, "too_big")),
        (499, {}, refused(499, "rejected")),
        # A refusal keeps the provider's request id, as evidence of what it saw.
        (
            400,
            {"code": "bad", "id": "req_4"},
            ProviderOutcome(
                K.FAILED, 1, 400, "req_4", None, "provider refused the request: HTTP 400 bad"
            ),
        ),
        (408, {}, unknown(408)),
        (409, {}, unknown(409)),
        (500, {"id": "r"}, unknown(500, "r")),
        (503, {}, unknown(503)),
    ],
)
async def test_a_side_effecting_answer_is_read_by_its_status_and_body(
    client: ProviderClient, status: int, body: Any, expected: ProviderOutcome
) -> None:
    assert client._classify(WRITE, answer(status, body), 1) == expected


@pytest.mark.parametrize(
    ("status", "outcome"),
    [
        (500, "read-only, repeating after HTTP 500"),
        (599, "read-only, repeating after HTTP 599"),
        (408, "read-only, repeating after HTTP 408"),
        (409, "read-only, repeating after HTTP 409"),
        (404, refused(404, "rejected", attempts=3)),
        (499, refused(499, "rejected", attempts=3)),
    ],
)
async def test_a_read_only_call_repeats_what_a_side_effect_may_not(
    client: ProviderClient, status: int, outcome: str | ProviderOutcome
) -> None:
    if isinstance(outcome, str):
        with pytest.raises(_NotSent, match=f"^{re.escape(outcome)}$"):
            client._classify(READ, answer(status), 3)
    else:
        assert client._classify(READ, answer(status), 3) == outcome


@pytest.mark.parametrize(
    ("status", "headers", "retry_after"),
    [(429, {}, None), (429, {"Retry-After": "3"}, 3.0), (503, {"Retry-After": "0.5"}, 0.5)],
)
async def test_throttling_is_refused_without_acting(
    client: ProviderClient, status: int, headers: dict[str, str], retry_after: float | None
) -> None:
    with pytest.raises(_Throttled, match=f"^provider answered {status}$") as raised:
        client._classify(WRITE, answer(status, **headers), 1)
    assert raised.value.retry_after == retry_after


def test_retry_after_is_seconds_never_negative() -> None:
    assert _retry_after(answer(429, **{"Retry-After": "2.5"})) == 2.5
    assert _retry_after(answer(429, **{"Retry-After": "-4"})) == 0.0
    assert _retry_after(answer(429, **{"Retry-After": "soon"})) is None
    assert _retry_after(answer(429)) is None


def test_every_attempt_of_a_call_shares_one_trace() -> None:
    parent = traceparent("call-1")
    assert re.fullmatch(r"00-[0-9a-f]{32}-[0-9a-f]{16}-01", parent)
    assert parent == traceparent("call-1") != traceparent("call-2")
    trace_id, span_id = parent.split("-")[1:3]
    assert trace_id + span_id == hashlib.sha256(b"call-1").hexdigest()[:48]


def test_an_unsendable_request_names_only_the_exception_type() -> None:
    outcome = _not_sendable(UnicodeEncodeError("ascii", "Bearer sécret", 8, 9, "no"), 2)
    assert outcome == ProviderOutcome(
        K.FAILED, 2, error="request not sendable: UnicodeEncodeError; nothing was sent"
    )
