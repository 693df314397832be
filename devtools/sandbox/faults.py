"""Faults on demand: what the sandbox does instead of answering normally.

A fault comes from the ``X-Sandbox-Fault`` header of one request or from a rule
installed with ``POST /v1/faults`` that matches requests by idempotency key, key
prefix, path, path prefix and method. The server (:mod:`devtools.sandbox.server`)
carries them out, because some of them act on the TCP connection itself.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class FaultKind(StrEnum):
    """What the provider does instead of (or before) answering normally."""

    LATENCY = "latency"
    """Wait ``latencyMs``, then answer normally."""
    ERROR = "error"
    """Answer ``status`` (4xx or 5xx) and apply nothing: a 5xx, 408 or 409 is "no
    definitive answer" to the client, any other 4xx a refusal (see
    docs/provider-contract.md)."""
    RATE_LIMIT = "rate_limit"
    """Answer 429 with ``Retry-After``; nothing is applied."""
    UNAVAILABLE = "unavailable"
    """Answer 503 with ``Retry-After``; nothing is applied."""
    TIMEOUT = "timeout"
    """Apply (if ``apply``), then hold the connection without answering for ``seconds``
    (or until the client gives up), then close it: the client's read timeout fires."""
    DROP_AFTER_APPLY = "drop_after_apply"
    """Apply and record the effect, then close the connection without any response."""
    DROP_BEFORE_APPLY = "drop_before_apply"
    """Close the connection without any response and without applying anything."""


class FaultSpecError(ValueError):
    """A fault header or rule that cannot be understood."""


@dataclass(frozen=True)
class Fault:
    """One fault with its parameters (those that do not apply to its kind are ignored)."""

    kind: FaultKind
    latency_ms: int = 0
    status: int = 500
    retry_after: int = 1
    seconds: float | None = None
    """How long ``timeout`` holds the connection; None holds it until the client leaves."""
    apply: bool = True
    """Whether ``timeout`` applies the request before holding."""
    reset: bool = False
    """Drop with a TCP reset (client sees ReadError) instead of a close
    (client sees RemoteProtocolError)."""

    def describe(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "latencyMs": self.latency_ms,
            "status": self.status,
            "retryAfter": self.retry_after,
            "seconds": self.seconds,
            "apply": self.apply,
            "reset": self.reset,
        }


@dataclass
class FaultRule:
    """A fault applied to every matching request, ``remaining`` times (None: forever).

    The match fields are ANDed; a rule without any matches every faultable request.
    """

    id: int
    fault: Fault
    idempotency_key: str | None = None
    key_prefix: str | None = None
    path: str | None = None
    path_prefix: str | None = None
    method: str | None = None
    remaining: int | None = None

    def matches(self, method: str, path: str, key: str | None) -> bool:
        if self.method is not None and self.method != method:
            return False
        if self.path is not None and self.path != path:
            return False
        if self.path_prefix is not None and not path.startswith(self.path_prefix):
            return False
        if self.idempotency_key is not None and self.idempotency_key != key:
            return False
        return self.key_prefix is None or (key is not None and key.startswith(self.key_prefix))

    def describe(self) -> dict[str, Any]:
        return {
            "id": self.id,
            **self.fault.describe(),
            "idempotencyKey": self.idempotency_key,
            "keyPrefix": self.key_prefix,
            "path": self.path,
            "pathPrefix": self.path_prefix,
            "method": self.method,
            "times": self.remaining,
        }


@dataclass
class FaultTable:
    """The installed rules, first match wins. Not locked: it is only touched from the
    event loop, and :meth:`take` does not await."""

    rules: list[FaultRule] = field(default_factory=list)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def add(self, payload: object) -> list[FaultRule]:
        """Install the rules of a ``POST /v1/faults`` body (one rule object or a list)."""
        items = payload if isinstance(payload, list) else [payload]
        if not items:
            raise FaultSpecError("no rules given")
        new = [_rule(next(self._ids), item) for item in items]
        self.rules.extend(new)
        return new

    def clear(self) -> None:
        self.rules.clear()

    def take(self, method: str, path: str, key: str | None) -> Fault | None:
        """The fault for this request, if any rule matches; uses up one of its times."""
        for rule in self.rules:
            if rule.matches(method, path, key):
                if rule.remaining is not None:
                    rule.remaining -= 1
                    if rule.remaining <= 0:
                        self.rules.remove(rule)
                return rule.fault
        return None


_FAULT_FIELDS = {"kind", "latencyMs", "status", "retryAfter", "seconds", "apply", "reset"}
_MATCH_FIELDS = {"idempotencyKey", "keyPrefix", "path", "pathPrefix", "method", "times"}


def _rule(rule_id: int, item: object) -> FaultRule:
    if not isinstance(item, dict):
        raise FaultSpecError("a fault rule must be a JSON object")
    unknown = set(item) - _FAULT_FIELDS - _MATCH_FIELDS
    if unknown:
        raise FaultSpecError(f"unknown fault rule field(s): {', '.join(sorted(unknown))}")
    fault = fault_from({k: v for k, v in item.items() if k in _FAULT_FIELDS})
    texts = {name: item.get(name) for name in _MATCH_FIELDS - {"times"}}
    for name, value in texts.items():
        if value is not None and (not isinstance(value, str) or not value):
            raise FaultSpecError(f"{name} must be a non-empty string")
    times = item.get("times")
    if times is not None and (type(times) is not int or times < 1):
        raise FaultSpecError("times must be a positive integer or null")
    method = texts["method"]
    return FaultRule(
        id=rule_id,
        fault=fault,
        idempotency_key=texts["idempotencyKey"],
        key_prefix=texts["keyPrefix"],
        path=texts["path"],
        path_prefix=texts["pathPrefix"],
        method=method.upper() if method else None,
        remaining=times,
    )


def fault_from(spec: Mapping[str, object]) -> Fault:
    """Build a fault from JSON-typed fields (``kind`` plus optional parameters)."""
    raw_kind = spec.get("kind")
    try:
        kind = FaultKind(str(raw_kind).replace("-", "_").lower())
    except ValueError:
        names = ", ".join(k.value for k in FaultKind)
        raise FaultSpecError(f"fault kind must be one of {names}") from None
    fault = Fault(
        kind=kind,
        latency_ms=_int(spec, "latencyMs", 0, 0, 600_000),
        status=_int(spec, "status", 500, 400, 599),
        retry_after=_int(spec, "retryAfter", 1, 0, 86_400),
        seconds=_seconds(spec.get("seconds")),
        apply=_bool(spec, "apply", True),
        reset=_bool(spec, "reset", False),
    )
    return fault


def parse_header(value: str) -> Fault:
    """``X-Sandbox-Fault: timeout; seconds=2; apply=false`` (parameters as in the JSON
    rules; kinds may use ``-`` for ``_``)."""
    kind, *params = (part.strip() for part in value.split(";"))
    spec: dict[str, object] = {"kind": kind}
    for param in params:
        name, sep, text = param.partition("=")
        name, text = name.strip(), text.strip()
        if not sep or name not in _FAULT_FIELDS - {"kind"}:
            raise FaultSpecError(f"bad X-Sandbox-Fault parameter {param!r}")
        spec[name] = _header_value(text)
    return fault_from(spec)


def _header_value(text: str) -> object:
    if text in ("true", "false"):
        return text == "true"
    if text in ("null", "forever"):
        return None
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        raise FaultSpecError(f"bad X-Sandbox-Fault value {text!r}") from None


def _int(spec: Mapping[str, object], name: str, default: int, low: int, high: int) -> int:
    value = spec.get(name, default)
    if type(value) is not int or not low <= value <= high:
        raise FaultSpecError(f"{name} must be an integer in {low}..{high}")
    return value


def _bool(spec: Mapping[str, object], name: str, default: bool) -> bool:
    value = spec.get(name, default)
    if not isinstance(value, bool):
        raise FaultSpecError(f"{name} must be true or false")
    return value


def _seconds(value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 3600:
        raise FaultSpecError("seconds must be a number in (0, 3600] or null")
    return float(value)
