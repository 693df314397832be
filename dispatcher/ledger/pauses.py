"""Pausing and resuming a capability: the only code that moves ``capability_states``.

A pause holds a capability's calls in ``authorized`` for one tenant, or for every tenant
(``tenant = ''``). Each move is a conditional statement by
:data:`~dispatcher.states.CAPABILITY_TRANSITIONS` (a pause of a paused scope, or a resume
of an active one, moves nothing and writes nothing), and each move writes its fact: a
``capability_events`` row and a message on the events topic, in the same transaction.

Who honours a pause reads :func:`not_paused` (the worker's claim, the redrive) or
:func:`paused_scopes` (the reconciler), so a pause committed before their statement
holds every call it covers.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Select,
    Table,
    and_,
    exists,
    func,
    insert,
    or_,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.db.pauses import EVERY_TENANT
from dispatcher.db.tables import capability_events, capability_states
from dispatcher.ids import random_uuid
from dispatcher.ledger.marks import look_again_now
from dispatcher.ledger.messages import Producer, ce_source, enqueue, outbox_row
from dispatcher.settings import Topics
from dispatcher.states import CAPABILITY_TRANSITIONS, CapabilityStatus


class CapabilityEventType(StrEnum):
    """The facts of a capability's state; each has a JSON Schema in ``docs/events``."""

    PAUSED = "capability.paused"
    RESUMED = "capability.resumed"
    BREAKER_OPENED = "capability.breaker_opened"
    BREAKER_CLOSED = "capability.breaker_closed"


log = logging.getLogger(__name__)

_EVENT_OF = {
    CapabilityStatus.PAUSED: CapabilityEventType.PAUSED,
    CapabilityStatus.ACTIVE: CapabilityEventType.RESUMED,
}
_PAUSED = CapabilityStatus.PAUSED.value


@dataclass(frozen=True, slots=True)
class ScopeState:
    """One scope's state: a capability for ``tenant`` (``''``: every tenant)."""

    capability_id: str
    tenant: str
    status: CapabilityStatus
    reason: str
    actor: Mapping[str, Any]
    changed_at: datetime
    resumed_at: datetime | None = None

    @classmethod
    def of(cls, row: Mapping[Any, Any]) -> ScopeState:
        return cls(
            row["capability_id"], row["tenant"], CapabilityStatus(row["status"]), row["reason"],
            row["actor"], row["changed_at"], row["resumed_at"],
        )  # fmt: skip

    @property
    def every_tenant(self) -> bool:
        return self.tenant == EVERY_TENANT


def not_paused(calls: Table, *, but_via: str | None = None) -> ColumnElement[bool]:
    """True for rows of ``calls`` (``tool_calls``) whose capability is not paused for
    their tenant nor for every tenant: a primary-key probe of a table of a few rows.
    ``but_via``: a pause made that way does not count (a breaker's probes go through
    the breaker's own pause, never through an operator's)."""
    held = exists().where(
        capability_states.c.capability_id == calls.c.capability_id,
        or_(
            capability_states.c.tenant == calls.c.tenant,
            capability_states.c.tenant == EVERY_TENANT,
        ),
        capability_states.c.status == _PAUSED,
    )
    if but_via is not None:
        held = held.where(capability_states.c.actor["via"].astext.is_distinct_from(but_via))
    return ~held


def paused_scopes_query() -> Select[Any]:
    return select(capability_states.c.capability_id, capability_states.c.tenant).where(
        capability_states.c.status == _PAUSED
    )


async def paused_scopes(session: AsyncSession) -> frozenset[tuple[str, str]]:
    """Every paused ``(capability_id, tenant)``; ``tenant`` ``''`` is every tenant."""
    rows = await session.execute(paused_scopes_query())
    return frozenset((r.capability_id, r.tenant) for r in rows)


def recently_resumed_query(within_seconds: float) -> Select[Any]:
    return select(capability_states).where(
        capability_states.c.status == CapabilityStatus.ACTIVE.value,
        capability_states.c.resumed_at
        > func.now() - func.make_interval(0, 0, 0, 0, 0, 0, within_seconds),
    )


async def recently_resumed(session: AsyncSession, within_seconds: float) -> list[ScopeState]:
    """The scopes resumed within the last ``within_seconds`` and still active."""
    rows = await session.execute(recently_resumed_query(within_seconds))
    return [ScopeState.of(r._mapping) for r in rows]


def is_paused(scopes: frozenset[tuple[str, str]], capability_id: str, tenant: str) -> bool:
    return (capability_id, tenant) in scopes or (capability_id, EVERY_TENANT) in scopes


def paused_for_query(tenant: str) -> Select[Any]:
    return (
        select(capability_states)
        .where(
            capability_states.c.tenant.in_([tenant, EVERY_TENANT]),
            capability_states.c.status == _PAUSED,
        )
        .order_by(capability_states.c.tenant)
    )


async def paused_for(session: AsyncSession, tenant: str) -> dict[str, list[ScopeState]]:
    """The pauses that hold ``tenant``'s calls (its own and every tenant's), by
    capability id."""
    found: dict[str, list[ScopeState]] = {}
    for row in await session.execute(paused_for_query(tenant)):
        found.setdefault(row.capability_id, []).append(ScopeState.of(row._mapping))
    return found


async def move_capability(
    session: AsyncSession,
    capability_id: str,
    tenant: str,
    target: CapabilityStatus,
    *,
    actor: Mapping[str, Any],
    reason: str,
    topics: Topics,
    paused_via: str | None = None,
) -> tuple[ScopeState | None, bool]:
    """Move the scope to ``target`` if the table allows it from where it is; its state
    afterwards (None: never paused) and whether it moved (then with its fact). ``actor``
    is who moved it (``Actor.as_payload()``). ``paused_via``: resume only a pause made
    that way (a circuit breaker lifts its own pause, never an operator's)."""
    sources = [s.value for s, targets in CAPABILITY_TRANSITIONS.items() if target in targets]
    values = {
        "status": target.value,
        "reason": reason,
        "actor": dict(actor),
        # The database's clock, as every other fact's time.
        "changed_at": func.now(),
    }
    if target is CapabilityStatus.ACTIVE:
        resume = (
            update(capability_states)
            .where(
                capability_states.c.capability_id == capability_id,
                capability_states.c.tenant == tenant,
                capability_states.c.status.in_(sources),
            )
            # Before the commit; its resumer moves it past the commit (after_resume).
            .values(**values, resumed_at=func.now(), version=capability_states.c.version + 1)
        )
        if paused_via is not None:
            resume = resume.where(capability_states.c.actor["via"].astext == paused_via)
        result = await session.execute(resume.returning(*capability_states.c))
    else:
        new = pg_insert(capability_states).values(
            capability_id=capability_id, tenant=tenant, **values
        )
        pause = new.on_conflict_do_update(
            index_elements=["capability_id", "tenant"],
            set_={**values, "version": capability_states.c.version + 1},
            where=capability_states.c.status.in_(sources),
        )
        result = await session.execute(pause.returning(*capability_states.c))
    moved = result.first()
    if moved is None:
        current = (
            await session.execute(
                select(capability_states).where(
                    and_(
                        capability_states.c.capability_id == capability_id,
                        capability_states.c.tenant == tenant,
                    )
                )
            )
        ).first()
        return (ScopeState.of(current._mapping) if current else None), False
    state = ScopeState.of(moved._mapping)
    await record_fact(session, _EVENT_OF[state.status], state, topics)
    return state, True


async def after_resume(sessions: async_sessionmaker[AsyncSession], capability_id: str) -> None:
    """What follows the commit of a resume of ``capability_id``, in a transaction begun
    after it: call it once the resume's transaction is over.

    It times the resume again, by this transaction's clock. The drain
    (:func:`dispatcher.worker.redrive.redrive_resumed`) writes again the commands of the
    calls authorized before ``resumed_at`` whose commands are older, and a claim whose
    snapshot was taken before the resume committed still saw the pause and dropped its
    command, though its call may have been authorized after the resume's transaction
    began (the time it wrote, ``changed_at``): timed after the commit, the drain finds
    that call too. A resume timed so already is left alone. And the reconciler's looks
    that the pause put off are due at once (:func:`~dispatcher.ledger.marks.look_again_now`).

    Never raises: the resume stands, and if this fails or never runs (its process died
    first), the regular redrive and the put-off looks' own times find those calls later."""
    try:
        await _after_resume(sessions, capability_id)
    except Exception:
        log.exception("resume of %s committed, but not timed after its commit", capability_id)


async def _after_resume(sessions: async_sessionmaker[AsyncSession], capability_id: str) -> None:
    async with sessions() as session, session.begin():
        timed = await session.execute(
            update(capability_states)
            .where(
                capability_states.c.capability_id == capability_id,
                capability_states.c.status == CapabilityStatus.ACTIVE.value,
                capability_states.c.resumed_at == capability_states.c.changed_at,
            )
            .values(resumed_at=func.now())
            .returning(capability_states.c.tenant)
        )
        for tenant in timed.scalars().all():
            await look_again_now(session, capability_id, tenant)


async def record_fact(
    session: AsyncSession,
    event_type: CapabilityEventType,
    state: ScopeState,
    topics: Topics,
    extra: Mapping[str, Any] | None = None,
    producer: Producer = Producer.OPERATOR,
) -> None:
    """A capability's fact in the log and on the events topic (the outbox, this
    transaction). ``extra``: fields of the event's own besides the common ones."""
    event_id = f"evt_{random_uuid().replace('-', '')}"
    await session.execute(
        insert(capability_events).values(
            event_id=event_id,
            event_type=event_type.value,
            capability_id=state.capability_id,
            tenant=state.tenant,
            actor=dict(state.actor),
            reason=state.reason,
            occurred_at=state.changed_at,
        )
    )
    payload = {
        "eventId": event_id,
        "eventType": event_type.value,
        "capabilityId": state.capability_id,
        "tenant": None if state.every_tenant else state.tenant,
        "by": dict(state.actor),
        "reason": state.reason,
        "occurredAt": state.changed_at.isoformat(),
        **(extra or {}),
    }
    message = outbox_row(
        topic=topics.events,
        key=f"capability/{state.capability_id}",
        type=event_type.value,
        source=ce_source(producer),
        payload=payload,
        time=state.changed_at,
    )
    await enqueue(session, [message])
