"""What the sandbox provider remembers about a request, and the pure rules that move it.

Both stores keep the same :class:`RequestRecord` and call the same transition
functions, so the in-memory and PostgreSQL providers cannot disagree on behaviour.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any


class RequestStatus(StrEnum):
    """The provider's view of one request."""

    SUCCEEDED = "succeeded"
    """The effect was applied; ``result`` says what it was."""
    FAILED = "failed"
    """The provider declined: nothing happened, and nothing ever will for this key."""
    PENDING = "pending"
    """Accepted but not finished; status lookups advance it to its final outcome."""


@dataclass(frozen=True)
class RequestRecord:
    """One deduplicated request, keyed by its idempotency key."""

    external_id: str
    idempotency_key: str
    body_hash: str
    body: str
    """The request body as canonical JSON (sorted keys, no spaces)."""
    status: RequestStatus
    pending_lookups: int
    """Lookups still answered with ``pending`` before the request settles."""
    pending_outcome: RequestStatus
    reply_status: int
    """The HTTP status of the first answer; a replay returns it unchanged."""
    reply_body: bytes
    """The body of the first answer, byte for byte."""
    reversed: bool = False


@dataclass(frozen=True)
class Reversal:
    """The compensation of one succeeded request; there is at most one per request."""

    external_id: str
    idempotency_key: str
    """The key of the reversed request (reversals are counted per original key)."""
    reversal_id: str
    reversal_key: str
    reply_body: bytes


@dataclass(frozen=True)
class ReverseResult:
    """What a reverse call found: no request, a request that cannot be reversed, or its
    (possibly earlier) reversal."""

    record: RequestRecord | None
    reversal: Reversal | None


@dataclass(frozen=True)
class EffectCounts:
    """Applied effects and reversals per idempotency key."""

    effects: dict[str, int] = field(default_factory=dict)
    reversals: dict[str, int] = field(default_factory=dict)


class InvalidRequest(ValueError):
    """The body is not one the provider accepts; nothing is recorded or applied."""


@dataclass(frozen=True)
class Submission:
    """A validated request body: what the provider was asked to simulate."""

    body: str
    body_hash: str
    simulate: RequestStatus
    pending_lookups: int
    pending_outcome: RequestStatus


_SIMULATIONS = {
    None: RequestStatus.SUCCEEDED,
    "succeed": RequestStatus.SUCCEEDED,
    "fail": RequestStatus.FAILED,
    "pending": RequestStatus.PENDING,
}
_OUTCOMES = {"succeeded": RequestStatus.SUCCEEDED, "failed": RequestStatus.FAILED}
MAX_PENDING_LOOKUPS = 100_000


def parse_submission(raw: bytes) -> Submission:
    """Validate a ``POST /v1/requests`` body; raises :class:`InvalidRequest`."""
    try:
        payload: Any = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidRequest("the body is not JSON") from exc
    if not isinstance(payload, dict):
        raise InvalidRequest("the body must be a JSON object")
    simulate = payload.get("simulate")
    if simulate == "invalid":
        raise InvalidRequest("the request asked to be rejected")
    if simulate not in _SIMULATIONS:
        raise InvalidRequest("simulate must be one of succeed, fail, pending, invalid")
    lookups = payload.get("pendingLookups", 1)
    if type(lookups) is not int or not 0 <= lookups <= MAX_PENDING_LOOKUPS:
        raise InvalidRequest(f"pendingLookups must be an integer in 0..{MAX_PENDING_LOOKUPS}")
    outcome = payload.get("pendingOutcome", "succeeded")
    if outcome not in _OUTCOMES:
        raise InvalidRequest("pendingOutcome must be succeeded or failed")
    body = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return Submission(
        body=body,
        body_hash=hashlib.sha256(body.encode()).hexdigest(),
        simulate=_SIMULATIONS[simulate],
        pending_lookups=lookups,
        pending_outcome=_OUTCOMES[outcome],
    )


def new_external_id() -> str:
    return "req_" + uuid.uuid4().hex


def new_record(key: str, submission: Submission) -> RequestRecord:
    """The record a first request creates, with its answer already rendered."""
    record = RequestRecord(
        external_id=new_external_id(),
        idempotency_key=key,
        body_hash=submission.body_hash,
        body=submission.body,
        status=submission.simulate,
        pending_lookups=submission.pending_lookups,
        pending_outcome=submission.pending_outcome,
        reply_status=0,
        reply_body=b"",
    )
    status = 202 if record.status is RequestStatus.PENDING else 200
    return replace(record, reply_status=status, reply_body=render(record))


def after_lookup(record: RequestRecord) -> tuple[RequestRecord, bool]:
    """Advance a pending request by one lookup; True when this lookup applied the effect."""
    if record.status is not RequestStatus.PENDING:
        return record, False
    if record.pending_lookups > 0:
        return replace(record, pending_lookups=record.pending_lookups - 1), False
    settled = replace(record, status=record.pending_outcome)
    return settled, settled.status is RequestStatus.SUCCEEDED


def new_reversal(record: RequestRecord, reversal_key: str) -> Reversal:
    reversal_id = "rev_" + uuid.uuid4().hex
    body = {
        "externalRequestId": record.external_id,
        "idempotencyKey": record.idempotency_key,
        "reversalId": reversal_id,
        "reversalKey": reversal_key,
        "status": "reversed",
    }
    return Reversal(
        external_id=record.external_id,
        idempotency_key=record.idempotency_key,
        reversal_id=reversal_id,
        reversal_key=reversal_key,
        reply_body=json.dumps(body, separators=(",", ":")).encode(),
    )


_FAILURE = '{"code":"simulated_failure","message":"the provider declined; nothing was applied"}'


def render(record: RequestRecord) -> bytes:
    """The request's current state in the contract's shape."""
    # The body is canonical JSON already, so it is spliced in rather than re-encoded:
    # this runs on every request and is the sandbox's hottest path.
    result = f'{{"echo":{record.body}}}' if record.status is RequestStatus.SUCCEEDED else "null"
    error = _FAILURE if record.status is RequestStatus.FAILED else "null"
    return (
        f'{{"externalRequestId":{json.dumps(record.external_id)},'
        f'"idempotencyKey":{json.dumps(record.idempotency_key, ensure_ascii=False)},'
        f'"status":"{record.status.value}","result":{result},"error":{error},'
        f'"reversed":{"true" if record.reversed else "false"}}}'
    ).encode()
