"""Wire models of bulk operations: the body of ``POST /v1/operations`` (a kind, a filter,
what each call's command is given) and what the API, the CLI and the console show of an
operation, of a dry run and of the calls an operation touched."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    RootModel,
    StrictBool,
    model_validator,
)
from pydantic.alias_generators import to_camel

from dispatcher.schemas import Finding, IdempotencyKey, Identifier, StorableText
from dispatcher.states import ExecutionStatus, OperationState

S = ExecutionStatus


class OperationKind(StrEnum):
    """What an operation does to each call its filter selects: the single-call command
    of the same name, with the operation as the cause of each call's event."""

    RETRY = "retry"
    """``failed`` (or ``escalated``) -> ``authorized``, as ``POST .../retry``."""
    RESOLVE = "resolve"
    """An escalated call settled by a finding, as ``POST /v1/escalations/{id}/resolve``."""
    CANCEL = "cancel"
    """A call not dispatched yet (``proposed``, ``authorized``) -> ``cancelled``."""
    RETRY_DEAD_LETTERS = "retry_dead_letters"
    """A dead letter put back in line, as ``POST /v1/outbox/dead-letters/{id}/retry``."""
    DISCARD_DEAD_LETTERS = "discard_dead_letters"
    """A dead letter deleted, as ``POST /v1/outbox/dead-letters/{id}/discard``."""


DEAD_LETTER_KINDS = frozenset(
    {OperationKind.RETRY_DEAD_LETTERS, OperationKind.DISCARD_DEAD_LETTERS}
)
"""Kinds over the outbox's dead letters rather than calls: their filter is a tenant,
``lastError`` and when they were dead-lettered (``since``, ``until``)."""


SOURCES: dict[OperationKind, tuple[ExecutionStatus, ...]] = {
    OperationKind.RETRY: (S.FAILED, S.ESCALATED),
    OperationKind.RESOLVE: (S.ESCALATED,),
    OperationKind.CANCEL: (S.PROPOSED, S.AUTHORIZED),
    OperationKind.RETRY_DEAD_LETTERS: (),
    OperationKind.DISCARD_DEAD_LETTERS: (),
}
"""The statuses each kind may select; a filter's ``status`` is a subset."""

DEFAULT_STATUSES: dict[OperationKind, tuple[ExecutionStatus, ...]] = {
    OperationKind.RETRY: (S.FAILED,),
    OperationKind.RESOLVE: (S.ESCALATED,),
    OperationKind.CANCEL: (S.PROPOSED, S.AUTHORIZED),
    OperationKind.RETRY_DEAD_LETTERS: (),
    OperationKind.DISCARD_DEAD_LETTERS: (),
}

_CAMEL = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)


class OperationFilter(BaseModel):
    """Which calls: every field narrows (none: every call of the kind's statuses)."""

    model_config = _CAMEL

    capability_id: Identifier | None = None
    # Another tenant's calls, or every tenant's, need the `admin` scope; none: the caller's.
    tenant: Identifier | None = None
    every_tenant: StrictBool = False
    status: list[ExecutionStatus] | None = Field(default=None, min_length=1)
    # The start of the call's last error: its class ("provider refused the request").
    last_error: StorableText | None = Field(default=None, min_length=1, max_length=200)
    # The call's last change (when it reached its status), since / before.
    # Strict: an instant is an ISO 8601 string with its offset, not a number.
    since: AwareDatetime | None = Field(default=None, strict=True)
    until: AwareDatetime | None = Field(default=None, strict=True)
    run_id: Identifier | None = None

    @model_validator(mode="after")
    def _one_tenant_scope(self) -> OperationFilter:
        if self.every_tenant and self.tenant is not None:
            raise ValueError("name a tenant or everyTenant, not both")
        if self.since and self.until and self.since >= self.until:
            raise ValueError("since must be before until")
        return self


class OperationRequest(BaseModel):
    """The body of ``POST /v1/operations``."""

    model_config = _CAMEL

    kind: OperationKind
    filter: OperationFilter = Field(default_factory=OperationFilter)
    reason: StorableText = Field(min_length=1, max_length=2000)
    # retry: a fresh idempotency key per call (only when no first request had an effect).
    new_idempotency_key: StrictBool = False
    # resolve: what was established (confirmed_success, confirmed_failure = no effect,
    # compensated).
    finding: Finding | None = None
    dry_run: StrictBool = False
    # The same key again (same tenant) answers the operation it first made.
    idempotency_key: IdempotencyKey | None = None

    @model_validator(mode="after")
    def _fits_its_kind(self) -> OperationRequest:
        if (self.finding is None) == (self.kind is OperationKind.RESOLVE):
            raise ValueError("a finding is given with kind resolve, and only then")
        if self.new_idempotency_key and self.kind is not OperationKind.RETRY:
            raise ValueError("newIdempotencyKey is for kind retry only")
        wanted = self.filter
        if self.kind in DEAD_LETTER_KINDS and (
            wanted.capability_id or wanted.run_id or wanted.status
        ):
            raise ValueError("dead letters are filtered by tenant, lastError, since and until")
        allowed = SOURCES[self.kind]
        wrong = [s.value for s in self.filter.status or () if s not in allowed]
        if wrong:
            raise ValueError(
                f"a {self.kind.value} operation selects calls in {[s.value for s in allowed]},"
                f" not {wrong}"
            )
        return self

    def statuses(self) -> tuple[ExecutionStatus, ...]:
        return tuple(self.filter.status or DEFAULT_STATUSES[self.kind])


class _View(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True)


class CallSample(_View):
    """A call a dry run found."""

    tenant: str
    tool_call_id: str
    run_id: str
    capability_id: str
    status: ExecutionStatus
    last_error: str | None
    updated_at: datetime


class DeadLetterSample(_View):
    """A dead letter a dry run found."""

    tenant: str
    id: int
    topic: str
    key: str
    last_error: str | None
    dead_lettered_at: datetime


class DryRunView(_View):
    """What an operation would touch now: how many calls, and the first of them."""

    dry_run: bool = True
    kind: OperationKind
    filter: dict[str, Any]
    count: int
    sample: list[CallSample] | list[DeadLetterSample]


class OperationView(_View):
    """A submitted operation and its progress (``done + failed`` of ``total``)."""

    operation_id: str
    tenant: str
    kind: OperationKind
    state: OperationState
    filter: dict[str, Any]
    params: dict[str, Any]
    actor: dict[str, Any]
    total: int
    done: int
    failed: int
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    cancelled_by: dict[str, Any] | None

    @property
    def percent(self) -> int:
        """Progress as a whole percentage: 100 once finished by completion, and only
        then (every call can be touched a moment before the operation is completed: a
        bar at 100 beside "running" would say two things)."""
        if self.state is OperationState.COMPLETED or self.total == 0:
            return 100 if self.state is OperationState.COMPLETED else 0
        return min(99, (self.done + self.failed) * 100 // self.total)

    @classmethod
    def of(cls, row: Any) -> OperationView:
        return cls.model_validate({name: row[name] for name in cls.model_fields})


class OperationAnswer(RootModel[DryRunView | OperationView]):
    """A 200 of ``POST /v1/operations``: a dry run's count and sample, or the operation
    an idempotency key made before (a 201 is always the operation just recorded)."""


class TouchedCall(_View):
    """A call an operation touched: moved (``done``) or refused by its command (the
    problem ``code`` says why)."""

    tenant: str
    tool_call_id: str
    outcome: str
    code: str | None
    detail: str | None
    event_id: str | None
    at: datetime


class TouchedCalls(_View):
    """A page of the calls an operation touched; ``next`` is the following page's
    ``after``."""

    calls: list[TouchedCall]
    next: str | None
