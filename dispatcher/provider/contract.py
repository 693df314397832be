"""The provider contract as both sides of the service read it: the worker that sends a
call and the reconciler that asks what became of it. How a provider names the state of
a request, how its bodies are read, how a credential travels, and the shape of the
connection pools. ``docs/provider-contract.md`` is the prose."""

from __future__ import annotations

import json
from collections.abc import Mapping
from enum import StrEnum
from typing import Any

import httpx


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


def read_json(response: httpx.Response) -> Any:
    """The body as JSON, or None when it is not JSON at all."""
    try:
        return response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None


def read_object(response: httpx.Response) -> dict[str, Any]:
    """The body as a JSON object; {} for anything else (nothing in it to act on)."""
    data = read_json(response)
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


# Connections per pool for the worker: httpcore's per-request bookkeeping grows with
# the pool's size, so many small pools beat one large one (see ProviderClient).
CONNECTIONS_PER_POOL = 2


def pool(size: int) -> httpx.AsyncClient:
    """One pool of ``size`` kept-alive connections to providers."""
    return httpx.AsyncClient(
        limits=httpx.Limits(
            max_connections=size,
            max_keepalive_connections=size,
            # Shorter than a provider's idle timeout, so a pooled connection is not
            # reused just as the server closes it.
            keepalive_expiry=2.0,
        ),
        follow_redirects=False,
    )


def pools(connections: int) -> list[httpx.AsyncClient]:
    """``connections`` provider connections in pools of at most
    :data:`CONNECTIONS_PER_POOL`."""
    sizes = [CONNECTIONS_PER_POOL] * (connections // CONNECTIONS_PER_POOL)
    if connections % CONNECTIONS_PER_POOL:
        sizes.append(connections % CONNECTIONS_PER_POOL)
    return [pool(size) for size in sizes]
