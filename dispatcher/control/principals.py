"""Who may act: API keys, each bound to one tenant and a set of scopes. Only SHA-256
hashes of keys are configured; the HTTP API and the console both look callers up here,
so a key means the same in both."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from dispatcher.control.actor import Actor
from dispatcher.errors import Forbidden
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

    def actor(self, via: str = "api") -> Actor:
        """This key as the actor of a command (approvals, stops, retries, escalations)."""
        return Actor(self.identity, self.tenant, via)

    def may(self, scope: Scope) -> bool:
        return scope in self.scopes

    def require(self, scope: Scope) -> None:
        if scope not in self.scopes:
            raise Forbidden(f"this API key lacks the {scope!r} scope", scope=scope)


class Keyring:
    """The configured keys, by the SHA-256 of the key."""

    def __init__(self, keys: Iterable[ApiKey]) -> None:
        self._by_hash = {
            k.sha256: Principal(k.tenant, frozenset(k.scopes), k.name, k.sha256[:12]) for k in keys
        }

    def by_key(self, key: str) -> tuple[str, Principal] | None:
        """The key's hash and principal, or None for a key nobody configured."""
        digest = hash_api_key(key)
        principal = self._by_hash.get(digest)
        return None if principal is None else (digest, principal)

    def by_hash(self, digest: str) -> Principal | None:
        """The principal of a key known by its hash (a console session holds only it)."""
        return self._by_hash.get(digest)
