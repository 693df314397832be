"""Where one tenant's names meet another's, and how they are kept apart.

A ``runId``, a ``toolCallId`` and an ``idempotencyKey`` are unique only within their
tenant: two tenants may both run ``run-1``. Two places see every tenant's names in one
space, so each name is qualified by its tenant there:

- **the outbox and the broker** order messages by key: :func:`ordering_key` is the key
  of every row tool-dispatcher writes, so one tenant's dead letter holds back only its
  own tenant's rows, and one tenant's messages never share another's order;
- **the provider**, when tenants share a provider account (one credential per
  capability, the default), remembers idempotency keys in one space:
  :func:`provider_key` is the key such a provider receives, so two tenants' requests
  never answer for each other.

Both functions are part of the public contract (``docs/design.md``): consumers see
ordering keys on the wire, and providers see provider keys. Each is injective: the
tenant is escaped so that it never contains the separator, and ids never contain it
either (the identifier contract), so splitting at the first separator gives back the
tenant and the name.
"""

from __future__ import annotations

from urllib.parse import quote

ORDERING_SEPARATOR = "/"
PROVIDER_SEPARATOR = ":"

# What ordering_key escapes in a tenant, in this order ("%" first, so that an escaped
# "/" and a literal "%2F" never meet).
_ORDERING_ESCAPES = (("%", "%25"), ("/", "%2F"))


def ordering_key(tenant: str, name: str) -> str:
    """The outbox (and Kafka record) key of a message about ``name`` (a ``runId`` for
    events, a ``toolCallId`` for commands and escalations) of ``tenant``:
    ``<tenant>/<name>``, the tenant's ``%`` and ``/`` percent-encoded
    (``acme/run-1``; tenant ``a/b`` gives ``a%2Fb/run-1``)."""
    escaped = tenant
    for raw, encoded in _ORDERING_ESCAPES:
        escaped = escaped.replace(raw, encoded)
    return f"{escaped}{ORDERING_SEPARATOR}{name}"


def ordering_key_sql(tenant: str, name: str) -> str:
    """:func:`ordering_key` as a SQL expression over the column expressions ``tenant``
    and ``name``, for statements that build their messages from the rows they insert
    (``tests/unit`` holds the two equal)."""
    escaped = tenant
    for raw, encoded in _ORDERING_ESCAPES:
        escaped = f"replace({escaped}, '{raw}', '{encoded}')"
    return f"{escaped} || '{ORDERING_SEPARATOR}' || {name}"


# What a tenant keeps unencoded in a provider key: printable ASCII less "/" (keys keep
# the identifier contract: they travel in a header and in lookup URLs), "%" (the
# escape itself) and ":" (the separator).
_PROVIDER_SAFE = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) not in "/%:")


def provider_key(tenant: str, idempotency_key: str, *, namespaced: bool = True) -> str:
    """The idempotency key a provider receives for ``tenant``'s call keyed
    ``idempotency_key``: ``<tenant>:<key>``, the tenant percent-encoded (UTF-8) but for
    printable ASCII other than ``/``, ``%`` and ``:`` (``acme:refund:o-1:c-9``).

    ``namespaced`` False (a capability whose provider account is the tenant's own:
    ``providerKeys = "as_written"``) sends the key as the tenant wrote it.

    Computed once, at intake (or when an operator's retry takes a new key), and kept on
    the call (:func:`key_to_store`, :func:`stored_provider_key`): every send, lookup
    and compensation of the call uses the kept one.
    """
    if not namespaced:
        return idempotency_key
    return f"{quote(tenant, safe=_PROVIDER_SAFE)}{PROVIDER_SEPARATOR}{idempotency_key}"


def stored_provider_key(tenant: str, idempotency_key: str, stored: str | None) -> str:
    """The key a call's provider receives, from its row: the stored one, or, where none
    is stored (``tool_calls.provider_key`` NULL), the namespaced form of the call's own
    idempotency key. Intake stores NULL for exactly that form, so no key is kept twice;
    :func:`provider_key` is a public contract and does not change, so the key a call
    was first sent with is the key it keeps."""
    return stored if stored is not None else provider_key(tenant, idempotency_key)


def key_to_store(tenant: str, idempotency_key: str, *, namespaced: bool) -> str | None:
    """What ``tool_calls.provider_key`` holds for a call keyed ``idempotency_key``:
    NULL for the namespaced form (:func:`stored_provider_key` gives it back), else the
    key as written."""
    return None if namespaced else idempotency_key
