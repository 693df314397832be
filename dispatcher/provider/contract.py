"""The provider contract as both sides of the service read it: the worker that sends a
call and the reconciler that asks what became of it. How a provider names the state of
a request, how its bodies are read and how a credential travels.
``docs/provider-contract.md`` is the prose."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from dispatcher.capabilities import Capability
from dispatcher.provider.transport import Reply
from dispatcher.settings import Settings


class ProviderState(StrEnum):
    """A request's state in the provider's own words, folded into what we act on."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    PENDING = "pending"
    PARTIAL = "partial"
    UNRECOGNISED = "unrecognised"


_WORDS: dict[str, ProviderState] = {
    **dict.fromkeys(("succeeded", "completed", "success", "ok"), ProviderState.SUCCEEDED),
    **dict.fromkeys(("failed", "failure", "error", "declined"), ProviderState.FAILED),
    **dict.fromkeys(
        ("pending", "accepted", "processing", "in_progress", "queued"), ProviderState.PENDING
    ),
    **dict.fromkeys(("partial", "partially_succeeded", "partially_applied"), ProviderState.PARTIAL),
}


def status_word(body: Mapping[str, Any]) -> str:
    """The provider's ``status`` field, lower-cased ('' when absent)."""
    return str(body.get("status", "")).lower()


def state_of(body: Mapping[str, Any]) -> ProviderState:
    return _WORDS.get(status_word(body), ProviderState.UNRECOGNISED)


def read_json(reply: Reply) -> Any:
    """The body as JSON, or None when it is not JSON at all."""
    try:
        return json.loads(reply.body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None


def read_object(reply: Reply) -> dict[str, Any]:
    """The body as a JSON object; {} for anything else (nothing in it to act on)."""
    data = read_json(reply)
    return data if isinstance(data, dict) else {}


def external_request_id(body: Mapping[str, Any]) -> str | None:
    """The provider's own id of the request (``externalRequestId``, else ``id``)."""
    value = body.get("externalRequestId") or body.get("id")
    return str(value) if value is not None else None


def credential_headers(secrets: Mapping[str, str], capability_id: str) -> dict[str, str]:
    """The capability's credential as ``Authorization: Bearer``: added at send time
    only, never stored, logged or put in an error."""
    secret = secrets.get(capability_id)
    return {"Authorization": f"Bearer {secret}"} if secret else {}


class NoTenantCredential(Exception):
    """A capability whose provider account is each tenant's own has no credential for
    this tenant: nothing is sent, rather than sent under another account."""


@dataclass(frozen=True, slots=True)
class Credentials:
    """Provider credentials: ``shared`` by capability id (one account for every
    tenant), ``tenants`` by tenant and then capability id (``providerAccount =
    "per_tenant"``: each tenant's own account)."""

    shared: Mapping[str, str] = field(default_factory=dict)
    tenants: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    @classmethod
    def of(cls, secrets: Credentials | Mapping[str, str] | None) -> Credentials:
        """``secrets`` as credentials: a plain mapping is the shared ones."""
        if isinstance(secrets, Credentials):
            return secrets
        return cls(dict(secrets or {}))

    @classmethod
    def configured(cls, settings: Settings) -> Credentials:
        """The credentials ``settings`` name (read from their files now)."""
        return cls(settings.provider_credentials(), settings.tenant_provider_credentials())

    def headers(self, capability: Capability, tenant: str) -> dict[str, str]:
        """The credential ``tenant``'s request to ``capability`` carries. Raises
        :class:`NoTenantCredential` for a per-tenant account without one: the shared
        credential is never a fallback (the request would land in another account)."""
        if capability.provider_account == "shared":
            return credential_headers(self.shared, capability.id)
        own = self.tenants.get(tenant, {})
        if capability.id not in own:
            raise NoTenantCredential(capability.id)
        return credential_headers(own, capability.id)
