"""The load's second front door, bus intake: a share of the valid submissions, some of
them sent twice, and some hostile bodies written as request records on each tenant's
request topic, their replies read back through
:class:`~dispatcher.client.bus.BusSubmitter`.

Every send is counted by event id (acknowledged by the broker, or failed without
knowing) for invariant 10, which holds the replies the run's database recorded against
the records the broker kept. An ``accepted`` reply is a promise like a 2xx: it joins the
load's acknowledgements (invariant 1 and the HTTP replays, which must find the same
call through the other door).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable, Coroutine, Iterable, Mapping
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from devtools.chaos.stats import Ack, LoadStats, ReplayMismatch
from devtools.hostile import Hostile
from dispatcher.client.bus import SUBMIT, BusReply, BusSubmitter
from dispatcher.schemas import SubmitRequest

log = logging.getLogger(__name__)

SOURCE = "/chaos/load"
"""The ``ce_source`` of every request record of the load."""
BUS_SHARE = 0.25
"""The share of valid submissions (and of hostile ones) sent through the bus."""
DOUBLED_SHARE = 1 / 8
"""The share of bus submissions sent twice with one event id."""
SEND_TIMEOUT_MS = 10_000
"""A send not acknowledged by then counts as maybe written (as the HTTP load's 10 s)."""
REPLY_WITHIN = 30.0
"""How long a reply is waited for; one that never comes is counted, not a violation here
(invariant 10 judges it against what the broker kept)."""
CLOSE_WITHIN = 5.0
"""At close the run has settled (every kept record recorded, the outbox published), so
a reply still awaited by then was never going to come: waited this much longer only."""


class BusDoor:
    """One :class:`BusSubmitter` a tenant (``topics``: tenant -> request topic) for the
    valid submissions, and a plain producer for the hostile ones, whose bodies no
    :class:`SubmitRequest` can hold."""

    def __init__(
        self,
        bootstrap: str,
        topics: Mapping[str, str],
        stats: LoadStats,
        *,
        stopped_by_another: Callable[[str, str], None],
    ) -> None:
        self._topics = dict(topics)
        self._stats = stats
        self._bus = stats.bus
        self._stopped_by_another = stopped_by_another
        self._bootstrap = bootstrap
        self._submitters = self._new_submitters()
        self._raw = AIOKafkaProducer(
            bootstrap_servers=bootstrap, acks="all", request_timeout_ms=SEND_TIMEOUT_MS
        )
        self._waiting: set[asyncio.Task[None]] = set()
        self._doubled: list[tuple[str, str, str]] = []
        """``(tenant, event id, toolCallId of its first reply)`` of each event sent twice."""

    def _new_submitters(self) -> dict[str, BusSubmitter]:
        # Each send gives up when the HTTP load would: a broker away for a restart must
        # not hold a load slot for aiokafka's default 40 s.
        return {
            tenant: BusSubmitter(
                self._bootstrap, topic, source=SOURCE, request_timeout_ms=SEND_TIMEOUT_MS
            )
            for tenant, topic in self._topics.items()
        }

    async def start(self) -> None:
        await self._raw.start()
        for submitter in self._submitters.values():
            await submitter.start()

    async def reopen(self) -> None:
        """After a broker restart, new submitters, reading the replies from the ends of
        the topics made again. Tansu forgets its topics, and answers a fetch past the end
        of the new log with nothing rather than an out-of-range error, so a reader left
        at its old offsets would read no reply until the new log passed them (about as
        long as the run had gone before the restart)."""
        fresh = self._new_submitters()
        try:
            for submitter in fresh.values():
                await submitter.start()
        except (KafkaError, LookupError) as exc:
            log.warning("bus submitters not reopened after the broker restart: %s", exc)
            # The ones that did start are closed (one that fails closes itself).
            await _stop_all(fresh.values())
            return
        stale, self._submitters = self._submitters, fresh
        await _stop_all(stale.values())

    async def close(self) -> None:
        if self._waiting:
            _, late = await asyncio.wait(self._waiting, timeout=CLOSE_WITHIN)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
            self._bus.replies["none"] += len(late)
        await self._check_doubled()
        await _stop_all(self._submitters.values())
        with contextlib.suppress(KafkaError):
            await self._raw.stop()

    async def submit(
        self, tenant: str, body: dict[str, Any], event_id: str, *, twice: bool
    ) -> None:
        """Send ``body`` as a request record (twice with ``twice``, the second as a
        producer's retry); its reply is awaited by a task of its own, so that a slow
        reply does not hold the caller's in-flight slot."""
        request = SubmitRequest.model_validate(body)
        text = json.dumps(body)
        self._stats.attempted += 1
        acked = await self._send(tenant, request, event_id)
        if twice:
            self._bus.doubled += 1
            acked = await self._send(tenant, request, event_id) or acked
        if acked:
            self._spawn(self._answered(tenant, text, event_id, twice=twice))

    async def hostile(self, tenant: str, event_id: str, run_id: str, hostile: Hostile) -> None:
        """Send a hostile body in a well-formed envelope: its reply must refuse it."""
        self._bus.hostile.add(event_id)
        headers = {
            "ce_specversion": "1.0",
            "ce_id": event_id,
            "ce_source": SOURCE,
            "ce_type": SUBMIT,
            "content-type": "application/json",
        }
        try:
            await self._raw.send_and_wait(
                self._topics[tenant],
                hostile.body,
                key=run_id.encode(),
                headers=[(k, v.encode()) for k, v in headers.items()],
            )
        except KafkaError as exc:
            self._bus.sent_maybe[event_id] += 1
            self._stats.hostile[f"{hostile.kind}:bus {type(exc).__name__}"] += 1
            return
        self._bus.sent_acked[event_id] += 1
        self._spawn(self._refused(tenant, event_id, hostile))

    async def _send(self, tenant: str, request: SubmitRequest, event_id: str) -> bool:
        try:
            await self._submitters[tenant].submit(request, event_id=event_id)
        except KafkaError as exc:
            # Not acknowledged: written or not, nobody knows (a retry may follow).
            self._bus.sent_maybe[event_id] += 1
            self._stats.refused[f"bus {type(exc).__name__}"] += 1
            return False
        self._bus.sent_acked[event_id] += 1
        return True

    def _spawn(self, waiting: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(waiting)
        self._waiting.add(task)
        task.add_done_callback(self._waiting.discard)

    async def _reply(self, tenant: str, event_id: str) -> BusReply | None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + REPLY_WITHIN
        while True:
            # A second at a time: the submitters may be reopened meanwhile (a reply
            # written after a broker restart is read by the new ones only).
            within = min(1.0, deadline - loop.time())
            try:
                reply = await self._submitters[tenant].reply(event_id, within=within)
                break
            except TimeoutError:
                if loop.time() >= deadline:
                    self._bus.replies["none"] += 1
                    return None
        self._bus.replies[reply.outcome] += 1
        return reply

    async def _answered(self, tenant: str, text: str, event_id: str, *, twice: bool) -> None:
        reply = await self._reply(tenant, event_id)
        if reply is None:
            return  # nothing read, nothing promised (invariant 10 judges the record)
        if reply.outcome == "accepted" and reply.tool_call_id:
            at = asyncio.get_running_loop().time()
            # As HTTP would have answered: 201 made the call, 200 replayed it.
            status = 201 if reply.created else 200
            self._stats.acks.append(Ack(tenant, reply.tool_call_id, status, text, at, door="bus"))
            if twice:
                self._doubled.append((tenant, event_id, reply.tool_call_id))
            return
        code = _code(reply)
        if code == "run_stopped":
            self._stopped_by_another(tenant, json.loads(text)["runId"])
        else:
            # A refusal on the bus is final (no producer retries it): any other code
            # refuses a valid submission.
            self._stats.valid_refused.append(f"bus {text[:100]}: {reply.outcome} {code}")

    async def _refused(self, tenant: str, event_id: str, hostile: Hostile) -> None:
        reply = await self._reply(tenant, event_id)
        if reply is None:
            self._stats.hostile[f"{hostile.kind}:bus no reply"] += 1
            return
        self._stats.hostile[f"{hostile.kind}:bus {reply.outcome}"] += 1
        if reply.outcome != "refused" or _code(reply) is None:
            self._stats.hostile_misanswered.append(
                f"bus {hostile.kind} {hostile.body[:100]!r}: {reply.outcome}"
                f" {reply.tool_call_id or reply.problem}"
            )

    async def _check_doubled(self) -> None:
        """Each event sent twice: the last reply read to it (the submitter keeps the
        latest of each event) names the call its first reply named. Invariant 10 checks
        every reply the database recorded; this is what the producer saw."""
        for tenant, event_id, first in self._doubled:
            try:
                last = await self._submitters[tenant].reply(event_id, within=0.1)
            except TimeoutError:
                continue
            if last.outcome == "accepted" and last.tool_call_id != first:
                self._stats.replay_mismatches.append(
                    ReplayMismatch(f"{tenant}/{first} (bus event {event_id})", last.tool_call_id, 0)
                )


def _code(reply: BusReply) -> str | None:
    code = (reply.problem or {}).get("code")
    return code if isinstance(code, str) else None


async def _stop_all(submitters: Iterable[BusSubmitter]) -> None:
    for submitter in submitters:
        with contextlib.suppress(KafkaError):
            await submitter.stop()
