"""Wire models of a capability's state: the body of a pause or a resume, and what
``GET /v1/capabilities`` answers. Like :mod:`dispatcher.schemas`, nothing here touches
the database (the HTTP client loads it)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from dispatcher.schemas import StorableText
from dispatcher.states import BreakerState, CapabilityStatus


class PauseRequest(BaseModel):
    """The body of ``POST /v1/capabilities/{capabilityId}/pause`` and ``/resume``."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )

    reason: StorableText = Field(min_length=1, max_length=2000)
    # Every tenant's calls (the `admin` scope), or only the caller's tenant's.
    every_tenant: bool = False


class _View(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True)


class PauseView(_View):
    """A pause that holds the caller's calls of a capability."""

    every_tenant: bool
    reason: str
    by: dict[str, Any]
    since: datetime


class BreakerView(_View):
    """A capability's circuit breaker, shared by every tenant: ``closed`` (its calls go),
    ``open`` (it paused the capability for every tenant) or ``half_open`` (a probe may
    go). ``failures``: counted in its current window; ``evidence``: the classes of its
    last failures."""

    state: BreakerState
    failures: int = 0
    evidence: list[str] = Field(default_factory=list)


class CapabilityView(_View):
    """A registered capability as the caller's tenant sees it: ``paused`` while a pause of
    its own tenant or of every tenant holds its calls (``pauses`` lists them)."""

    capability_id: str
    side_effects: bool
    requires_approval: bool
    status: CapabilityStatus
    pauses: list[PauseView] = Field(default_factory=list)
    waiting: int = 0
    """The caller's calls of it waiting in ``authorized`` (held while it is paused)."""
    breaker: BreakerView | None = None
    """Its circuit breaker; None when the registry gives it none."""


class CapabilityChange(_View):
    """The answer to a pause or a resume: the capability as it is now, and whether this
    command moved it (a pause of a paused scope moves nothing and records nothing)."""

    capability: CapabilityView
    changed: bool


class CapabilityList(_View):
    capabilities: list[CapabilityView]
