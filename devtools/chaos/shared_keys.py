"""``python -m devtools.chaos.shared_keys <command> ...``: `tool-dispatcher`
with tenants' names meeting ON PURPOSE, for proving that the chaos checker catches one
tenant's call affected by another's (`python -m devtools chaos --plant shared-keys`, which
runs the API, the workers, the relays and the reconciler through it). Never run it
against a real provider or a real outbox.

The defence: where every tenant's names meet, the outbox's ordering keys and the
provider's idempotency keys, :mod:`dispatcher.tenancy` qualifies each name by its
tenant. Here both functions (and the SQL twin of the first) give the name alone, so
two tenants' calls with the same idempotency key are one request to the provider, and
a tenant's dead letter holds back another tenant's rows of the same id.

The product is left as it is: :mod:`dispatcher.tenancy` is rebound in this process
only, before any module that takes its functions is imported (the statements that build
their messages in SQL take the key expression when they are imported), and the CLI then
runs as usual.
"""

from __future__ import annotations

import sys

from dispatcher import tenancy

# This module's packages: the only ones of the dispatcher loaded before the rebinding.
_ALLOWED_EARLY = frozenset(
    {
        "dispatcher",
        "dispatcher.tenancy",
        "devtools",
        "devtools.chaos",
        "devtools.chaos.shared_keys",
    }
)


def shared_ordering_key(tenant: str, name: str) -> str:
    return name


def shared_ordering_key_sql(tenant: str, name: str) -> str:
    return name


def shared_provider_key(tenant: str, idempotency_key: str, *, namespaced: bool = True) -> str:
    return idempotency_key


def shared_key_to_store(tenant: str, idempotency_key: str, *, namespaced: bool) -> str:
    # Stored as written, so every process sends the shared key, planted or not.
    return idempotency_key


def arm() -> None:
    """Rebind the key functions; refuses if a module that could hold the real ones
    (imported with ``from dispatcher.tenancy import ...``) is loaded already."""
    early = sorted(
        m for m in sys.modules if m.startswith("dispatcher.") and m not in _ALLOWED_EARLY
    )
    if early:
        raise RuntimeError(f"loaded before the keys were rebound: {', '.join(early)}")
    tenancy.ordering_key = shared_ordering_key
    tenancy.ordering_key_sql = shared_ordering_key_sql
    tenancy.provider_key = shared_provider_key
    tenancy.key_to_store = shared_key_to_store


def main() -> int:
    arm()
    from tool_dispatcher.main import main as cli

    return cli(sys.argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
