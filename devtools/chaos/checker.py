"""The ten invariants a chaos run must end with, checked against what the database
recorded, what the provider (the sandbox) actually did, what the API answered and what
the broker kept of the request records sent to bus intake.

:func:`check` is pure (evidence in, violations out);
:func:`devtools.chaos.evidence.gather` collects the evidence from the run's
database, the sandbox, the load and the dead letters the harness handled.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from devtools.chaos.isolation import isolation
from dispatcher.ledger.messages import Producer
from dispatcher.schemas import EventView
from dispatcher.states import SETTLED_STATES
from dispatcher.states import ExecutionStatus as S
from dispatcher.states import VerificationStatus as V
from dispatcher.views.run_view import fold_run

INVARIANTS: dict[int, str] = {
    1: "every acknowledged submission exists, with its events",
    2: "every call is terminal or escalated",
    3: "the provider applied at most one effect per key, as each call's status says",
    4: "replaying the event log reproduces each call's status",
    5: "no outbox row left unpublished, no dead letter unexplained",
    6: "every hostile submission refused with a 4xx, no valid one refused as invalid",
    7: "every move out of a claim was made by the claim's holder at its version",
    8: "no tenant's call is affected by another tenant's",
    9: "retention archives a call once, only when it is finished, and nothing moves after",
    10: "every request record the broker kept is answered once: one call or one refusal",
}

_NO_EFFECT = {S.FAILED, S.REJECTED, S.CANCELLED}
SIZE_ERROR = "MessageSizeTooLargeError"
"""What the relay records on a row the broker's client refuses for its size."""

CallId = tuple[str, str]
"""A call's name: ``(tenant, toolCallId)`` (a toolCallId alone is unique only per tenant)."""


@dataclass(frozen=True, slots=True)
class CallRecord:
    tool_call_id: str
    tenant: str
    run_id: str
    status: S
    verification: V
    provider_key: str
    """The key the call is sent with (``tool_calls.provider_key``), which the
    provider's books know it by."""
    side_effects: bool = True
    """A read-only call's request changes nothing: only deduplication is checked."""
    idempotency_key: str = ""
    """The key as the tenant wrote it (or its capability's template made it)."""
    input: Mapping[str, Any] = field(default_factory=dict)
    result: Any = None
    """What the provider answered the call with (the sandbox echoes the body it applied)."""
    external_request_id: str | None = None

    @property
    def name(self) -> CallId:
        return (self.tenant, self.tool_call_id)


@dataclass(frozen=True, slots=True)
class Waiting:
    """An outbox row left unpublished behind a dead letter of its key."""

    id: int
    tenant: str | None
    """The tenant its payload names."""


@dataclass(frozen=True, slots=True)
class DeadLetterSeen:
    """A dead-lettered outbox row as the harness found it, before handling it."""

    id: int
    topic: str
    key: str
    tenant: str | None
    """The tenant its payload names (every message tool-dispatcher writes names one)."""
    tool_call_id: str | None
    """The call its payload is about (None for a run's events)."""
    size: int
    """Bytes of its key, payload and headers as stored (about what the broker is sent)."""
    error: str | None
    waiting: tuple[Waiting, ...] = ()
    """The rows of its key that waited behind it when it was found."""


@dataclass(frozen=True, slots=True)
class BusAnswer:
    """A reply bus intake recorded (an outbox row on a replies topic)."""

    event_id: str
    """The request's ``ce_id`` (the reply's ``ce_requestid`` header)."""
    tenant: str
    outcome: str
    """``accepted`` or ``refused``."""
    tool_call_id: str | None = None
    code: str | None = None
    """A refusal's problem code."""


@dataclass
class Evidence:
    """Everything the invariants are checked against."""

    acknowledged: Sequence[CallId]
    """Calls the API answered with a 2xx."""
    replay_mismatches: Sequence[str]
    """Replays answered with anything but the original call (described)."""
    calls: Mapping[CallId, CallRecord]
    events: Sequence[tuple[str, EventView]]
    """The whole event log, in order, each event with its tenant."""
    effects: Mapping[str, int]
    reversals: Mapping[str, int]
    unpublished: int = 0
    dead_letters: Sequence[DeadLetterSeen] = ()
    """Every dead letter the run made, those the harness discarded included."""
    oversized: Collection[CallId] = ()
    """Calls the load made too large to announce, on purpose."""
    max_message_bytes: int | None = None
    """The relay's limit on a message (None: its default, which nothing here exceeds)."""
    listed: Mapping[str, Collection[int]] = field(default_factory=dict)
    """The dead letters each tenant's API key was shown (by tenant)."""
    discarded: Mapping[int, str] = field(default_factory=dict)
    """What the API answered each discard of a dead letter by its tenant (by row id)."""
    foreign_refusals: Sequence[str] = ()
    """Submissions refused as ``run_stopped`` for a run their tenant never stopped."""
    commands_reemitted: int = 0
    """Dispatch commands beyond each call's first (re-drives, read-only re-dispatches)."""
    taken_over: int = 0
    """Calls the recovery sweep took from a worker lost between claim and outcome."""
    escalation_reasons: Mapping[str, int] = field(default_factory=dict)
    hostile_misanswered: Sequence[str] = ()
    """Hostile submissions (the load's hostile_input share) answered other than 4xx."""
    valid_refused: Sequence[str] = ()
    """Valid submissions refused with a 4xx other than the load's own run stops."""
    largest_published: int = 0
    """Bytes of the largest message published (a figure: the limit's headroom)."""
    retention_breaches: Sequence[str] = ()
    """What the archive shows retention did wrong (:func:`devtools.chaos.retention.breaches`)."""
    archived_calls: int = 0
    """Calls the retention job archived and removed (they are in ``calls`` too)."""
    bus_kept: Mapping[str, int] = field(default_factory=dict)
    """Request records the broker kept at the end of the run, by event id (``ce_id``)."""
    bus_unreadable: int = 0
    """Request records kept without a readable ``ce_id`` (no one to answer; a figure)."""
    bus_clashing: int = 0
    """Request records at an offset the broker gave two records, not in ``bus_kept``
    (:class:`devtools.chaos.bus_evidence.Kept`; a figure)."""
    bus_answers: Sequence[BusAnswer] = ()
    """Every reply bus intake recorded."""
    bus_sent_acked: Mapping[str, int] = field(default_factory=dict)
    """Sends of each event the broker acknowledged to the load."""
    bus_sent_maybe: Mapping[str, int] = field(default_factory=dict)
    """Sends of each event that failed without knowing whether they were written."""
    bus_hostile: Collection[str] = ()
    """The events the load sent with a hostile body."""


def unsettled(calls: Iterable[CallRecord]) -> list[CallRecord]:
    return [c for c in calls if c.status not in SETTLED_STATES]


def check(evidence: Evidence) -> dict[int, list[str]]:
    """Violations by invariant number (every invariant present, empty when it holds)."""
    violations: dict[int, list[str]] = {n: [] for n in INVARIANTS}
    calls = evidence.calls
    with_events = {(tenant, e.tool_call_id) for tenant, e in evidence.events}
    for name in evidence.acknowledged:
        shown = "/".join(name)
        if name not in calls:
            violations[1].append(f"{shown}: acknowledged, not in the database")
        elif name not in with_events:
            violations[1].append(f"{shown}: acknowledged, no events")
    violations[1] += [f"replay: {m}" for m in evidence.replay_mismatches]

    violations[2] = [
        f"{c.tenant}/{c.tool_call_id}: stuck in {c.status.value}" for c in unsettled(calls.values())
    ]

    keys = {c.provider_key for c in calls.values()}
    for call in calls.values():
        violations[3] += _effects(
            call,
            evidence.effects.get(call.provider_key, 0),
            evidence.reversals.get(call.provider_key, 0),
        )
    for key, applied in sorted(evidence.effects.items()):
        if key not in keys and applied:
            violations[3].append(f"key {key}: {applied} effect(s) that no call accounts for")

    violations[4] = _replayed(evidence.events, calls)
    violations[5] = outbox_left(evidence)
    violations[6] = [f"hostile: {h}" for h in evidence.hostile_misanswered]
    violations[6] += [f"valid refused: {v}" for v in evidence.valid_refused]
    violations[7] = unfenced(evidence.events)
    violations[8] = isolation(evidence)
    violations[9] = list(evidence.retention_breaches)
    violations[10] = answered_once(evidence)
    return violations


def answered_once(evidence: Evidence) -> list[str]:
    """Invariant 10, per event id: every record the broker kept has a reply (a record
    never answered is lost); no more replies than records, unless a broker restart
    forgot some after they were answered, which the load's sends bound (more is a
    redelivery answered again); the accepting replies of one event name one call, a
    call of the run; and a hostile event is never accepted."""
    answers: defaultdict[str, list[BusAnswer]] = defaultdict(list)
    for answer in evidence.bus_answers:
        answers[answer.event_id].append(answer)
    found = []
    for event_id in sorted(evidence.bus_kept.keys() | answers.keys()):
        kept, got = evidence.bus_kept.get(event_id, 0), answers.get(event_id, [])
        sent = evidence.bus_sent_acked.get(event_id, 0) + evidence.bus_sent_maybe.get(event_id, 0)
        who = f"event {event_id}: {kept} record(s) kept, {len(got)} answered"
        if len(got) < kept:
            found.append(f"{who}: a record never answered")
        # One send may make two records (a producer's retry of a batch): max, not sum.
        if len(got) > max(kept, sent):
            found.append(f"{who}, {sent} sent: a record answered twice")
        accepted = [a for a in got if a.outcome == "accepted"]
        calls = sorted({str(a.tool_call_id) for a in accepted})
        if len(calls) > 1:
            found.append(f"{who}: accepted as {len(calls)} calls ({', '.join(calls)})")
        for name in sorted({(a.tenant, str(a.tool_call_id)) for a in accepted}):
            if name not in evidence.calls:
                found.append(f"{who}: accepted as {'/'.join(name)}, which is no call of the run")
        if accepted and event_id in evidence.bus_hostile:
            found.append(f"{who}: a hostile record accepted as {', '.join(calls)}")
    return found


def _effects(call: CallRecord, applied: int, reversed_: int) -> list[str]:
    who = f"{call.tenant}/{call.tool_call_id} ({call.status.value}, key {call.provider_key})"
    if applied > 1:
        return [f"{who}: applied {applied} times"]
    if not call.side_effects:
        return []
    success = call.status is S.COMPLETED or (
        call.status is S.CONFIRMED and call.verification is V.CONFIRMED_SUCCESS
    )
    failure = call.status in _NO_EFFECT or (
        call.status is S.CONFIRMED and call.verification is V.CONFIRMED_FAILURE
    )
    if success and applied != 1:
        return [f"{who}: settled as success, {applied} effects"]
    if failure and applied != 0:
        return [f"{who}: settled as failure, {applied} effect(s)"]
    if call.status is S.COMPENSATED and (applied != 1 or reversed_ != 1):
        return [f"{who}: compensated, {applied} effect(s), {reversed_} reversal(s)"]
    if reversed_ and call.status not in (S.COMPENSATED, S.ESCALATED):
        return [f"{who}: reversed {reversed_} time(s) but not compensated"]
    return []


def explained(dead: DeadLetterSeen, oversized: Collection[CallId], limit: int | None) -> bool:
    """A dead letter the run caused on purpose: a message about a call the load made
    oversized, of that call's own tenant, larger than the relay's ``limit`` and refused
    for its size. Anything else dead-lettered is a defect."""
    return (
        (dead.tenant, dead.tool_call_id) in oversized
        and limit is not None
        and dead.size > limit
        and SIZE_ERROR in (dead.error or "")
    )


def outbox_left(evidence: Evidence) -> list[str]:
    """Invariant 5: every row published or dead-lettered on purpose; each of those
    shown to its own tenant's API key and discarded by it (the operator's way out,
    which lets the rows of its key flow again)."""
    found = []
    if evidence.unpublished:
        found.append(f"{evidence.unpublished} outbox row(s) never published")
    for dead in evidence.dead_letters:
        who = f"dead letter row {dead.id} key {dead.key} (tenant {dead.tenant})"
        if not explained(dead, evidence.oversized, evidence.max_message_bytes):
            found.append(f"{who}, {dead.size} bytes: {dead.error}")
        elif dead.id not in evidence.listed.get(dead.tenant or "", ()):
            found.append(f"{who}: its tenant's API key was not shown it")
        elif evidence.discarded.get(dead.id) != "200":
            found.append(f"{who}: its tenant's discard answered {evidence.discarded.get(dead.id)}")
    return found


def unfenced(events: Iterable[tuple[str, EventView]]) -> list[str]:
    """Moves out of ``dispatching`` that did not end the claim that held the call.

    A claim (a ``dispatching`` event) names its holder (``worker``) and the version it
    left (``claimVersion``); the move that ends it (an outcome, or the recovery sweep's
    takeover) must name the same, because it is fenced by both. One that names an
    older claim is a stale write: a worker that lost its lease recorded over another
    worker's claim of the same call.
    """
    held: dict[tuple[str, str], tuple[object, object] | None] = {}
    found = []
    for tenant, event in events:
        if event.tool_call_id is None:
            continue
        call, payload = (tenant, event.tool_call_id), event.payload
        if payload.get("to") == S.DISPATCHING.value:
            held[call] = (payload.get("worker"), payload.get("claimVersion"))
            continue
        if S.DISPATCHING.value not in payload.get("from", ()):
            continue
        by = payload.get("deadWorker" if event.producer == Producer.RECOVERY else "worker")
        ended, claim = (by, payload.get("claimVersion")), held.pop(call, None)
        if ended != claim:
            shown = f"{claim[0]} at version {claim[1]}" if claim else "no claim"
            found.append(
                f"{event.tool_call_id}: {event.event_type} by {ended[0]} for its claim at"
                f" version {ended[1]}, while the call was held by {shown}"
            )
    return found


def _replayed(
    events: Sequence[tuple[str, EventView]], calls: Mapping[CallId, CallRecord]
) -> list[str]:
    by_run: dict[tuple[str, str], list[EventView]] = defaultdict(list)
    for tenant, event in events:
        by_run[(tenant, event.run_id)].append(event)
    folded: dict[CallId, S] = {}
    for (tenant, run_id), run_events in by_run.items():
        for view in fold_run(run_id, run_events).tool_calls:
            folded[(tenant, view.tool_call_id)] = view.status
    found = []
    for call in calls.values():
        replayed = folded.get(call.name)
        if replayed is not call.status:
            shown = replayed.value if replayed else "nothing"
            found.append(
                f"{call.tenant}/{call.tool_call_id}: status {call.status.value}, log says {shown}"
            )
    return found
