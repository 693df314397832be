"""The capability registry: what each tool is, where its provider lives, and the
policies that govern it. Loaded from a server-side TOML file only; a request never
names a URL."""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from dispatcher.errors import CapabilityNotFound, ValidationFailed


class _Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


class Endpoint(_Model):
    method: Literal["GET", "POST", "PUT", "PATCH", "DELETE"] = "POST"
    url: str = Field(pattern=r"^https?://")
    timeout_seconds: float = Field(default=10.0, gt=0)


class RetryPolicy(_Model):
    """Retries of requests that provably never reached the provider (same key)."""

    max_attempts: int = Field(default=4, ge=1, le=50)
    initial_backoff_seconds: float = Field(default=0.2, gt=0)
    max_backoff_seconds: float = Field(default=10.0, gt=0)


class ReconcilePolicy(_Model):
    """How the reconciler settles a call whose outcome is unknown (see
    :mod:`reconciler.policy` for the full decision table)."""

    # Lookups (and compensations) before the call is escalated; each failed one waits
    # initial_delay * 2**(n-1), at most max_delay, before the next.
    max_attempts: int = Field(default=10, ge=1)
    initial_delay_seconds: float = Field(default=1.0, gt=0)
    max_delay_seconds: float = Field(default=300.0, gt=0)
    # Escalate once this long has passed since the call was dispatched (None: no
    # deadline, only max_attempts).
    deadline_seconds: float | None = Field(default=None, gt=0)
    # How long the provider remembers idempotency keys; past it a re-send is unsafe and
    # a lookup by key proves nothing.
    idempotency_window_seconds: float = Field(default=86400.0, gt=0)
    # The provider has no record of the request: send it again with the same key, or
    # take the absence as the failure.
    on_not_found: Literal["redispatch", "confirm_failure"] = "redispatch"
    # How long after it was dispatched a request may still reach the provider (held by
    # a proxy, a queue, a retransmission). Until then "no record" proves nothing, so a
    # call that must not be re-sent (onNotFound = "confirm_failure", or a stopped run's
    # call awaiting compensation) is looked up again rather than settled as a failure.
    in_flight_seconds: float = Field(default=30.0, ge=0)
    # The provider says the request failed: take it as the failure (the usual meaning),
    # or send it again with the same key (for providers whose failures are transient
    # and whose keys allow a retry).
    on_failed: Literal["confirm_failure", "redispatch"] = "confirm_failure"
    max_redispatches: int = Field(default=2, ge=0)


FailureClass = Literal["not_sent", "timeout", "connection_lost", "http_5xx"]
"""What a failed attempt was, for a circuit breaker: never reached the provider
(refused, throttled), no answer in time, the connection lost after the request left,
or a 5xx answer."""


class BreakerPolicy(_Model):
    """A circuit breaker shared by every worker: ``threshold`` counted failures within
    ``window_seconds`` open it (the capability is paused for every tenant); after
    ``cool_down_seconds`` its next ``probes`` calls go through; a success closes it, a
    failure opens it again."""

    counts: frozenset[FailureClass] = frozenset(
        {"not_sent", "timeout", "connection_lost", "http_5xx"}
    )
    threshold: int = Field(default=5, ge=1)
    window_seconds: float = Field(default=30.0, gt=0)
    cool_down_seconds: float = Field(default=30.0, gt=0)
    probes: int = Field(default=1, ge=1, le=100)


class Capability(_Model):
    id: str = Field(min_length=1, max_length=200)
    description: str = ""
    side_effects: bool
    requires_approval: bool = False
    enabled: bool = True
    risk: Literal["low", "medium", "high"] = "low"
    policy_version: int = 1
    # How long a proposed call waits for a human decision before the expiry sweeper
    # cancels it (``approval.expired``).
    approval_ttl_seconds: float = Field(default=3600.0, gt=0)
    # Four eyes: the API key that submitted the call may not approve it.
    forbid_self_approval: bool = False
    # A side-effecting call still in flight when its run is stopped: ask for its effect
    # to be undone if it turns out to have happened ("compensate"), or let it stand
    # ("keep", the default: undoing is an effect of its own and needs a compensation
    # endpoint).
    on_run_stopped: Literal["compensate", "keep"] = "keep"
    idempotency_key_template: str | None = None
    request: Endpoint
    # GET the request by the provider's id; the URL holds ``{externalRequestId}``.
    status_lookup: Endpoint | None = None
    # GET the request by its idempotency key, for a call whose response was lost before
    # the provider's id was known; the URL holds ``{idempotencyKey}``. Optional: without
    # it such a call can only be escalated.
    lookup_by_key: Endpoint | None = None
    # Undo a succeeded request; the URL holds ``{externalRequestId}``.
    compensation: Endpoint | None = None
    retry: RetryPolicy = RetryPolicy()
    reconcile: ReconcilePolicy = ReconcilePolicy()
    # A circuit breaker (a ``[capability.breaker]`` table turns it on): without one, a
    # down provider is paused by hand.
    breaker: BreakerPolicy | None = None
    # Whose account the provider credential is: one shared by every tenant (the
    # default: one credential per capability), or each tenant's own (a credential per
    # tenant and capability in the provider secrets; a tenant without one is never sent
    # another's).
    provider_account: Literal["shared", "per_tenant"] = "shared"
    # The idempotency key the provider receives: qualified by the tenant
    # (dispatcher.tenancy.provider_key), or as the tenant wrote it, which only an
    # account of the tenant's own may take: in a shared one two tenants' keys collide.
    provider_keys: Literal["namespaced", "as_written"] = "namespaced"

    @property
    def namespaces_keys(self) -> bool:
        """Whether the provider receives keys qualified by tenant."""
        return self.provider_keys == "namespaced"

    @model_validator(mode="after")
    def _keys_never_meet_in_a_shared_account(self) -> Capability:
        if self.provider_keys == "as_written" and self.provider_account == "shared":
            raise ValueError(
                f'capability {self.id!r}: providerKeys = "as_written" needs '
                'providerAccount = "per_tenant" (in a shared provider account two '
                "tenants' keys would collide)"
            )
        return self

    @field_validator("idempotency_key_template")
    @classmethod
    def _template_text_keeps_the_contract(cls, template: str | None) -> str | None:
        # Values are encoded when a key is rendered, the template's own text is not: text
        # outside the identifier contract would make every call of the capability a 400,
        # so the registry refuses to load instead.
        if template is not None and not _KEY_TEXT.fullmatch(_PLACEHOLDER.sub("", template)):
            raise ValueError('the text of a key template must be printable ASCII without "/"')
        return template


class CapabilityRegistry:
    """Capabilities by id."""

    def __init__(self, capabilities: Mapping[str, Capability]) -> None:
        self._by_id = dict(capabilities)

    def get(self, capability_id: str) -> Capability:
        try:
            return self._by_id[capability_id]
        except KeyError:
            raise CapabilityNotFound(capability_id) from None

    def __iter__(self) -> Any:
        return iter(self._by_id.values())

    def __len__(self) -> int:
        return len(self._by_id)


def load_registry(path: Path) -> CapabilityRegistry:
    """Read ``[[capability]]`` tables from a TOML file. Raises ValueError naming the file
    on any mistake. There is no default: a service that silently fell back to the
    sandbox registry would send real refunds to a local test server."""
    source = path
    try:
        data = tomllib.loads(source.read_text())
        items = [Capability.model_validate(raw) for raw in data.get("capability", [])]
    except ValidationError as exc:
        # One line, the first mistake: what the CLI prints before it exits 2.
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise ValueError(
            f"capability registry {source}: {where + ': ' if where else ''}{first['msg']}"
        ) from exc
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"capability registry {source}: {exc}") from exc
    by_id: dict[str, Capability] = {}
    for cap in items:
        if cap.id in by_id:
            raise ValueError(f"capability registry {source}: duplicate id {cap.id!r}")
        by_id[cap.id] = cap
    return CapabilityRegistry(by_id)


_KEY_TEXT = re.compile(r"[!-.0-~]*")
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_-]+)*)\}")


# What a substituted value keeps unencoded: printable ASCII less "/" (the identifier
# contract) and "%" (so that an encoded value and a literal one never yield one key).
_KEY_SAFE = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) not in "/%")


def render_key_template(template: str, context: Mapping[str, Any]) -> str:
    """Fill ``{name}`` / ``{input.field}`` placeholders; a missing value is a 400, because
    silently keying on an empty string would merge unrelated requests.

    Each value is percent-encoded (UTF-8): the key travels in the provider's
    Idempotency-Key header, which carries printable ASCII only, and the same value
    always yields the same key. A value that already keeps the identifier contract
    (and holds no "%") is substituted unchanged, so such keys are what they were."""

    def lookup(match: re.Match[str]) -> str:
        value: Any = context
        for part in match.group(1).split("."):
            if not isinstance(value, Mapping) or value.get(part) is None:
                raise ValidationFailed(
                    f"the idempotency key template needs {match.group(1)!r}",
                    field=match.group(1),
                )
            value = value[part]
        if isinstance(value, dict | list):
            raise ValidationFailed(f"{match.group(1)!r} must be a scalar to key on")
        return quote(str(value), safe=_KEY_SAFE)

    return _PLACEHOLDER.sub(lookup, template)
