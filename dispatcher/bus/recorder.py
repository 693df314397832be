"""Record a fetched batch of request records in one transaction: the calls through the
same intake statement as HTTP, one reply per record through the outbox, and the
partitions' recorded offsets (``bus_offsets``).

The offsets decide what was recorded: the transaction first takes each partition's row
(the lock a second consumer of the same partition, a zombie after a rebalance, waits
on), drops the records below it, and moves it past the batch. So a record redelivered
after a crash or a rebalance writes nothing and is not answered twice, and a refusal
is recorded as surely as a call.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from sqlalchemy.ext.asyncio import AsyncEngine

from dispatcher.bus import continuity
from dispatcher.bus.records import ACCEPTED, REFUSED, Read, Refused, Request, derived_key
from dispatcher.capabilities import CapabilityRegistry
from dispatcher.db.engine import driver_transaction
from dispatcher.db.errors import REFUSED_INPUT, DbErrorClass, classify, refusal, sqlstate
from dispatcher.errors import DispatcherError, InternalError, ValidationFailed, problem
from dispatcher.intake.plan import Prepared
from dispatcher.intake.service import prepare, record_prepared
from dispatcher.intake.statement import jsonb
from dispatcher.ledger.messages import ce_source, outbox_row
from dispatcher.metrics import BUS_NEW_LOGS
from dispatcher.schemas import Submission
from dispatcher.settings import Topics
from dispatcher.tenancy import ordering_key

log = logging.getLogger(__name__)

SOURCE = ce_source("tool-dispatcher.bus-intake")
"""The ``ce_source`` of every reply (the calls' events are intake's, as over HTTP)."""
_ATTEMPTS = 3
# Failures caused by one record's row: the rest of the batch is fine without it.
_ONE_ROW = REFUSED_INPUT | {DbErrorClass.CONSTRAINT}

# Each partition's row, created at the batch's first offset if new, locked either way.
_TAKE_OFFSETS = """
INSERT INTO bus_offsets (topic, partition, next_offset)
SELECT * FROM unnest(%(topics)s::text[], %(partitions)s::int[], %(offsets)s::bigint[])
ON CONFLICT (topic, partition) DO UPDATE SET next_offset = bus_offsets.next_offset
RETURNING topic, partition, next_offset, last_record
"""
# Only ever forward: a redelivered batch that ends below the recorded offset (a new
# group, an uncommitted batch, a zombie) must not move it back over records recorded.
_MOVE_OFFSETS = """
UPDATE bus_offsets o SET
    next_offset = GREATEST(o.next_offset, v.next_offset),
    last_record = CASE WHEN v.next_offset >= o.next_offset
        THEN v.last_record ELSE o.last_record END,
    updated_at = now()
FROM unnest(
    %(topics)s::text[], %(partitions)s::int[], %(offsets)s::bigint[], %(last)s::bytea[]
) AS v(topic, partition, next_offset, last_record)
WHERE o.topic = v.topic AND o.partition = v.partition
"""
# A new log (dispatcher.bus.continuity): every record of it is still to be recorded.
_RESTART = """
UPDATE bus_offsets SET next_offset = 0, last_record = NULL, updated_at = now()
WHERE topic = %(topic)s AND partition = %(partition)s
"""
_REPLIES = """
INSERT INTO outbox (topic, key, payload, headers)
SELECT r.topic, r.key, r.payload, r.headers
FROM jsonb_to_recordset(%(rows)s) AS r(topic text, key text, payload jsonb, headers jsonb)
"""


@dataclass(frozen=True, slots=True)
class Outcome:
    """What became of one record: a call, a refusal, or None when an earlier batch had
    recorded it (nothing written, nothing answered)."""

    read: Read
    result: Submission | DispatcherError | None


Partition = tuple[str, int]


@dataclass(frozen=True, slots=True)
class Recorded:
    """A batch's outcomes, and the partitions left unrecorded to be read again from
    elsewhere (:mod:`dispatcher.bus.continuity`): the offset, or None for the beginning."""

    outcomes: list[Outcome] = field(default_factory=list)
    seeks: dict[Partition, int | None] = field(default_factory=dict)

    def __add__(self, other: Recorded) -> Recorded:
        return Recorded(self.outcomes + other.outcomes, {**self.seeks, **other.seeks})


class Recorder:
    def __init__(self, engine: AsyncEngine, registry: CapabilityRegistry, topics: Topics) -> None:
        self._engine = engine
        self._registry = registry
        self._topics = topics

    async def record(
        self, reads: Sequence[Read], check: Mapping[Partition, int | None] | None = None
    ) -> Recorded:
        """Record ``reads`` (each partition's records in offset order). A record whose
        row the database refuses is found by halving and refused alone; a database
        that is unreachable raises, with nothing recorded. The partitions of ``check``
        (with their high watermarks) are first judged to be the log their rows were
        recorded from."""
        check = check or {}
        for attempt in range(1, _ATTEMPTS + 1):
            try:
                return await self._once(reads, check)
            except psycopg.Error as exc:
                kind = classify(exc)
                if kind is DbErrorClass.CONTENTION and attempt < _ATTEMPTS:
                    continue
                if kind not in _ONE_ROW:
                    raise
                if len(reads) == 1:
                    return await self._once([_refused_by_database(reads[0], exc, kind)], check)
                # Halves keep each partition's records in order: the first half holds
                # a prefix of every partition's, and commits first.
                half = len(reads) // 2
                first = await self.record(reads[:half], check)
                return first + await self.record(reads[half:], check)
        raise AssertionError("unreachable")

    async def _once(self, reads: Sequence[Read], check: Mapping[Partition, int | None]) -> Recorded:
        async with driver_transaction(self._engine) as connection:
            rows = await _take_offsets(connection, reads)
            seeks = await _judge(connection, reads, rows, check)
            reads = [r for r in reads if _partition(r) not in seeks]
            fresh = [r for r in reads if r.at.offset >= rows[_partition(r)].next_offset]
            results = await self._submit(connection, fresh)
            replies = [reply(r, results.get(id(r))) for r in fresh]
            answers = [row for row in replies if row is not None]
            async with connection.cursor() as cursor:
                if answers:
                    await cursor.execute(_REPLIES, {"rows": jsonb(answers)}, prepare=True)
                if reads:
                    await cursor.execute(_MOVE_OFFSETS, _next_offsets(reads), prepare=True)
        answered = {id(r) for r in fresh}
        outcomes = [
            Outcome(r, results.get(id(r), r.error if isinstance(r, Refused) else None))
            if id(r) in answered
            else Outcome(r, None)
            for r in reads
        ]
        return Recorded(outcomes, seeks)

    async def _submit(
        self, connection: psycopg.AsyncConnection[Any], fresh: Sequence[Read]
    ) -> dict[int, Submission | DispatcherError]:
        results: dict[int, Submission | DispatcherError] = {}
        prepared: list[tuple[Request, Prepared]] = []
        for r in fresh:
            if not isinstance(r, Request):
                continue
            try:
                prepared.append((r, self._prepare(r)))
            except DispatcherError as exc:
                results[id(r)] = exc
        recorded = await record_prepared(
            connection, [p for _, p in prepared], topics=self._topics, in_order=True
        )
        for (r, _), outcome in zip(prepared, recorded, strict=True):
            results[id(r)] = outcome
        return results

    def _prepare(self, r: Request) -> Prepared:
        submission = r.submission
        # The capability's template says what counts as one operation, whichever door
        # the request came in by; without one, the event's identity stands in for the
        # random toolCallId HTTP would key by, so a producer's resend lands once.
        template = self._registry.get(submission.capability_id).idempotency_key_template
        if submission.idempotency_key is None and template is None:
            key = derived_key(r.source, r.event_id)
            submission = submission.model_copy(update={"idempotency_key": key})
        trace = (r.traceparent, r.tracestate) if r.traceparent else None
        return prepare(
            submission, r.route.tenant, self._registry, None, trace, {"bus": r.at.origin()}
        )


async def _take_offsets(
    connection: psycopg.AsyncConnection[Any], reads: Sequence[Read]
) -> dict[Partition, continuity.Recorded]:
    first: dict[Partition, int] = {}
    # In one order: two holders of one partition (a zombie) lock its rows alike.
    for r in sorted(reads, key=lambda r: (r.at.topic, r.at.partition, r.at.offset)):
        first.setdefault(_partition(r), r.at.offset)
    params = {
        "topics": [t for t, _ in first],
        "partitions": [p for _, p in first],
        "offsets": list(first.values()),
    }
    async with connection.cursor() as cursor:
        await cursor.execute(_TAKE_OFFSETS, params, prepare=True)
        return {(t, p): continuity.Recorded(o, last) for t, p, o, last in await cursor.fetchall()}


async def _judge(
    connection: psycopg.AsyncConnection[Any],
    reads: Sequence[Read],
    rows: Mapping[Partition, continuity.Recorded],
    check: Mapping[Partition, int | None],
) -> dict[Partition, int | None]:
    """Where each checked partition must be read from instead (none: it continues its
    row's log); a new log's row starts again at 0, under the row's lock."""
    seeks: dict[Partition, int | None] = {}
    for part, highwater in check.items():
        mine = {r.at.offset: r.at.fingerprint for r in reads if _partition(r) == part}
        if not mine:
            continue
        verdict = continuity.judge(min(mine), mine, rows[part], highwater)
        if verdict is continuity.Verdict.LOOK_FURTHER:
            seeks[part] = rows[part].next_offset - 1
        elif verdict is continuity.Verdict.NEW_LOG:
            log.warning(
                "bus intake: %s[%d] is a new log (recorded up to offset %d);"
                " recording it from its beginning",
                part[0], part[1], rows[part].next_offset,
            )  # fmt: skip
            BUS_NEW_LOGS.labels(part[0]).inc()
            await connection.execute(_RESTART, {"topic": part[0], "partition": part[1]})
            seeks[part] = None
    return seeks


def _partition(r: Read) -> Partition:
    return (r.at.topic, r.at.partition)


def _next_offsets(reads: Sequence[Read]) -> dict[str, list[Any]]:
    last: dict[Partition, Read] = {}
    for r in reads:
        if r.at.offset >= last.get(_partition(r), r).at.offset:
            last[_partition(r)] = r
    return {
        "topics": [t for t, _ in last],
        "partitions": [p for _, p in last],
        "offsets": [r.at.offset + 1 for r in last.values()],
        "last": [r.at.fingerprint for r in last.values()],
    }


def reply(read: Read, result: Submission | DispatcherError | None) -> dict[str, Any] | None:
    """The outbox row answering ``read``, or None for a record that names no one."""
    if read.event_id is None or read.source is None:
        return None
    error = result if isinstance(result, DispatcherError) else None
    if isinstance(read, Refused) and error is None:
        error = read.error
    payload: dict[str, Any] = {"requestId": read.event_id, "tenant": read.route.tenant}
    if error is not None or not isinstance(result, Submission):
        error = error or InternalError("a request record was neither recorded nor refused")
        payload |= {"outcome": "refused", "problem": problem(error)}
    else:
        view = result.view.model_dump(by_alias=True, mode="json")
        payload |= {
            "outcome": "accepted",
            "toolCallId": view["toolCallId"],
            "status": view["status"],
            "created": result.created,
            "call": view,
        }
    row = outbox_row(
        topic=read.route.replies,
        # Qualified by the tenant, as every outbox key is: the relay holds a key's later
        # rows behind its dead letter, and another tenant's request may share the key.
        key=ordering_key(read.route.tenant, _key_text(read.key) or read.event_id),
        type=REFUSED if error is not None else ACCEPTED,
        source=SOURCE,
        payload=payload,
        headers={"ce_requestid": read.event_id, "ce_requestsource": read.source},
    )
    return row


def _key_text(key: bytes | None) -> str | None:
    if not key:
        return None
    try:
        return key.decode()
    except UnicodeDecodeError:
        return None


def _refused_by_database(read: Read, exc: psycopg.Error, kind: DbErrorClass) -> Refused:
    """The one record whose row the database refused, refused alone (as HTTP intake
    answers it): its data at fault is the producer's, a constraint is the program's."""
    error: DispatcherError
    if kind in REFUSED_INPUT:
        log.info("bus intake: the database refused a record: %s", refusal(exc))
        error = ValidationFailed(
            f"the database refused the submission: {refusal(exc)}", sqlstate=sqlstate(exc)
        )
    else:
        log.error("bus intake: a record violates a constraint", exc_info=exc)
        error = InternalError("a submission violates a database constraint")
    return Refused(read.at, read.route, error, read.event_id, read.source, read.key, False)
