"""Calling a capability's provider, and deciding honestly what happened.

Whether a failed request may have reached the provider is decided from the httpx
exception type, never from message text (see httpx's exception tree)::

    ConnectError, ConnectTimeout, PoolTimeout   -> never left this machine: safe to retry
    ReadTimeout, WriteTimeout, ReadError,
    WriteError, RemoteProtocolError             -> may have been received: outcome unknown

Retries (tenacity) only ever see the two exception types raised here on purpose
(:class:`_NotSent`, :class:`_Throttled`), and always re-send the SAME idempotency key.
A side-effecting request whose outcome is unknown is never retried: it is reported as
``UNKNOWN`` and the reconciler finds out. Read-only capabilities may be retried on any
transport error.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import httpx
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, stop_after_attempt
from tenacity.wait import wait_random_exponential

from dispatcher.capabilities import Capability, RetryPolicy
from dispatcher.provider.contract import (
    ProviderState,
    credential_headers,
    external_request_id,
    read_object,
    state_of,
)

log = logging.getLogger(__name__)


class OutcomeKind(StrEnum):
    COMPLETED = "completed"
    """The provider answered with a final success."""
    FAILED = "failed"
    """The provider answered that the request is invalid or the effect failed."""
    NOT_SENT = "not_sent"
    """Every attempt provably failed before the provider took the request."""
    ACCEPTED = "accepted"
    """The provider took the request and will finish it later."""
    UNKNOWN = "unknown"
    """The request may have had its effect; nobody knows yet."""


@dataclass(frozen=True, slots=True)
class ProviderOutcome:
    kind: OutcomeKind
    attempts: int
    http_status: int | None = None
    external_request_id: str | None = None
    result: Any = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class DispatchRequest:
    """What a worker sends for one call (everything but credentials)."""

    tool_call_id: str
    idempotency_key: str
    input: Mapping[str, Any]
    trace_seed: str


class _NotSent(Exception):
    """The request did not reach the provider (or, read-only, it is safe to repeat)."""


class _Throttled(Exception):
    """429 / 503 with Retry-After: the provider refused without acting."""

    def __init__(self, reason: str, retry_after: float | None) -> None:
        super().__init__(reason)
        self.retry_after = retry_after


def backoff(policy: RetryPolicy) -> Callable[[RetryCallState], float]:
    """How long to wait before the next attempt: a throttled request waits the
    provider's Retry-After, capped by the policy's maximum; any other retried one backs
    off exponentially from the policy's initial backoff, never beyond its maximum."""
    # Full jitter: concurrent workers throttled together do not retry in step.
    exponential = wait_random_exponential(
        multiplier=policy.initial_backoff_seconds, max=policy.max_backoff_seconds
    )

    def wait(state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        if isinstance(exc, _Throttled) and exc.retry_after is not None:
            return min(exc.retry_after, policy.max_backoff_seconds)
        return float(exponential(state))

    return wait


def traceparent(seed: str) -> str:
    """A W3C traceparent derived from a stable seed, so every attempt of a call (and
    the provider's logs) share one trace id."""
    digest = hashlib.sha256(seed.encode()).hexdigest()
    return f"00-{digest[:32]}-{digest[32:48]}-01"


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after", "")
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


UNBUILDABLE: tuple[type[Exception], ...] = (
    UnicodeError,
    ValueError,
    TypeError,
    httpx.InvalidURL,
    httpx.HTTPError,
)
"""What httpx raises while it builds a request, before anything is sent: a header
value that is not ASCII (``UnicodeEncodeError``), input JSON cannot carry (NaN, a
value of no JSON type), a URL it cannot parse."""


def _not_sendable(exc: Exception, attempt: int) -> ProviderOutcome:
    # The type only: a message can quote the header value, which may be a credential.
    return ProviderOutcome(
        OutcomeKind.FAILED,
        attempt,
        error=f"request not sendable: {type(exc).__name__}; nothing was sent",
    )


class ProviderClient:
    """Sends dispatch requests over pooled ``httpx.AsyncClient`` s.

    ``secrets`` maps a capability id to the provider credential added at send time as
    ``Authorization: Bearer``; it is never stored, logged or put in an error.

    Given several clients, each request borrows one that has a free slot: httpcore
    checks every pooled connection (a socket poll each) and every queued request
    whenever a request starts or ends, so its CPU cost per request grows with the
    pool's size. Many small pools keep ``max_in_flight`` requests going at the cost of
    a small one (measured: 16 in flight over one pool of 16 cost ~1 ms of CPU a
    request, over eight pools of 2 ~0.45 ms).
    """

    def __init__(
        self,
        http: httpx.AsyncClient | Sequence[httpx.AsyncClient],
        secrets: Mapping[str, str] | None = None,
        *,
        max_in_flight: int = 16,
    ) -> None:
        self._clients = [http] if isinstance(http, httpx.AsyncClient) else list(http)
        if not self._clients:
            raise ValueError("ProviderClient needs at least one httpx.AsyncClient")
        self._secrets = dict(secrets or {})
        # Requests beyond the slots wait here rather than in httpcore, whose bookkeeping
        # costs grow with every queued request. Slots go round the clients, so the
        # load spreads evenly over them.
        self._free: asyncio.Queue[httpx.AsyncClient] = asyncio.Queue()
        for i in range(max(max_in_flight, 1)):
            self._free.put_nowait(self._clients[i % len(self._clients)])

    async def dispatch(self, capability: Capability, request: DispatchRequest) -> ProviderOutcome:
        policy = capability.retry
        attempts = 0
        try:
            async for attempt in AsyncRetrying(
                retry=retry_if_exception_type((_NotSent, _Throttled)),
                stop=stop_after_attempt(policy.max_attempts),
                wait=backoff(policy),
                reraise=True,
            ):
                with attempt:
                    attempts += 1
                    outcome = await self._send_once(capability, request, attempts)
            return outcome
        except (_NotSent, _Throttled) as exc:
            return ProviderOutcome(OutcomeKind.NOT_SENT, attempts, error=str(exc))

    async def _send_once(
        self, capability: Capability, request: DispatchRequest, attempt: int
    ) -> ProviderOutcome:
        endpoint = capability.request
        headers = {
            "Idempotency-Key": request.idempotency_key,
            "traceparent": traceparent(request.trace_seed),
            "X-Tool-Call-Id": request.tool_call_id,
        }
        headers.update(credential_headers(self._secrets, capability.id))
        http = await self._free.get()
        try:
            try:
                built = http.build_request(
                    endpoint.method,
                    endpoint.url,
                    json=dict(request.input),
                    headers=headers,
                    timeout=endpoint.timeout_seconds,
                )
            except UNBUILDABLE as exc:
                # Raised while the request is put together, before a byte is written.
                return _not_sendable(exc, attempt)
            response = await http.send(built)
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
            raise _NotSent(f"not sent: {type(exc).__name__}") from exc
        except (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError) as exc:
            if not capability.side_effects:
                raise _NotSent(f"read-only, repeating after {type(exc).__name__}") from exc
            return ProviderOutcome(
                OutcomeKind.UNKNOWN, attempt, error=f"sent, no answer: {type(exc).__name__}"
            )
        except httpx.HTTPError as exc:
            # Bad URL, unsupported scheme, local protocol misuse (h11 refuses a header
            # value with CR or LF before writing it): found before anything was sent.
            return _not_sendable(exc, attempt)
        finally:
            self._free.put_nowait(http)
        try:
            return self._classify(capability, response, attempt)
        except (_NotSent, _Throttled):
            raise
        except Exception as exc:
            log.warning("answer to %s could not be classified", request.tool_call_id, exc_info=exc)
            return ProviderOutcome(
                OutcomeKind.UNKNOWN,
                attempt,
                response.status_code,
                error=f"sent; the answer could not be read: {type(exc).__name__}",
            )

    def _classify(
        self, capability: Capability, response: httpx.Response, attempt: int
    ) -> ProviderOutcome:
        status = response.status_code
        body = read_object(response)
        ext_id = external_request_id(body)
        if status == 429 or (status == 503 and _retry_after(response) is not None):
            raise _Throttled(f"provider answered {status}", _retry_after(response))
        if 200 <= status < 300:
            state = state_of(body)
            if status != 202 and state is ProviderState.SUCCEEDED:
                return ProviderOutcome(
                    OutcomeKind.COMPLETED, attempt, status, ext_id, body.get("result")
                )
            if status != 202 and state is ProviderState.FAILED:
                return ProviderOutcome(
                    OutcomeKind.FAILED,
                    attempt,
                    status,
                    ext_id,
                    body.get("result"),
                    error=f"provider reports failure: {body.get('error')}",
                )
            # Taken but not final (202, "pending", or a body we cannot read): the
            # reconciler follows it up by externalRequestId or idempotency key.
            return ProviderOutcome(
                OutcomeKind.ACCEPTED, attempt, status, ext_id, body.get("result")
            )
        if not capability.side_effects and (status >= 500 or status in (408, 409)):
            raise _NotSent(f"read-only, repeating after HTTP {status}")
        if 400 <= status < 500 and status not in (408, 409):
            code = body.get("code") or body.get("error") or "rejected"
            return ProviderOutcome(
                OutcomeKind.FAILED,
                attempt,
                status,
                ext_id,
                error=f"provider refused the request: HTTP {status} {code}",
            )
        # 5xx without Retry-After, 408, 409 (same key still in flight): no definitive
        # answer about the effect.
        return ProviderOutcome(
            OutcomeKind.UNKNOWN,
            attempt,
            status,
            ext_id,
            error=f"no definitive answer: HTTP {status}",
        )
