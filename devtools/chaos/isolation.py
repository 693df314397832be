"""Invariant 8, no tenant's call affected by another tenant's: pure functions of the
evidence (:class:`devtools.chaos.checker.Evidence`).

The run's two tenants write the same runIds, toolCallIds, correlationIds and, through
the capabilities' templates, the same idempotency keys; one of them makes calls whose
escalations are dead letters. Where their names meet, nothing may pass between them:

- **provider effects**: no provider key is the key of calls of two tenants (the
  provider would take the second for a replay of the first);
- **results**: no provider request is recorded as the result of calls of two tenants,
  and each result the sandbox echoed is the echo of the call's own input;
- **acts**: every act in a tenant's log was made by that tenant (an approval's
  decision, a run's stop: their ``by`` names the actor's tenant), a run stop's
  cancellations and compensation requests fall only in the stopping tenant's run, and
  no submission is refused as ``run_stopped`` for a run its tenant never stopped;
- **the outbox**: no row waits behind a dead letter of another tenant, and no
  tenant's API key is shown another tenant's dead letter.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from dispatcher.ledger.events import EventType
from dispatcher.schemas import EventView

if TYPE_CHECKING:
    from devtools.chaos.checker import CallRecord, DeadLetterSeen, Evidence

# The consequences of a run's stop for each of its calls (dispatcher.control.runs).
_STOP_CONSEQUENCES = (EventType.TOOL_CALL_CANCELLED, EventType.TOOL_CALL_COMPENSATION_REQUESTED)


def isolation(evidence: Evidence) -> list[str]:
    """Every way one tenant's call was affected by another tenant's (the module's list)."""
    calls = list(evidence.calls.values())
    return [
        *shared_provider_keys(calls, evidence.effects),
        *foreign_results(calls),
        *foreign_acts(evidence.events),
        *(f"refused: {r}" for r in evidence.foreign_refusals),
        *held_back(evidence.dead_letters),
        *foreign_listings(evidence.dead_letters, evidence.listed),
    ]


def _by_tenant(pairs: Iterable[tuple[str, str, str]]) -> dict[str, dict[str, list[str]]]:
    """``(name, tenant, toolCallId)`` grouped: name -> tenant -> the calls."""
    grouped: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for name, tenant, call in pairs:
        grouped[name][tenant].append(call)
    return grouped


def _shown(by_tenant: dict[str, list[str]]) -> str:
    return "; ".join(f"{t}: {', '.join(sorted(ids)[:3])}" for t, ids in sorted(by_tenant.items()))


def shared_provider_keys(calls: Sequence[CallRecord], effects: Mapping[str, int]) -> list[str]:
    grouped = _by_tenant((c.provider_key, c.tenant, c.tool_call_id) for c in calls)
    return [
        f"provider key {key} is the key of calls of {len(by_tenant)} tenants"
        f" ({_shown(by_tenant)}), {effects.get(key, 0)} effect(s) applied under it"
        for key, by_tenant in sorted(grouped.items())
        if len(by_tenant) > 1
    ]


def foreign_results(calls: Sequence[CallRecord]) -> list[str]:
    grouped = _by_tenant(
        (c.external_request_id, c.tenant, c.tool_call_id) for c in calls if c.external_request_id
    )
    found = [
        f"provider request {request} is the result of calls of {len(by_tenant)} tenants"
        f" ({_shown(by_tenant)})"
        for request, by_tenant in sorted(grouped.items())
        if len(by_tenant) > 1
    ]
    for call in calls:
        result = call.result
        if isinstance(result, dict) and "echo" in result and result["echo"] != call.input:
            found.append(
                f"{call.tenant}/{call.tool_call_id}: its result echoes a body that is not"
                f" its input: {str(result['echo'])[:120]}"
            )
    return found


def foreign_acts(events: Sequence[tuple[str, EventView]]) -> list[str]:
    stopped = {(t, e.run_id) for t, e in events if e.event_type == EventType.RUN_STOPPED}
    found = []
    for tenant, event in events:
        who = f"{tenant}/{event.tool_call_id or event.run_id}"
        by = event.payload.get("by")
        # An act's actor: an API key names its tenant, the operator's CLI none.
        if isinstance(by, dict) and by.get("tenant") not in (None, tenant):
            found.append(f"{who}: {event.event_type} by {by.get('name')} of tenant {by['tenant']}")
        stop_consequence = event.event_type in _STOP_CONSEQUENCES and (
            event.event_type != EventType.TOOL_CALL_CANCELLED or event.payload.get("runStopped")
        )
        if stop_consequence and (tenant, event.run_id) not in stopped:
            found.append(
                f"{who}: {event.event_type}, and {tenant} never stopped run {event.run_id}"
            )
    return found


def held_back(dead_letters: Iterable[DeadLetterSeen]) -> list[str]:
    return [
        f"row {row.id} of tenant {row.tenant} waited behind dead letter {dead.id} of tenant"
        f" {dead.tenant} (key {dead.key})"
        for dead in dead_letters
        for row in dead.waiting
        if row.tenant != dead.tenant
    ]


def foreign_listings(
    dead_letters: Iterable[DeadLetterSeen], listed: Mapping[str, Collection[int]]
) -> list[str]:
    owners = {dead.id: dead.tenant for dead in dead_letters}
    return [
        f"tenant {tenant}'s API key was shown dead letter {row} of tenant {owners[row]}"
        for tenant, rows in sorted(listed.items())
        for row in rows
        if row in owners and owners[row] != tenant
    ]


def shared_names(calls: Iterable[CallRecord]) -> dict[str, int]:
    """How many names calls of more than one tenant carry: what invariant 8 had to
    bite on (a figure of the report)."""
    names: dict[str, defaultdict[str, set[str]]] = {
        "runId": defaultdict(set),
        "toolCallId": defaultdict(set),
        "idempotencyKey": defaultdict(set),
    }
    for call in calls:
        names["runId"][call.run_id].add(call.tenant)
        names["toolCallId"][call.tool_call_id].add(call.tenant)
        names["idempotencyKey"][call.idempotency_key].add(call.tenant)
    return {kind: sum(len(t) > 1 for t in seen.values()) for kind, seen in names.items()}
