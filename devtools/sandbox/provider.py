"""The sandbox provider's endpoints, independent of the HTTP plumbing.

:class:`Provider` turns one parsed request into a :class:`Reply`; the server decides,
from the request's fault, whether and when that reply (or none) goes back.

Contract (JSON bodies; errors are ``{"code": ..., "detail": ...}``):

- ``POST /v1/requests`` + ``Idempotency-Key`` (400 ``missing_idempotency_key``): the
  first request with a key records it (and applies the effect if it succeeds); the
  same key and body replays the first answer byte for byte (``Idempotent-Replayed:
  true``); another body is 422 ``idempotency_key_reused``. Body fields ``simulate``
  (``succeed`` | ``fail`` | ``pending`` | ``invalid``), ``pendingLookups`` (default 1),
  ``pendingOutcome`` (``succeeded`` | ``failed``). 200 final, 202 pending, 400
  ``invalid_request`` (nothing recorded).
- ``GET /v1/requests/{id}``, ``GET /v1/requests?idempotencyKey=K``: current state, 404
  ``not_found``; each lookup of a pending request counts towards settling it.
- ``POST /v1/requests/{id}/reverse`` + ``Idempotency-Key``: reverses a succeeded request
  once (200, same answer again); 404 unknown; 409 ``not_reversible`` if failed/pending.
- ``GET /v1/effects``, ``POST /v1/reset``, ``GET|POST|DELETE /v1/faults``,
  ``GET /v1/health``: test and operator endpoints, never faulted.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

from devtools.sandbox.faults import (
    Fault,
    FaultKind,
    FaultSpecError,
    FaultTable,
    parse_header,
)
from devtools.sandbox.records import InvalidRequest, new_record, parse_submission, render
from devtools.sandbox.store import SandboxStore

REQUESTS = "/v1/requests"
FAULT_HEADER = "x-sandbox-fault"
# The test and operator endpoints: never faulted, so a test can always inspect and reset.
ADMIN_PATHS = frozenset({"/v1/faults", "/v1/effects", "/v1/reset", "/v1/health"})
MAX_KEY_LENGTH = 512


@dataclass(frozen=True)
class Incoming:
    """A complete HTTP request (header names lower-case)."""

    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes


@dataclass(frozen=True)
class Reply:
    """A complete JSON answer."""

    status: int
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()


def json_reply(status: int, payload: Any, *headers: tuple[str, str]) -> Reply:
    return Reply(status, json.dumps(payload, separators=(",", ":")).encode(), headers)


def problem(status: int, code: str, detail: str, *headers: tuple[str, str]) -> Reply:
    return json_reply(status, {"code": code, "detail": detail}, *headers)


NOT_FOUND = problem(404, "not_found", "no such request")
NO_KEY = problem(400, "missing_idempotency_key", "the Idempotency-Key header is required")


class Provider:
    """The provider contract: dedup by idempotency key, lookups, reversal, admin."""

    def __init__(self, store: SandboxStore) -> None:
        self.store = store
        self.faults = FaultTable()
        # HTTP requests received per key since start (or reset), faulted ones included:
        # traffic to this process, so kept here rather than in the durable store.
        self.received: Counter[str] = Counter()
        # The traceparent of each of those requests, in order (the trace tests).
        self.traceparents: defaultdict[str, list[str]] = defaultdict(list)

    @staticmethod
    def key_of(incoming: Incoming) -> str | None:
        """The idempotency key a request carries (header, or the lookup's query)."""
        if incoming.method == "GET":
            return incoming.query.get("idempotencyKey")
        return incoming.headers.get("idempotency-key")

    def fault_for(self, incoming: Incoming) -> Fault | None:
        """Count the request and pick its fault: its own header first, then the rules.
        Raises :class:`FaultSpecError` for a bad header."""
        if incoming.path in ADMIN_PATHS:
            return None
        key = self.key_of(incoming)
        if key:
            self.received[key] += 1
            parent = incoming.headers.get("traceparent")
            if parent is not None:
                self.traceparents[key].append(parent)
        header = incoming.headers.get(FAULT_HEADER)
        if header is not None:
            return parse_header(header)
        if not self.faults.rules:
            return None
        return self.faults.take(incoming.method, incoming.path, key)

    async def handle(self, incoming: Incoming) -> Reply:
        """Apply the request (the effect, a lookup, a reversal, an admin action)."""
        method, path = incoming.method, incoming.path
        if path == REQUESTS:
            if method == "POST":
                return await self._create(incoming)
            if method == "GET":
                return await self._lookup_by_key(incoming)
            return _not_allowed()
        if path.startswith(REQUESTS + "/"):
            external_id, _, action = path[len(REQUESTS) + 1 :].partition("/")
            if not external_id or action not in ("", "reverse"):
                return NOT_FOUND
            if action == "reverse" and method == "POST":
                return await self._reverse(incoming, external_id)
            if action == "" and method == "GET":
                return await self._lookup(external_id)
            return _not_allowed()
        return await self._admin(incoming)

    async def _create(self, incoming: Incoming) -> Reply:
        key = incoming.headers.get("idempotency-key")
        if not key:
            return NO_KEY
        if len(key) > MAX_KEY_LENGTH:
            return problem(400, "invalid_request", f"Idempotency-Key exceeds {MAX_KEY_LENGTH}")
        try:
            submission = parse_submission(incoming.body)
        except InvalidRequest as exc:
            return problem(400, "invalid_request", str(exc))
        stored, created = await self.store.create(new_record(key, submission))
        if created:
            return Reply(stored.reply_status, stored.reply_body)
        if stored.body_hash != submission.body_hash:
            return problem(
                422,
                "idempotency_key_reused",
                "this Idempotency-Key was already used with a different body",
            )
        return Reply(stored.reply_status, stored.reply_body, (("idempotent-replayed", "true"),))

    async def _lookup(self, external_id: str) -> Reply:
        record = await self.store.lookup(external_id)
        return NOT_FOUND if record is None else Reply(200, render(record))

    async def _lookup_by_key(self, incoming: Incoming) -> Reply:
        key = incoming.query.get("idempotencyKey")
        if not key:
            return problem(400, "invalid_request", "the idempotencyKey parameter is required")
        record = await self.store.lookup_by_key(key)
        return NOT_FOUND if record is None else Reply(200, render(record))

    async def _reverse(self, incoming: Incoming, external_id: str) -> Reply:
        reversal_key = incoming.headers.get("idempotency-key")
        if not reversal_key:
            return NO_KEY
        found = await self.store.reverse(external_id, reversal_key)
        if found.record is None:
            return NOT_FOUND
        if found.reversal is None:
            return problem(
                409, "not_reversible", f"the request is {found.record.status.value}, not succeeded"
            )
        return Reply(200, found.reversal.reply_body)

    async def _admin(self, incoming: Incoming) -> Reply:
        route = (incoming.method, incoming.path)
        if route == ("GET", "/v1/health"):
            return json_reply(200, {"status": "ok", "store": self.store.name})
        if route == ("GET", "/v1/effects"):
            counts = await self.store.counts()
            return json_reply(
                200,
                {
                    "effects": counts.effects,
                    "reversals": counts.reversals,
                    "received": dict(self.received),
                    "traceparents": dict(self.traceparents),
                    "total": sum(counts.effects.values()),
                },
            )
        if route == ("POST", "/v1/reset"):
            await self.store.reset()
            self.faults.clear()
            self.received.clear()
            self.traceparents.clear()
            return json_reply(200, {"reset": True})
        if route == ("GET", "/v1/faults"):
            return self._rules()
        if route == ("DELETE", "/v1/faults"):
            self.faults.clear()
            return self._rules()
        if route == ("POST", "/v1/faults"):
            try:
                self.faults.add(json.loads(incoming.body))
            except (ValueError, UnicodeDecodeError) as exc:  # FaultSpecError is a ValueError
                code = "invalid_fault" if isinstance(exc, FaultSpecError) else "invalid_request"
                return problem(400, code, str(exc) if code == "invalid_fault" else "not JSON")
            return self._rules()
        if incoming.path in ADMIN_PATHS:
            return _not_allowed()
        return problem(404, "not_found", "no such endpoint")

    def _rules(self) -> Reply:
        return json_reply(200, {"rules": [rule.describe() for rule in self.faults.rules]})


def _not_allowed() -> Reply:
    return problem(405, "method_not_allowed", "method not allowed on this path")


def fault_reply(fault: Fault) -> Reply:
    """The answer of a fault that answers (error, rate_limit, unavailable)."""
    if fault.kind is FaultKind.RATE_LIMIT:
        return problem(429, "rate_limited", "slow down", ("retry-after", str(fault.retry_after)))
    if fault.kind is FaultKind.UNAVAILABLE:
        return problem(
            503, "unavailable", "try again later", ("retry-after", str(fault.retry_after))
        )
    return problem(fault.status, *_ERRORS.get(fault.status, _error_of(fault.status)))


# The words of an ``error`` fault's answer, by status: what a real provider would say.
_ERRORS = {
    408: ("request_timeout", "the request took too long; outcome not decided"),
    409: ("in_flight", "a request with this key is still in flight"),
}


def _error_of(status: int) -> tuple[str, str]:
    if status < 500:
        return ("rejected", "the provider refused the request")
    return ("internal_error", "the provider failed; outcome not decided")
