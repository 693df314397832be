"""Intake: record tool calls, their first events and their dispatch commands in the
caller's transaction. The same idempotency key replays the stored call; the same key
with a different request is refused.

One code path serves a single library call and a batch of HTTP submissions grouped
into one commit: a batch costs one constant statement (the run guard and four INSERTs
in CTEs) and at most two SELECTs, whatever its size.

A capability that requires approval leaves its call ``proposed`` with an approval
(``approval.required``) and no dispatch command. A stopped run accepts no new calls
(:class:`RunStopped`); see :mod:`dispatcher.intake.statement` for how this holds against a stop
committed at the same moment.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic_core import PydanticCustomError

from dispatcher.capabilities import CapabilityRegistry
from dispatcher.errors import (
    DispatcherError,
    IdempotencyKeyReused,
    RunStopped,
    ToolCallIdConflict,
    ValidationFailed,
)
from dispatcher.ids import time_ordered_uuid
from dispatcher.intake.approvals import asked_approval, notify_pending, recorded_approvals
from dispatcher.intake.keys import default_key, fingerprint, fingerprint_column, same_request
from dispatcher.intake.plan import VIA_LIBRARY, Prepared, plan_created
from dispatcher.intake.statement import (
    STOPPED_RUNS,
    STORED_BY_BARE_ID,
    STORED_BY_KEY,
    CallerTransaction,
    Transaction,
    pairs,
    write_intake,
)
from dispatcher.schemas import (
    KEY_MAX_LENGTH,
    Submission,
    SubmitRequest,
    ToolCallView,
    check_identifier,
)
from dispatcher.settings import DEFAULT_TOPICS, Topics
from dispatcher.states import ExecutionStatus
from dispatcher.tenancy import key_to_store
from dispatcher.tracing import Trace, annotate, submit_span


async def submit(
    session: Transaction,
    request: SubmitRequest,
    *,
    tenant: str,
    registry: CapabilityRegistry,
    topics: Topics = DEFAULT_TOPICS,
    submitted_by: str | None = None,
) -> Submission:
    """Record ``request`` inside the caller's open transaction; the caller commits.

    ``session`` is that transaction: a SQLAlchemy ``AsyncSession`` (psycopg 3) or a
    psycopg ``AsyncConnection``; every statement goes through its psycopg connection.

    Nothing is committed here, so a producer's own domain write, the tool call and
    its outbox row commit or roll back together. Raises a :class:`DispatcherError`
    (nothing written) for an unknown capability, bad input, a reused key or a stopped
    run. ``submitted_by`` names the submitter on the call's approval, if it needs one.

    A ``tool_dispatcher.submit`` span, child of the caller's current span, when this
    process exports traces; the call joins that trace (without them, the caller's own
    current span's, if it has one).
    """
    with submit_span() as trace:
        [outcome] = await submit_many(
            session,
            [(request, tenant)],
            registry=registry,
            topics=topics,
            submitted_by=[submitted_by],
            traces=[trace],
        )
        if isinstance(outcome, DispatcherError):
            raise outcome
        annotate(outcome.view, request.tool_name)
    return outcome


async def submit_many(
    session: Transaction,
    items: Sequence[tuple[SubmitRequest, str]],
    *,
    registry: CapabilityRegistry,
    topics: Topics = DEFAULT_TOPICS,
    submitted_by: Sequence[str | None] | None = None,
    traces: Sequence[Trace] | None = None,
) -> list[Submission | DispatcherError]:
    """Record several ``(request, tenant)`` submissions in the caller's transaction.

    Each item gets its own outcome: a refused item writes nothing and does not
    disturb the others. ``submitted_by``, parallel to ``items``, names each submitter;
    ``traces``, also parallel, the trace context each was submitted in.
    """
    outcomes: list[Submission | DispatcherError | None] = [None] * len(items)
    prepared: dict[int, Prepared] = {}
    submitters = list(submitted_by) if submitted_by is not None else [None] * len(items)
    contexts = list(traces) if traces is not None else [None] * len(items)
    for i, (request, tenant) in enumerate(items):
        try:
            prepared[i] = prepare(request, tenant, registry, submitters[i], contexts[i])
        except DispatcherError as exc:
            outcomes[i] = exc
    recorded = await record_prepared(session, list(prepared.values()), topics=topics)
    for i, outcome in zip(prepared, recorded, strict=True):
        outcomes[i] = outcome
    return [o for o in outcomes if o is not None]


async def record_prepared(
    session: Transaction,
    submissions: Sequence[Prepared],
    *,
    topics: Topics = DEFAULT_TOPICS,
    in_order: bool = False,
) -> list[Submission | DispatcherError]:
    """Record submissions :func:`prepare` accepted, in the caller's transaction: one
    outcome each, in order, and a refused one disturbs no other.

    Everything decided from the request, the tenant and the registry was decided
    before (HTTP intake prepares each submission before it joins a group commit, so
    those refusals keep their 4xx while the database is down); what is left here needs
    the database.

    ``in_order`` writes the calls in the order given (bus intake: a partition's records
    in offset order, so the log's order is the partition's) rather than in key order;
    two concurrent batches may then take their locks in opposite orders, and the
    deadlock that can follow is the caller's to retry."""
    tx = await CallerTransaction.of(session)
    prepared = dict(enumerate(submissions))
    outcomes: dict[int, Submission | DispatcherError] = {}
    if prepared:
        fresh, to_replay = _first_claims(prepared, in_order)
        events: list[dict[str, Any]] = []
        messages: list[dict[str, Any]] = []
        approvals: list[dict[str, Any]] = []
        for i in fresh:
            plan_created(prepared[i], events, messages, approvals, topics)
        inserted = {
            (row["tenant"], row["tool_call_id"]): row
            for row in await write_intake(
                tx,
                {
                    "calls": [prepared[i].values for i in fresh],
                    "events": events,
                    "messages": messages,
                    "approvals": approvals,
                },
                topics.events,
            )
        }
        # By (tenant, toolCallId): two tenants may use one toolCallId in one batch.
        asked = {(a["tenant"], a["tool_call_id"]): a for a in approvals}
        # The approvals of the calls created (a replayed call's was told before).
        await notify_pending(tx, [a for key, a in asked.items() if key in inserted])
        for i in fresh:
            row = inserted.get((prepared[i].tenant, prepared[i].values["tool_call_id"]))
            if row is None:
                to_replay[i] = prepared[i]
            else:
                outcomes[i] = Submission(
                    ToolCallView.of(
                        row, asked_approval(asked.get((row["tenant"], row["tool_call_id"])))
                    ),
                    created=True,
                )
        if to_replay:
            outcomes_of_replays = await _replay(tx, to_replay)
            for i, outcome in outcomes_of_replays.items():
                outcomes[i] = outcome
    return [outcomes[i] for i in range(len(submissions))]


def _first_claims(
    prepared: dict[int, Prepared], in_order: bool = False
) -> tuple[list[int], dict[int, Prepared]]:
    """The items to insert, in key order, and those to answer as replays.

    Sorted by key so that concurrent batches take their conflict locks in the same
    order and cannot deadlock on each other. Of several items with one key or
    toolCallId, only the first is inserted; the others are answered as replays of it
    (the statement writes the events of every created call, so it must not see two
    claims to one row)."""
    fresh: list[int] = []
    to_replay: dict[int, Prepared] = {}
    claimed: set[object] = set()
    for i in prepared if in_order else sorted(prepared, key=lambda i: prepared[i].key):
        prep = prepared[i]
        # Tagged: a key may read like another call's id. Both are per tenant.
        ids = (("key", *prep.key), ("call", prep.tenant, prep.values["tool_call_id"]))
        if claimed.isdisjoint(ids):
            claimed.update(ids)
            fresh.append(i)
        else:
            to_replay[i] = prep
    return fresh, to_replay


def prepare(
    request: SubmitRequest,
    tenant: str,
    registry: CapabilityRegistry,
    submitted_by: str | None,
    trace: Trace = None,
    origin: dict[str, Any] | None = VIA_LIBRARY,
) -> Prepared:
    """What ``request`` would write, or the :class:`DispatcherError` that refuses it
    without the database: an unknown or disabled capability, a derived key outside
    the identifier contract."""
    capability = registry.get(request.capability_id)
    if not capability.enabled:
        raise ValidationFailed(
            f"capability {capability.id!r} is disabled", capabilityId=capability.id
        )
    tool_call_id = request.tool_call_id or time_ordered_uuid()
    # A toolCallId is unique only within its tenant: the default key names the tenant
    # too, so that a replay finds the call whatever the provider key becomes.
    key = request.idempotency_key or default_key(
        request, tool_call_id, capability.idempotency_key_template, tenant
    )
    if request.idempotency_key is None:
        _check_derived_key(key)
    status = (
        ExecutionStatus.PROPOSED if capability.requires_approval else ExecutionStatus.AUTHORIZED
    )
    digest = fingerprint(request.capability_id, request.input)
    return Prepared(
        request=request,
        fingerprint=digest,
        tenant=tenant,
        capability=capability,
        submitted_by=submitted_by,
        trace=trace,
        origin=origin,
        values={
            "tool_call_id": tool_call_id,
            "tenant": tenant,
            "run_id": request.run_id,
            "turn_id": request.turn_id,
            "capability_id": request.capability_id,
            "input": request.input,
            "idempotency_key": key,
            "provider_key": key_to_store(tenant, key, namespaced=capability.namespaces_keys),
            "request_fingerprint": fingerprint_column(digest),
            "status": status.value,
            "correlation_id": request.correlation_id,
            "causation_id": request.causation_id,
            "reasoning_object_id": request.reasoning_object_id,
            "traceparent": trace[0] if trace else None,
            "tool_name": request.tool_name,
        },
    )


def _check_derived_key(key: str) -> None:
    """A key rendered from a template keeps the contract a given key is held to: its
    values are encoded, but it may grow past the bound, and the template's own text
    comes from the registry."""
    try:
        check_identifier(key, KEY_MAX_LENGTH)
    except PydanticCustomError as exc:
        raise ValidationFailed(
            f"the idempotency key derived from the capability's template {exc.message()}",
            field="idempotencyKey",
        ) from None


async def _replay(
    tx: CallerTransaction, items: dict[int, Prepared]
) -> dict[int, Submission | DispatcherError]:
    keys = {prep.key for prep in items.values()}
    stored = {
        (row["tenant"], row["idempotency_key"]): row
        for row in await tx.rows(STORED_BY_KEY, pairs(keys))
    }
    stored.update(await _legacy_defaults(tx, items, stored))
    outcomes: dict[int, Submission | DispatcherError] = {}
    replayed: dict[int, Any] = {}
    missing = {(p.tenant, p.values["run_id"]) for p in items.values() if p.key not in stored}
    stopped: set[tuple[str, str]] = set()
    if missing:
        # Committed for good (a run is never restarted), so this later statement sees
        # every stop the run guard saw.
        stopped = {
            (row["tenant"], row["run_id"]) for row in await tx.rows(STOPPED_RUNS, pairs(missing))
        }
    for i, prep in items.items():
        row = stored.get(prep.key)
        if row is None and (prep.tenant, prep.values["run_id"]) in stopped:
            outcomes[i] = RunStopped(prep.values["run_id"])
        elif row is None:
            # The key is free, so the clash was on the primary key: another call owns it.
            outcomes[i] = ToolCallIdConflict(prep.values["tool_call_id"])
        elif not same_request(row["request_fingerprint"], prep.fingerprint) or (
            prep.request.tool_call_id not in (None, row["tool_call_id"])
        ):
            outcomes[i] = IdempotencyKeyReused(prep.key[1], row["tool_call_id"])
        else:
            replayed[i] = row
    refs = await recorded_approvals(
        tx, [(r["tenant"], r["tool_call_id"]) for r in replayed.values()]
    )
    for i, row in replayed.items():
        ref = refs.get((row["tenant"], row["tool_call_id"]))
        outcomes[i] = Submission(ToolCallView.of(row, ref), created=False)
    return outcomes


async def _legacy_defaults(
    tx: CallerTransaction, items: dict[int, Prepared], stored: dict[Any, Any]
) -> dict[tuple[str, str], Any]:
    """Calls stored before default keys were tenant-qualified (migration 0007), keyed
    by their bare toolCallId: a replay without a key still finds its call."""
    wanted = {
        (p.tenant, p.values["tool_call_id"]): p.key
        for p in items.values()
        if p.key not in stored and p.request.idempotency_key is None
    }
    if not wanted:
        return {}
    rows = await tx.rows(STORED_BY_BARE_ID, pairs(wanted))
    return {wanted[(r["tenant"], r["tool_call_id"])]: r for r in rows}
