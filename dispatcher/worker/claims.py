"""Point A: claiming calls (``-> dispatching``) under a worker's lease, many per
transaction.

A batch claim is one conditional UPDATE of every named call that is still in the
expected state (plus its events, and the outbox rows of those published: a claim's
``tool.call.dispatching`` is in the log only, a re-send's ``tool.call.redispatched`` is
published): a duplicate command, a call already claimed or recorded, or one that is not
``authorized`` is simply not in the result.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import (
    BindParameter,
    ColumnElement,
    Float,
    Text,
    any_,
    bindparam,
    cast,
    func,
    literal_column,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher.capabilities import Capability
from dispatcher.db.tables import tool_calls
from dispatcher.ledger.breakers import BREAKER_VIA
from dispatcher.ledger.events import CallContext, EventType, is_published
from dispatcher.ledger.leases import take_lease
from dispatcher.ledger.messages import Producer
from dispatcher.ledger.pauses import not_paused
from dispatcher.ledger.transitions import BulkMove, move_many
from dispatcher.settings import Topics
from dispatcher.states import ExecutionStatus as S
from dispatcher.tenancy import stored_provider_key


@dataclass(frozen=True, slots=True)
class Claim:
    tool_call_id: str
    capability: Capability
    provider_key: str
    """The key the provider receives (``tool_calls.provider_key``)."""
    input: dict[str, Any]
    correlation_id: str | None
    version: int
    lease_seconds: float
    claimed_at: float
    # A reconciler's re-send: a final answer settles the call (-> confirmed) instead of
    # completing or failing it, because the call was already in doubt.
    settles: bool = False
    # Kept when the answer carries none (a re-send of a call the provider already named).
    external_request_id: str | None = None
    # A toolCallId is unique only within its tenant: (tenant, tool_call_id) is the call.
    tenant: str = field(kw_only=True)
    # Its events' ids (run, turn, ...), as the claim's UPDATE returned them: the outcome's
    # event is built before the outcome's statement, so nothing is read back for it.
    context: CallContext = field(kw_only=True)
    # The call's stored trace context (tool_calls.traceparent) and agent tool, for its
    # spans and its provider requests' traceparent.
    traceparent: str | None = field(default=None, kw_only=True)
    tool_name: str | None = field(default=None, kw_only=True)
    # A half-open breaker's probe: claimed and sent through the breaker's own pause.
    probe: bool = field(default=False, kw_only=True)
    # Claims of the call so far, this one included.
    dispatch_attempts: int = field(default=1, kw_only=True)

    @property
    def key(self) -> tuple[str, str]:
        return (self.tenant, self.tool_call_id)


def lease_seconds(capability: Capability, minimum: float, margin: float) -> float:
    """Long enough for every attempt the retry policy allows, plus a margin: a lease
    that lapses while the worker is still legitimately sending would hand a live call
    to the recovery sweep."""
    policy = capability.retry
    worst = (
        capability.request.timeout_seconds * policy.max_attempts
        + policy.max_backoff_seconds * (policy.max_attempts - 1)
    )
    return max(minimum, worst + margin)


def by_capability(name: str, seconds: Mapping[str, float]) -> BindParameter[Any]:
    """Seconds per capability id as one JSON parameter: a statement covering calls of
    several capabilities keeps one constant text, whatever the registry holds."""
    return bindparam(name, dict(seconds), type_=JSONB)


def seconds_of(table: BindParameter[Any]) -> ColumnElement[Any]:
    """The interval that ``table`` (see :func:`by_capability`) gives each row."""
    looked_up = cast(table[tool_calls.c.capability_id].astext, Float)
    return looked_up * literal_column("interval '1 second'")


async def claim_calls(
    session: AsyncSession,
    moves: Sequence[BulkMove],
    *,
    capabilities: Mapping[str, Capability],
    leases: Mapping[str, float],
    owner: str,
    producer: Producer,
    topics: Topics,
    expected: S = S.AUTHORIZED,
    event_type: EventType = EventType.TOOL_CALL_DISPATCHING,
    fence_owner: str | None = None,
    settles: bool = False,
    probe: bool = False,
) -> list[Claim]:
    """Move every call of ``moves`` that is still ``expected`` (and, when given, held by
    ``fence_owner`` at its move's version) to ``dispatching`` under ``owner``'s lease,
    in the caller's transaction; the caller's commit is point A.

    ``leases`` gives the lease of each capability by id; a call whose capability has
    none is not claimed. A move without ``dispatch_attempts`` in its values counts the
    attempt in SQL. ``probe``: the calls are a half-open breaker's probes, claimed
    through the pause the breaker holds (its caller spent the breaker's probes).
    """
    # Before the statement: its snapshot is no older (a circuit breaker's gate relies on
    # it), and a lease judged from it lapses early rather than late.
    started = time.monotonic()
    leased = by_capability("leases", leases)
    fields: dict[str, Any] = {
        **take_lease(owner, func.now() + seconds_of(leased)),
        # A re-send keeps the first dispatch time: the provider's idempotency window is
        # counted from it.
        "dispatched_at": func.coalesce(tool_calls.c.dispatched_at, func.now())
        if settles
        else func.now(),
    }
    if moves and "dispatch_attempts" not in moves[0].values:
        fields["dispatch_attempts"] = tool_calls.c.dispatch_attempts + 1
    moved = await move_many(
        session,
        moves,
        expected=expected,
        target=S.DISPATCHING,
        event_type=event_type,
        producer=producer,
        topics=topics,
        lease_owner=fence_owner,
        fields=fields,
        with_input=True,
        where=[
            tool_calls.c.capability_id
            == any_(bindparam("capabilities", list(leases), type_=ARRAY(Text))),
            # A paused capability's calls wait in their state: the command is dropped
            # here, and written again when it resumes (dispatcher.worker.redrive).
            # A probe goes through its breaker's pause only.
            not_paused(tool_calls, but_via=BREAKER_VIA if probe else None),
        ],
        # The claim's identity (owner, version): every outcome recorded for it names the
        # same, so the log shows which claim each outcome ended (the chaos checker's fence).
        row_payload=lambda row: {
            "worker": owner,
            "claimVersion": row["version"],
            "leaseSeconds": leases[row["capability_id"]],
        },
        # The same, for the statement that writes the events of a claim, which are in
        # the log only; a re-send's are published, and built in Python.
        payload_sql=None
        if is_published(event_type.value) or any(m.payload for m in moves)
        else lambda moved: {
            "worker": cast(bindparam("claim_owner", owner, type_=Text), Text),
            "claimVersion": moved.c.version,
            # The number as the parameter holds it (60.0), as Python's JSON writes it.
            "leaseSeconds": leased.op("->", return_type=JSONB)(moved.c.capability_id),
        },
    )
    return [
        _claim_of(m.row, capabilities, leases, started, settles=settles, probe=probe) for m in moved
    ]


def _claim_of(
    row: Any,
    capabilities: Mapping[str, Capability],
    leases: Mapping[str, float],
    claimed_at: float,
    *,
    settles: bool,
    probe: bool,
) -> Claim:
    return Claim(
        row.tool_call_id,
        capabilities[row.capability_id],
        stored_provider_key(row.tenant, row.idempotency_key, row.provider_key),
        row.input,
        row.correlation_id,
        row.version,
        leases[row.capability_id],
        claimed_at,
        settles,
        row.external_request_id,
        tenant=row.tenant,
        context=CallContext.of(row._mapping),
        traceparent=row.traceparent,
        tool_name=row.tool_name,
        probe=probe,
        dispatch_attempts=row.dispatch_attempts,
    )
