"""Asking the provider what became of a request, and asking it to undo one.

Lookups are reads, so any transport error simply means "no answer yet". A
compensation is an effect of its own: it is sent with its own stable key,
``compensate:<idempotencyKey>``, so repeating it after a lost answer undoes the
effect once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any
from urllib.parse import quote

from dispatcher.capabilities import Capability, Endpoint
from dispatcher.provider.contract import (
    Credentials,
    NoTenantCredential,
    ProviderState,
    external_request_id,
    read_json,
    state_of,
    status_word,
)
from dispatcher.provider.transport import (
    MaybeReceived,
    NotSent,
    Reply,
    Transport,
    Unsendable,
    json_body,
)
from reconciler.policy import Observation

# What a lookup observed, by the provider's own word for the request's state.
_OBSERVED = {
    ProviderState.SUCCEEDED: Observation.SUCCEEDED,
    ProviderState.FAILED: Observation.FAILED,
    ProviderState.PENDING: Observation.PENDING,
    ProviderState.PARTIAL: Observation.PARTIAL,
    ProviderState.UNRECOGNISED: Observation.UNREADABLE,
}


@dataclass(frozen=True, slots=True)
class Answer:
    """One lookup's result, kept as evidence."""

    observation: Observation
    via: str
    """``externalRequestId``, ``idempotencyKey`` or ``none``."""
    http_status: int | None = None
    external_request_id: str | None = None
    result: Any = None
    reversed: bool = False
    error: str | None = None

    def evidence(self) -> dict[str, Any]:
        return {
            "observation": self.observation.value,
            "via": self.via,
            "httpStatus": self.http_status,
            "externalRequestId": self.external_request_id,
            "reversed": self.reversed,
            "error": self.error,
        }


class Reversal(StrEnum):
    DONE = "done"
    """The provider undid the effect (or had already)."""
    REFUSED = "refused"
    """The provider answered that it cannot undo it."""
    UNKNOWN = "unknown"
    """No definitive answer: ask again later with the same key."""


@dataclass(frozen=True, slots=True)
class CompensationAnswer:
    outcome: Reversal
    http_status: int | None = None
    body: Any = None
    error: str | None = None

    def evidence(self) -> dict[str, Any]:
        return {
            "compensation": self.outcome.value,
            "httpStatus": self.http_status,
            "error": self.error,
        }


def compensation_key(idempotency_key: str) -> str:
    """The compensation's own stable idempotency key."""
    return f"compensate:{idempotency_key}"


def lookup_urls(capability: Capability, external_request_id: str | None, key: str) -> list[str]:
    """The lookups an operator can run by hand (for the escalation's evidence)."""
    urls = []
    if external_request_id and capability.status_lookup:
        urls.append(_fill(capability.status_lookup, "externalRequestId", external_request_id))
    if capability.lookup_by_key:
        urls.append(_fill(capability.lookup_by_key, "idempotencyKey", key))
    return urls


class ProviderLookup:
    """Lookups and compensations over the process's :class:`Transport`; ``secrets``
    are the provider credentials (a plain mapping: by capability id, shared by every
    tenant), sent as ``Authorization: Bearer``."""

    def __init__(
        self, transport: Transport, secrets: Credentials | Mapping[str, str] | None = None
    ) -> None:
        self._transport = transport
        self._credentials = Credentials.of(secrets)

    async def look_up(
        self,
        capability: Capability,
        *,
        tenant: str,
        external_request_id: str | None,
        idempotency_key: str,
        key_still_remembered: bool,
    ) -> Answer:
        """By the provider's id when known, else by idempotency key, but only while the
        provider still remembers keys: past that, "no record" would prove nothing."""
        if external_request_id and capability.status_lookup:
            endpoint, via = capability.status_lookup, "externalRequestId"
            url = _fill(endpoint, "externalRequestId", external_request_id)
        elif capability.lookup_by_key and key_still_remembered:
            endpoint, via = capability.lookup_by_key, "idempotencyKey"
            url = _fill(endpoint, "idempotencyKey", idempotency_key)
        else:
            why = (
                "no provider id, and the idempotency window has passed"
                if capability.lookup_by_key
                else "no provider id, and the capability has no lookup by key"
            )
            return Answer(Observation.UNKNOWABLE, "none", error=why)
        try:
            reply = await self._transport.send(
                endpoint.method,
                url,
                headers=self._headers(capability, tenant),
                timeout_seconds=endpoint.timeout_seconds,
            )
        except (NotSent, MaybeReceived) as exc:
            # A read: sent or not, it is simply no answer yet.
            error = f"lookup: {type(exc.__cause__).__name__}"
            return Answer(Observation.LOOKUP_FAILED, via, error=error)
        except Unsendable as exc:
            error = f"lookup: request could not be built ({exc}); nothing was sent"
            return Answer(Observation.LOOKUP_FAILED, via, error=error)
        return _classify(reply, via)

    async def compensate(
        self,
        capability: Capability,
        *,
        tenant: str,
        external_request_id: str,
        idempotency_key: str,
    ) -> CompensationAnswer:
        """Ask the provider to undo a succeeded request."""
        endpoint = capability.compensation
        if endpoint is None:
            return CompensationAnswer(Reversal.REFUSED, error="no compensation endpoint")
        try:
            headers = {
                **self._headers(capability, tenant),
                "Idempotency-Key": compensation_key(idempotency_key),
            }
            reply = await self._transport.send(
                endpoint.method,
                _fill(endpoint, "externalRequestId", external_request_id),
                headers=headers,
                body=json_body({"idempotencyKey": idempotency_key}),
                timeout_seconds=endpoint.timeout_seconds,
            )
        except (NotSent, MaybeReceived) as exc:
            # Asked again later under the same key, which undoes the effect once.
            error = f"compensation: {type(exc.__cause__).__name__}"
            return CompensationAnswer(Reversal.UNKNOWN, error=error)
        except Unsendable as exc:
            # Provably not sent, and it never will be: asking again cannot help.
            why = f"compensation: request could not be built ({exc}); nothing was sent"
            return CompensationAnswer(Reversal.REFUSED, error=why)
        status, body = reply.status, read_json(reply)
        if 200 <= status < 300:
            return CompensationAnswer(Reversal.DONE, status, body)
        code = body.get("code") if isinstance(body, dict) else None
        error = f"compensation: HTTP {status} {code or ''}".strip()
        if status in (408, 429) or status >= 500:
            return CompensationAnswer(Reversal.UNKNOWN, status, body, error)
        return CompensationAnswer(Reversal.REFUSED, status, body, error)

    def _headers(self, capability: Capability, tenant: str) -> dict[str, str]:
        try:
            return self._credentials.headers(capability, tenant)
        except NoTenantCredential as exc:
            # Before a byte is written, as for any request that cannot be built.
            raise Unsendable(exc) from exc


def _fill(endpoint: Endpoint, name: str, value: str) -> str:
    return endpoint.url.replace("{" + name + "}", quote(value, safe=""))


def _classify(reply: Reply, via: str) -> Answer:
    status = reply.status
    if status == 404:
        return Answer(Observation.NOT_FOUND, via, status)
    if status != 200:
        return Answer(Observation.LOOKUP_FAILED, via, status, error=f"lookup: HTTP {status}")
    body = read_json(reply)
    if not isinstance(body, dict):
        return Answer(Observation.UNREADABLE, via, status, error="lookup: body is not an object")
    observation = _OBSERVED[state_of(body)]
    return Answer(
        observation,
        via,
        status,
        external_request_id(body),
        body.get("result"),
        body.get("reversed") is True,
        error=f"lookup: unknown status {status_word(body)!r}"
        if observation is Observation.UNREADABLE
        else None,
    )
