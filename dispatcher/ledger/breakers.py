"""Circuit breakers: the only code that moves ``capability_breakers``.

A capability's breaker is shared by every worker through its row: a failed attempt is
counted by one upsert (:func:`count_failure`), and the count that reaches the threshold
within the window opens the breaker in the same transaction, which pauses the
capability for every tenant (:mod:`dispatcher.ledger.pauses`, by the breaker: an
operator's pause is never lifted by it) and records ``capability.breaker_opened`` with
its evidence. After the cool-down, :func:`arm_probes` lets a few calls through;
:func:`close` ends it on a probe's success and lifts its own pause.

Every move is a conditional UPDATE by :data:`~dispatcher.states.BREAKER_TRANSITIONS`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import bindparam, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher.capabilities import BreakerPolicy, FailureClass
from dispatcher.db.pauses import EVERY_TENANT
from dispatcher.ledger.messages import Producer
from dispatcher.ledger.pauses import CapabilityEventType, ScopeState, move_capability, record_fact
from dispatcher.metrics import BREAKER_TRANSITIONS
from dispatcher.settings import Topics
from dispatcher.states import BreakerState, CapabilityStatus, breaker_sources
from dispatcher.webhooks.events import BREAKER_CLOSED, BREAKER_OPENED
from dispatcher.webhooks.notify import notify

BREAKER_VIA = "breaker"
BREAKER_ACTOR: Mapping[str, Any] = {"name": "circuit-breaker", "tenant": None, "via": BREAKER_VIA}
"""Who moves a capability when its breaker does (``actor`` of its facts)."""

# A breaker keeps its last 10 failures as the evidence of its opening (_COUNT's LIMIT).


@dataclass(frozen=True, slots=True)
class Breaker:
    """A breaker's row, as a move left it."""

    capability_id: str
    state: BreakerState
    failures: int
    evidence: list[dict[str, Any]]
    probes_left: int

    @classmethod
    def of(cls, row: Any) -> Breaker:
        return cls(
            row.capability_id, BreakerState(row.state), row.failures, row.evidence,
            row.probes_left,
        )  # fmt: skip


# One failure more, in the window that is still open or in a new one; the evidence
# keeps the last few failures, oldest first.
_COUNT = text("""
INSERT INTO capability_breakers AS b
    (capability_id, state, failures, window_started_at, evidence, updated_at)
VALUES (:capability_id, 'closed', 1, now(),
        jsonb_build_array(:failure || jsonb_build_object('at', now())), now())
ON CONFLICT (capability_id) DO UPDATE SET
    failures = CASE WHEN b.window_started_at > now() - make_interval(secs => :window)
                    THEN b.failures + 1 ELSE 1 END,
    window_started_at = CASE WHEN b.window_started_at > now() - make_interval(secs => :window)
                             THEN b.window_started_at ELSE now() END,
    evidence = (
        SELECT jsonb_agg(kept.e ORDER BY kept.n)
        FROM (
            SELECT e, n FROM jsonb_array_elements(b.evidence || excluded.evidence)
                WITH ORDINALITY AS t(e, n)
            ORDER BY n DESC LIMIT 10
        ) AS kept
    ),
    updated_at = now()
RETURNING capability_id, state, failures, evidence, probes_left
""").bindparams(bindparam("failure", type_=JSONB))


async def count_failure(
    session: AsyncSession,
    capability_id: str,
    policy: BreakerPolicy,
    failure: FailureClass,
    *,
    topics: Topics,
) -> Breaker:
    """Count one failed attempt in the caller's transaction; open the breaker if that
    reaches the threshold (or a probe failed). Returns the breaker as it is now."""
    counted = (
        await session.execute(
            _COUNT,
            {
                "capability_id": capability_id,
                "failure": {"class": failure},
                "window": policy.window_seconds,
            },
        )
    ).one()
    breaker = Breaker.of(counted)
    due = breaker.state is BreakerState.HALF_OPEN or (
        breaker.state is BreakerState.CLOSED and breaker.failures >= policy.threshold
    )
    if not due:
        return breaker
    return await _open(session, breaker, policy, topics) or breaker


_OPEN = text("""
UPDATE capability_breakers
SET state = 'open', opened_at = now(), probes_left = 0,
    probe_at = now() + make_interval(secs => :cool_down),
    version = version + 1, updated_at = now()
WHERE capability_id = :capability_id AND state = ANY(:sources)
RETURNING capability_id, state, failures, evidence, probes_left
""")


async def _open(
    session: AsyncSession, breaker: Breaker, policy: BreakerPolicy, topics: Topics
) -> Breaker | None:
    """Open the breaker (closed, or half-open after a failed probe), pause the
    capability for every tenant, and record the fact; None if another got there first."""
    row = (
        await session.execute(
            _OPEN,
            {
                "capability_id": breaker.capability_id,
                "cool_down": policy.cool_down_seconds,
                "sources": breaker_sources(BreakerState.OPEN),
            },
        )
    ).first()
    if row is None:
        return None
    opened = Breaker.of(row)
    BREAKER_TRANSITIONS.labels(opened.capability_id, opened.state.value).inc()
    reason = _reason(breaker, policy)
    state, paused = await move_capability(
        session,
        opened.capability_id,
        EVERY_TENANT,
        CapabilityStatus.PAUSED,
        actor=BREAKER_ACTOR,
        reason=reason,
        topics=topics,
    )
    # Timed as the pause it made, or now when the capability was paused already.
    pause = state if paused else None
    await _fact(session, CapabilityEventType.BREAKER_OPENED, opened, reason, pause, topics)
    return opened


def _reason(breaker: Breaker, policy: BreakerPolicy) -> str:
    if breaker.state is BreakerState.HALF_OPEN:
        return "circuit breaker opened again: a probe call failed"
    classes = ", ".join(sorted({str(e.get("class")) for e in breaker.evidence}))
    return (
        f"circuit breaker opened: {breaker.failures} failures within "
        f"{policy.window_seconds:g}s ({classes})"
    )


async def _fact(
    session: AsyncSession,
    event_type: CapabilityEventType,
    breaker: Breaker,
    reason: str,
    pause: ScopeState | None,
    topics: Topics,
) -> None:
    """The breaker's fact, timed as the pause it moved (the database's clock)."""
    at = pause.changed_at if pause is not None else None
    if at is None:
        at = (await session.execute(text("SELECT now()"))).scalar_one()
    status = (
        CapabilityStatus.ACTIVE
        if event_type is CapabilityEventType.BREAKER_CLOSED
        else CapabilityStatus.PAUSED
    )
    scope = ScopeState(breaker.capability_id, EVERY_TENANT, status, reason, BREAKER_ACTOR, at)
    await record_fact(
        session,
        event_type,
        scope,
        topics,
        {"evidence": breaker.evidence},
        producer=Producer.WORKER,
    )
    # Every tenant's subscribers are told: a breaker holds every tenant's calls.
    await notify(
        session,
        event_type=_WEBHOOK_OF[event_type],
        tenant=None,
        data={
            "capabilityId": breaker.capability_id,
            "reason": reason,
            "evidence": breaker.evidence,
            "occurredAt": at.isoformat(),
        },
    )


_WEBHOOK_OF = {
    CapabilityEventType.BREAKER_OPENED: BREAKER_OPENED,
    CapabilityEventType.BREAKER_CLOSED: BREAKER_CLOSED,
}


_ARM = text("""
UPDATE capability_breakers
SET state = 'half_open',
    probes_left = (CAST(:probes AS jsonb) ->> capability_id)::int,
    probe_at = now() + make_interval(
        secs => (CAST(:cool_down AS jsonb) ->> capability_id)::float),
    version = version + 1, updated_at = now()
WHERE state = ANY(:sources) AND probe_at <= now() AND capability_id = ANY(:capabilities)
RETURNING capability_id, state, failures, evidence, probes_left
""")


async def arm_probes(session: AsyncSession, policies: Mapping[str, BreakerPolicy]) -> list[Breaker]:
    """Half-open every breaker whose cool-down ended (or whose probes went unanswered
    for a cool-down: their worker died): its next ``probes`` calls may go."""
    if not policies:
        return []
    rows = await session.execute(
        _ARM,
        {
            "probes": _json({c: p.probes for c, p in policies.items()}),
            "cool_down": _json({c: p.cool_down_seconds for c, p in policies.items()}),
            "sources": breaker_sources(BreakerState.HALF_OPEN),
            "capabilities": list(policies),
        },
    )
    armed = [Breaker.of(r) for r in rows]
    for breaker in armed:
        BREAKER_TRANSITIONS.labels(breaker.capability_id, breaker.state.value).inc()
    return armed


def _json(value: Mapping[str, Any]) -> str:
    return json.dumps(dict(value))


_TAKE = text("""
UPDATE capability_breakers SET probes_left = probes_left - :taken, updated_at = now()
WHERE capability_id = :capability_id AND state = 'half_open' AND probes_left >= :taken
RETURNING capability_id, state, failures, evidence, probes_left
""")


async def take_probes(session: AsyncSession, capability_id: str, taken: int) -> bool:
    """Spend ``taken`` of a half-open breaker's probes, in the transaction that claims
    the probe calls (it holds the row: two workers never spend the same probe)."""
    row = (await session.execute(_TAKE, {"capability_id": capability_id, "taken": taken})).first()
    return row is not None


async def probes_left(session: AsyncSession, capability_id: str) -> int:
    """How many probes a half-open breaker still allows (0 otherwise), its row locked."""
    found = await session.execute(
        text(
            "SELECT probes_left FROM capability_breakers "
            "WHERE capability_id = :id AND state = 'half_open' FOR UPDATE"
        ),
        {"id": capability_id},
    )
    return int(found.scalar() or 0)


_CLOSE = text("""
UPDATE capability_breakers
SET state = 'closed', failures = 0, window_started_at = now(), evidence = '[]',
    opened_at = NULL, probe_at = NULL, probes_left = 0,
    version = version + 1, updated_at = now()
WHERE capability_id = :capability_id AND state = ANY(:sources)
RETURNING capability_id, state, failures, evidence, probes_left
""")


async def close(
    session: AsyncSession,
    capability_id: str,
    *,
    reason: str,
    topics: Topics,
    sources: Sequence[BreakerState] = (BreakerState.HALF_OPEN,),
    lift_pause: bool = True,
) -> bool:
    """Close the breaker (from ``sources``: a probe's success closes a half-open one,
    an operator's resume any), lift the breaker's own pause (unless its caller lifts
    the pause itself), and record the fact."""
    allowed = [s.value for s in sources if s.value in breaker_sources(BreakerState.CLOSED)]
    row = (
        await session.execute(_CLOSE, {"capability_id": capability_id, "sources": allowed})
    ).first()
    if row is None:
        return False
    BREAKER_TRANSITIONS.labels(capability_id, BreakerState.CLOSED.value).inc()
    state, lifted = None, False
    if lift_pause:
        state, lifted = await move_capability(
            session,
            capability_id,
            EVERY_TENANT,
            CapabilityStatus.ACTIVE,
            actor=BREAKER_ACTOR,
            reason=reason,
            topics=topics,
            paused_via=BREAKER_VIA,
        )
    resume = state if lifted else None
    await _fact(
        session, CapabilityEventType.BREAKER_CLOSED, Breaker.of(row), reason, resume, topics
    )
    return True


async def not_closed(session: AsyncSession) -> dict[str, Breaker]:
    """Every breaker that is open or half-open, by capability id (a handful of rows)."""
    rows = await session.execute(
        text(
            "SELECT capability_id, state, failures, evidence, probes_left "
            "FROM capability_breakers WHERE state <> 'closed'"
        )
    )
    return {r.capability_id: Breaker.of(r) for r in rows}
