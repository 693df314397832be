"""Operator commands on capabilities: pause and resume, for the caller's tenant or (the
``admin`` scope) for every tenant, and the capabilities as a tenant sees them.

The moves and their facts are :mod:`dispatcher.ledger.pauses`; this module checks what
the caller may name and builds the views.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.capabilities import Capability, CapabilityRegistry
from dispatcher.capability_views import (
    BreakerView,
    CapabilityChange,
    CapabilityList,
    CapabilityView,
    PauseRequest,
    PauseView,
)
from dispatcher.control.actor import Actor
from dispatcher.db.pauses import EVERY_TENANT
from dispatcher.db.tables import tool_calls
from dispatcher.ledger.breakers import Breaker, close, not_closed
from dispatcher.ledger.pauses import ScopeState, after_resume, move_capability, paused_for
from dispatcher.settings import DEFAULT_TOPICS, Topics
from dispatcher.states import BreakerState, CapabilityStatus
from dispatcher.states import ExecutionStatus as S


async def change_capability(
    session: AsyncSession,
    capability_id: str,
    request: PauseRequest,
    target: CapabilityStatus,
    *,
    tenant: str,
    actor: Actor,
    registry: CapabilityRegistry,
    topics: Topics = DEFAULT_TOPICS,
) -> CapabilityChange:
    """Pause (``target`` paused) or resume the capability for ``tenant``, or for every
    tenant with ``request.every_tenant`` (the caller checked the ``admin`` scope), in
    the caller's transaction. Raises ``CapabilityNotFound`` for a capability the
    registry does not hold."""
    capability = registry.get(capability_id)
    scope = EVERY_TENANT if request.every_tenant else tenant
    if target is CapabilityStatus.ACTIVE and request.every_tenant:
        # An operator who resumes every tenant overrides the breaker: it closes, or the
        # workers would hold back every call the resume lets by. The resume below lifts
        # the pause, the breaker's included, as the operator's fact.
        await close(
            session,
            capability.id,
            reason=f"circuit breaker reset by an operator: {request.reason}",
            topics=topics,
            sources=(BreakerState.OPEN, BreakerState.HALF_OPEN),
            lift_pause=False,
        )
    _, changed = await move_capability(
        session,
        capability.id,
        scope,
        target,
        actor=actor.as_payload(),
        reason=request.reason,
        topics=topics,
    )
    return CapabilityChange(
        capability=(await views(session, [capability], tenant))[0], changed=changed
    )


async def after_change(
    sessions: async_sessionmaker[AsyncSession], change: CapabilityChange, target: CapabilityStatus
) -> None:
    """What follows the commit of :func:`change_capability`: a resume is timed after it,
    so the drain also finds the calls whose commands a claim dropped while it committed."""
    if change.changed and target is CapabilityStatus.ACTIVE:
        await after_resume(sessions, change.capability.capability_id)


async def list_capabilities(
    session: AsyncSession, registry: CapabilityRegistry, *, tenant: str
) -> CapabilityList:
    """Every registered capability as ``tenant`` sees it, in the registry's order."""
    return CapabilityList(capabilities=await views(session, list(registry), tenant))


async def views(
    session: AsyncSession, capabilities: Sequence[Capability], tenant: str
) -> list[CapabilityView]:
    states = await paused_for(session, tenant)
    breakers = await not_closed(session)
    counted = await session.execute(
        select(tool_calls.c.capability_id, func.count())
        .where(tool_calls.c.status == S.AUTHORIZED, tool_calls.c.tenant == tenant)
        .group_by(tool_calls.c.capability_id)
    )
    waiting = {capability_id: int(n) for capability_id, n in counted}
    return [
        _view(c, states.get(c.id, []), int(waiting.get(c.id, 0)), _breaker(c, breakers))
        for c in capabilities
    ]


def _breaker(capability: Capability, found: Mapping[str, Breaker]) -> BreakerView | None:
    """Its breaker as the table holds it (no row, or closed: closed)."""
    if capability.breaker is None:
        return None
    breaker = found.get(capability.id)
    if breaker is None:
        return BreakerView(state=BreakerState.CLOSED)
    classes = [str(e.get("class")) for e in breaker.evidence]
    return BreakerView(state=breaker.state, failures=breaker.failures, evidence=classes)


def _view(
    capability: Capability, scopes: list[ScopeState], waiting: int, breaker: BreakerView | None
) -> CapabilityView:
    pauses = [
        PauseView(
            every_tenant=s.every_tenant, reason=s.reason, by=dict(s.actor), since=s.changed_at
        )
        for s in scopes
        if s.status is CapabilityStatus.PAUSED
    ]
    return CapabilityView(
        capability_id=capability.id,
        side_effects=capability.side_effects,
        requires_approval=capability.requires_approval,
        status=CapabilityStatus.PAUSED if pauses else CapabilityStatus.ACTIVE,
        pauses=pauses,
        waiting=waiting,
        breaker=breaker,
    )
