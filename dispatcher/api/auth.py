"""Producer authentication: ``Authorization: Bearer <api key>``, each key bound to one
tenant and a set of scopes. Only SHA-256 hashes of keys are configured."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from fastapi import Request

from dispatcher.control.actor import Actor
from dispatcher.errors import Forbidden, Unauthenticated
from dispatcher.settings import ApiKey, Scope, hash_api_key


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated API key: its tenant, scopes and name."""

    tenant: str
    scopes: frozenset[str]
    name: str
    key_id: str = ""
    """A short prefix of the key's SHA-256: names a key configured without a name."""

    @property
    def identity(self) -> str:
        """Who acted, as recorded on approvals, stops and retries."""
        return self.name or f"key:{self.key_id}"

    def actor(self) -> Actor:
        """This key as the actor of a command (approvals, stops, retries, escalations)."""
        return Actor(self.identity, self.tenant, "api")

    def require(self, scope: Scope) -> None:
        if scope not in self.scopes:
            raise Forbidden(f"this API key lacks the {scope!r} scope", scope=scope)


class ApiKeyAuth:
    def __init__(self, keys: Iterable[ApiKey]) -> None:
        self._by_hash = {
            k.sha256: Principal(k.tenant, frozenset(k.scopes), k.name, k.sha256[:12]) for k in keys
        }

    def authenticate(self, request: Request) -> Principal:
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthenticated("send 'Authorization: Bearer <api key>'")
        principal = self._by_hash.get(hash_api_key(token.strip()))
        if principal is None:
            raise Unauthenticated("the API key is not valid")
        return principal
