"""Calling a capability's provider, and deciding honestly what happened.

Whether a failed request may have reached the provider is decided by the transport
from the exception's type, never its text (the table is in
:mod:`dispatcher.provider.transport`)::

    NotSent         never left this machine: safe to retry
    MaybeReceived   may have been received: outcome unknown
    Unsendable      cannot be sent at all: the call fails, nothing was sent

Retries (tenacity) only ever see the two exception types raised here on purpose
(:class:`_NotSent`, :class:`_Throttled`), and always re-send the SAME idempotency key.
A side-effecting request whose outcome is unknown is never retried: it is reported as
``UNKNOWN`` and the reconciler finds out. Read-only capabilities may be retried on any
transport error.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol, Self

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, stop_after_attempt
from tenacity.wait import wait_random_exponential

from dispatcher.capabilities import Capability, FailureClass, RetryPolicy
from dispatcher.provider.contract import (
    Credentials,
    NoTenantCredential,
    ProviderState,
    external_request_id,
    read_object,
    state_of,
)
from dispatcher.provider.transport import (
    MaybeReceived,
    NotSent,
    Reply,
    Transport,
    Unsendable,
    json_body,
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
    failure: FailureClass | None = None
    """What the last attempt's failure was, when it was one a breaker counts."""
    held: bool = False
    """A circuit breaker stopped the attempts before one was sent: every attempt made
    (if any) provably never reached the provider, so the call may wait to be sent."""


class AttemptGate(Protocol):
    """A capability's circuit breaker, as the client sees it: asked before every
    attempt, told of every failed one."""

    def allows(self, capability: Capability, *, probe: bool, claimed_at: float) -> bool: ...

    async def failed(self, capability: Capability, failure: FailureClass) -> None: ...


@dataclass(frozen=True, slots=True)
class DispatchRequest:
    """What a worker sends for one call (everything but credentials)."""

    tool_call_id: str
    idempotency_key: str
    """The key the provider receives (the call's stored provider key)."""
    input: Mapping[str, Any]
    trace_seed: str
    traceparent: str | None = None
    """The call's stored trace context: its requests' ``traceparent`` when no span of
    this process records one (:mod:`dispatcher.provider.spans` replaces it then);
    without it, one derived from ``trace_seed``."""
    tenant: str = field(kw_only=True)
    """Whose call: the credential of a per-tenant provider account is the tenant's."""
    probe: bool = field(default=False, kw_only=True)
    """A half-open breaker's probe: sent while the breaker holds every other call."""
    claimed_at: float = field(default=0.0, kw_only=True)
    """When (``time.monotonic()``) the claim that sends it began: a breaker seen open
    since does not hold it (the claim found the breaker's pause lifted)."""


class _NotSent(Exception):
    """The request did not reach the provider (or, read-only, it is safe to repeat)."""

    def __init__(self, reason: str, failure: FailureClass | None = "not_sent") -> None:
        super().__init__(reason)
        self.failure = failure


class _Throttled(Exception):
    """429 / 503 with Retry-After: the provider refused without acting."""

    def __init__(self, reason: str, retry_after: float | None, status: int) -> None:
        super().__init__(reason)
        self.retry_after = retry_after
        # A 503 says the provider is down; a 429 only that this caller goes too fast.
        self.failure: FailureClass | None = "http_5xx" if status >= 500 else None


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


def _retry_after(reply: Reply) -> float | None:
    value = reply.headers.get("retry-after", "")
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


def _held(attempts: int, last: str) -> ProviderOutcome:
    return ProviderOutcome(
        OutcomeKind.NOT_SENT,
        attempts,
        error=f"held by the circuit breaker after {attempts} attempt(s): {last}",
        held=True,
    )


def _not_sendable(exc: Exception, attempt: int) -> ProviderOutcome:
    # The type only: a message can quote the header value, which may be a credential.
    return ProviderOutcome(
        OutcomeKind.FAILED,
        attempt,
        error=f"request not sendable: {type(exc).__name__}; nothing was sent",
    )


class ProviderClient:
    """Sends dispatch requests over the process's :class:`Transport`.

    ``secrets`` are the provider credentials (a plain mapping: by capability id, shared
    by every tenant), added at send time as ``Authorization: Bearer``; never stored,
    logged or put in an error.
    """

    def __init__(
        self,
        transport: Transport,
        secrets: Credentials | Mapping[str, str] | None = None,
        *,
        gate: AttemptGate | None = None,
    ) -> None:
        self._transport = transport
        self._credentials = Credentials.of(secrets)
        self._gate = gate

    def guarded(self, gate: AttemptGate) -> Self:
        """This client (its class, transport and credentials: a subclass stays what it
        is) with ``gate`` asked before every attempt of a capability with a breaker."""
        twin = copy.copy(self)
        twin._gate = gate
        return twin

    async def dispatch(self, capability: Capability, request: DispatchRequest) -> ProviderOutcome:
        if not self._allowed(capability, request):
            return _held(0, "nothing sent")
        try:
            # Most calls end at their first attempt: the retry loop's machinery (a tenth
            # of a worker's CPU when every call entered it) is set up for the others.
            return await self._attempt(capability, request, 1)
        except (_NotSent, _Throttled) as first:
            return await self._retry(capability, request, first)

    def _allowed(self, capability: Capability, request: DispatchRequest) -> bool:
        gate = self._gate
        return (
            gate is None
            or capability.breaker is None
            or gate.allows(capability, probe=request.probe, claimed_at=request.claimed_at)
        )

    async def _attempt(
        self, capability: Capability, request: DispatchRequest, attempt: int
    ) -> ProviderOutcome:
        """One attempt; the gate hears of its failure."""
        gate = self._gate
        if gate is None or capability.breaker is None:
            return await self._send_once(capability, request, attempt)
        try:
            outcome = await self._send_once(capability, request, attempt)
        except (_NotSent, _Throttled) as exc:
            if exc.failure is not None:
                await gate.failed(capability, exc.failure)
            raise
        if outcome.failure is not None:
            await gate.failed(capability, outcome.failure)
        return outcome

    async def _retry(
        self, capability: Capability, request: DispatchRequest, first: _NotSent | _Throttled
    ) -> ProviderOutcome:
        """The attempts after a first one that may be repeated: the loop counts that one
        as its attempt 1 (its exception decides the first wait, a Retry-After
        included), then sends, unless the gate holds the call: every attempt so far
        provably never reached the provider, so it may wait to be sent."""
        policy = capability.retry
        attempts, last = 1, first
        try:
            async for attempt in AsyncRetrying(
                retry=retry_if_exception_type((_NotSent, _Throttled)),
                stop=stop_after_attempt(policy.max_attempts),
                wait=backoff(policy),
                reraise=True,
            ):
                with attempt:
                    if attempt.retry_state.attempt_number == 1:
                        raise first
                    if not self._allowed(capability, request):
                        return _held(attempts, str(last))
                    attempts += 1
                    try:
                        outcome = await self._attempt(capability, request, attempts)
                    except (_NotSent, _Throttled) as exc:
                        last = exc
                        raise
            return outcome
        except (_NotSent, _Throttled) as exc:
            return ProviderOutcome(
                OutcomeKind.NOT_SENT, attempts, error=str(exc), failure=exc.failure
            )

    async def _send_once(
        self, capability: Capability, request: DispatchRequest, attempt: int
    ) -> ProviderOutcome:
        endpoint = capability.request
        headers = {
            "Idempotency-Key": request.idempotency_key,
            "traceparent": request.traceparent or traceparent(request.trace_seed),
            "X-Tool-Call-Id": request.tool_call_id,
        }
        try:
            headers.update(self._credentials.headers(capability, request.tenant))
        except NoTenantCredential as exc:
            return _not_sendable(exc, attempt)
        try:
            reply = await self._transport.send(
                endpoint.method,
                endpoint.url,
                headers=headers,
                body=json_body(dict(request.input)),
                timeout_seconds=endpoint.timeout_seconds,
            )
        except Unsendable as exc:
            # Found before a byte was written (a header no request can carry, input
            # JSON cannot encode, a URL that is not one).
            return _not_sendable(exc.cause, attempt)
        except NotSent as exc:
            raise _NotSent(str(exc)) from exc
        except MaybeReceived as exc:
            cause = type(exc.__cause__).__name__
            lost: FailureClass = (
                "timeout" if isinstance(exc.__cause__, asyncio.TimeoutError) else "connection_lost"
            )
            if not capability.side_effects:
                raise _NotSent(f"read-only, repeating after {cause}", lost) from exc
            return ProviderOutcome(
                OutcomeKind.UNKNOWN, attempt, error=f"sent, no answer: {cause}", failure=lost
            )
        try:
            return self._classify(capability, reply, attempt)
        except (_NotSent, _Throttled):
            raise
        except Exception as exc:
            log.warning("answer to %s could not be classified", request.tool_call_id, exc_info=exc)
            return ProviderOutcome(
                OutcomeKind.UNKNOWN,
                attempt,
                reply.status,
                error=f"sent; the answer could not be read: {type(exc).__name__}",
            )

    def _classify(self, capability: Capability, reply: Reply, attempt: int) -> ProviderOutcome:
        status = reply.status
        body = read_object(reply)
        ext_id = external_request_id(body)
        if status == 429 or (status == 503 and _retry_after(reply) is not None):
            raise _Throttled(f"provider answered {status}", _retry_after(reply), status)
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
            raise _NotSent(
                f"read-only, repeating after HTTP {status}",
                # 409: the same key is still in flight, not a sign of a down provider.
                "http_5xx" if status >= 500 else "timeout" if status == 408 else None,
            )
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
            failure="http_5xx" if status >= 500 else "timeout" if status == 408 else None,
        )
