"""The load of a chaos run: a steady mix of submissions from two tenants whose names
meet, over HTTP and (a share) over the bus (:mod:`devtools.chaos.bus_load`), idempotent
replays, a few stopped runs, a simulated approver, and calls of one tenant too large to
announce. Every 2xx answer and accepted reply is recorded: those are the promises the
checker holds the service to."""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import Mapping
from typing import Any

import httpx

from devtools.chaos.approvers import approve_until
from devtools.chaos.bus_load import BUS_SHARE, DOUBLED_SHARE, BusDoor
from devtools.chaos.stats import Ack, LoadStats, ReplayMismatch
from devtools.hostile import hostile_body

log = logging.getLogger(__name__)

TENANT = "chaos"
"""The first tenant. The zombie baits pick its calls by their provider keys."""
TWIN = "chaos/twin"
"""The second tenant. It writes the first one's ids and keys as well as its own (its
name holds ``/``, the ordering keys' separator, which they escape), and it alone makes
oversized calls: every dead letter of the run must be one of its own."""
TENANTS = (TENANT, TWIN)
SIDE_EFFECTS = "refund"
APPROVED = "refund-approved"
READ_ONLY = "lookup"
ATTACH = "attach"
"""Attaches a document to an order. The provider takes it and never finishes
(``pending``), so the reconciler soon gives up and escalates; the escalation's evidence
carries the call's input, document included."""
# How the capabilities' idempotency keys begin (their templates, in the run's registry);
# the sandbox's fault rules pick a kind of call by the key it receives, which is
# qualified by the tenant (dispatcher.tenancy.provider_key: "chaos:refund:...").
SIDE_EFFECT_KEYS = "refund:"
READ_ONLY_KEYS = "lookup:"
ATTACH_KEYS = "attach:"
CALLS_PER_RUN = 6
# The share of submissions that are hostile (devtools.hostile): each must be
# refused with a 4xx and write nothing, and must not hurt the valid ones beside it.
HOSTILE_SHARE = 0.05
# The only refusals a valid submission may get here: its run was stopped by the load.
EXPECTED_REFUSALS = frozenset({"run_stopped"})
# The share of submissions both tenants send: the same runId, correlationId and orderId,
# so the same idempotency key as written. Half of them name the same toolCallId too
# (and the same input); the other half give the second tenant another amount, a body
# the provider must not take for the first one's.
MIRROR_SHARE = 0.2
# The 3rd submission, then every 64th, is the twin tenant's oversized call: some in
# every run, the first within a second.
OVERSIZED_EVERY = 64
MAX_MESSAGE_BYTES = 64 * 1024
"""The relay's limit in the run (``TOOL_DISPATCHER_RELAY__MAX_MESSAGE_BYTES``): far
above any message of a regular call, below an oversized call's escalation."""
DOCUMENT_BYTES = 80 * 1024
"""An oversized call's document: its escalation message exceeds the relay's limit."""
FOLLOW_SECONDS = 6.0
"""After an oversized call, the first tenant submits a call of the same toolCallId this
much later: by then the oversized call's escalation is a dead letter, and the other
tenant's call must not wait behind it."""
REPLAY_WITHIN = 3.0
"""Replays repeat submissions acknowledged at most this long ago: well inside the
retention's age (devtools.chaos.retention), and the client's timeout after it."""
PENDING_FOREVER = 100_000
"""Lookups the sandbox answers ``pending`` before settling: more than any reconciler."""


def other_tenant(tenant: str) -> str:
    return TWIN if tenant == TENANT else TENANT


class Load:
    """Submits ``rate`` requests a second (at most ``in_flight`` at a time), each as one
    of the tenants of ``api_keys`` (tenant: its API key); with ``request_topics``
    (tenant: its bus intake topic on ``kafka_bootstrap``) a share through the bus."""

    def __init__(
        self,
        api_url: str,
        api_keys: Mapping[str, str],
        *,
        seed: int,
        rate: float,
        in_flight: int = 16,
        kafka_bootstrap: str | None = None,
        request_topics: Mapping[str, str] | None = None,
    ) -> None:
        self.stats = LoadStats()
        self._rng = random.Random(seed * 7919 + 1)  # noqa: S311 - replayable, not secret
        # The doors are drawn apart: the rest of the load stays what the seed made it
        # before the bus joined (the planted runs' tests count on what it sends early).
        self._doors = random.Random(seed * 7919 + 2)  # noqa: S311 - replayable, not secret
        self._rate = rate
        self._seed = seed
        self._slots = asyncio.Semaphore(in_flight)
        self._clients = {
            tenant: httpx.AsyncClient(
                base_url=api_url,
                headers={"Authorization": f"Bearer {key}"},
                timeout=httpx.Timeout(10.0, connect=2.0),
            )
            for tenant, key in api_keys.items()
        }
        self._tasks: set[asyncio.Task[None]] = set()
        self._followers: set[asyncio.Task[None]] = set()
        self._stopped = asyncio.Event()
        self._bus: BusDoor | None = None
        if kafka_bootstrap and request_topics:
            stopped = self._stopped_by_another
            self._bus = BusDoor(
                kafka_bootstrap, request_topics, self.stats, stopped_by_another=stopped
            )

    async def close(self) -> None:
        await asyncio.gather(*self._tasks, *self._followers, return_exceptions=True)
        if self._bus is not None:
            await self._bus.close()
        for client in self._clients.values():
            await client.aclose()

    async def broker_restarted(self) -> None:
        if self._bus is not None:
            await self._bus.reopen()

    async def submit_until(self, stop: asyncio.Event) -> None:
        if self._bus is not None:
            await self._bus.start()
        loop = asyncio.get_running_loop()
        start = loop.time()
        n = 0
        while not stop.is_set():
            n += 1
            # Paced from the start, not from the last answer: an outage does not slow
            # the offered load, it only makes answers fail.
            delay = start + n / self._rate - loop.time()
            if delay > 0:
                try:
                    await asyncio.wait_for(stop.wait(), delay)
                    break
                except TimeoutError:
                    pass
            await self._slots.acquire()
            task = asyncio.create_task(self._one(n))
            self._tasks.add(task)
            task.add_done_callback(self._done)
        self._stopped.set()

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._slots.release()

    async def _one(self, n: int) -> None:
        # Every draw is made before the first await: the load is a function of the seed.
        roll = self._rng.random()
        tenant = self._rng.choice(TENANTS)
        acks = self.stats.acks
        fresh = self._fresh(acks)
        if roll < 0.10 and fresh:
            await self._replay(self._rng.choice(fresh))
            return
        if roll < 0.12 and acks:
            await self._stop_run(tenant, n)
            return
        run_id = f"chaos-{self._seed}-r{n // CALLS_PER_RUN}"
        if roll < 0.12 + HOSTILE_SHARE:
            await self._hostile(tenant, n, run_id)
            return
        if n % OVERSIZED_EVERY == 3:
            await self._oversized(n, run_id)
            return
        kind, capability, call_input = self._call(n, roll)
        self.stats.by_kind[kind] += 1
        body: dict[str, Any] = {
            "runId": run_id,
            "capabilityId": capability,
            "correlationId": f"intent-{n}",
            "input": call_input,
        }
        mirror = self._rng.random()
        door, twice = self._doors.random(), self._doors.random()
        bus = self._bus if door < BUS_SHARE else None
        if mirror >= MIRROR_SHARE:
            await self._by(bus, tenant, body, f"{n}", twice < DOUBLED_SHARE)
            return
        other = dict(body)
        if mirror < MIRROR_SHARE / 2:
            body["toolCallId"] = other["toolCallId"] = f"shared-{self._seed}-{n}"
        else:
            other["input"] = {**call_input, "amount": call_input["amount"] + 1}
        self.stats.mirrored += 1
        await asyncio.gather(
            self._by(bus, tenant, body, f"{n}", twice < DOUBLED_SHARE),
            self._by(bus, other_tenant(tenant), other, f"{n}-mirror", False),
        )

    async def _by(
        self, bus: BusDoor | None, tenant: str, body: dict[str, Any], n: str, twice: bool
    ) -> None:
        """``body`` through the bus if ``bus``, else over HTTP."""
        if bus is None:
            await self._send(tenant, body)
        else:
            await bus.submit(tenant, body, f"chaos-{self._seed}-{n}", twice=twice)

    def _call(self, n: int, roll: float) -> tuple[str, str, dict[str, Any]]:
        """A valid call's kind, capability and input."""
        call_input: dict[str, Any] = {
            "orderId": f"o-{self._seed}-{n}",
            "amount": round(self._rng.uniform(1, 500), 2),
        }
        if roll < 0.26:
            return "read_only", READ_ONLY, call_input
        if roll < 0.36:
            return "needs_approval", APPROVED, call_input
        if roll < 0.44:
            return "provider_fails", SIDE_EFFECTS, {**call_input, "simulate": "fail"}
        if roll < 0.52:
            pending = {"simulate": "pending", "pendingLookups": 1}
            return "provider_pending", SIDE_EFFECTS, {**call_input, **pending}
        return "side_effects", SIDE_EFFECTS, call_input

    async def _oversized(self, n: int, run_id: str) -> None:
        """The twin tenant's call whose escalation is too large for the relay, then, a
        while later, the first tenant's call of the same ids."""
        call_id, order = f"shared-{self._seed}-{n}", f"o-{self._seed}-{n}"
        ids = {"runId": run_id, "toolCallId": call_id, "correlationId": f"intent-{n}"}
        document = {"simulate": "pending", "pendingLookups": PENDING_FOREVER}
        document["document"] = "x" * DOCUMENT_BYTES
        self.stats.by_kind["oversized"] += 1
        # Counted before the answer: a call whose answer was lost may exist all the same.
        self.stats.oversized.append((TWIN, call_id))
        follower = {**ids, "capabilityId": SIDE_EFFECTS, "input": {"orderId": order, "amount": 1}}
        task = asyncio.create_task(self._follow(follower))
        self._followers.add(task)
        task.add_done_callback(self._followers.discard)
        await self._send(
            TWIN, {**ids, "capabilityId": ATTACH, "input": {"orderId": order, **document}}
        )

    async def _follow(self, submission: dict[str, Any]) -> None:
        try:
            await asyncio.wait_for(self._stopped.wait(), FOLLOW_SECONDS)
            return  # the load is over: nothing new is submitted
        except TimeoutError:
            pass
        self.stats.by_kind["follows_oversized"] += 1
        await self._send(TENANT, submission)

    async def _send(self, tenant: str, submission: dict[str, Any]) -> None:
        body = json.dumps(submission)
        self.stats.attempted += 1
        answer = await self._post(tenant, body)
        if answer is not None and answer[0] < 300:
            at = asyncio.get_running_loop().time()
            self.stats.acks.append(Ack(tenant, answer[1], answer[0], body, at))

    async def _hostile(self, tenant: str, n: int, run_id: str) -> None:
        capability = self._rng.choice([SIDE_EFFECTS, APPROVED, READ_ONLY])
        hostile = hostile_body(
            self._rng, f"{self._seed}-{n}", capability_id=capability, run_id=run_id
        )
        self.stats.by_kind["hostile_input"] += 1
        if self._bus is not None and self._doors.random() < BUS_SHARE:
            event_id = f"chaos-{self._seed}-{n}-hostile"
            await self._bus.hostile(tenant, event_id, run_id, hostile)
            return
        try:
            response = await self._clients[tenant].post(
                "/v1/tool-calls", content=hostile.body, headers={"Content-Type": "application/json"}
            )
        except httpx.HTTPError as exc:
            # No answer (the API is down for a fault): nothing was promised either way.
            self.stats.hostile[f"{hostile.kind}:{type(exc).__name__}"] += 1
            return
        self.stats.hostile[f"{hostile.kind}:{response.status_code}"] += 1
        if not (400 <= response.status_code < 500 and _problem_code(response)):
            self.stats.hostile_misanswered.append(
                f"{hostile.kind} {hostile.body[:100]!r}: {response.status_code}"
                f" {response.text[:120]}"
            )

    def _fresh(self, acks: list[Ack]) -> list[Ack]:
        """The acknowledgements a producer may still retry: those younger than
        :data:`REPLAY_WITHIN` (the retention job may archive a call soon after, and
        then its key is free again, as a provider's key is after its window)."""
        since = asyncio.get_running_loop().time() - REPLAY_WITHIN
        first = len(acks)
        while first > 0 and acks[first - 1].at >= since:
            first -= 1
        return acks[first:]

    async def _replay(self, original: Ack) -> None:
        self.stats.replays += 1
        self.stats.by_kind["replay"] += 1
        answer = await self._post(original.tenant, original.body)
        if answer is None or answer[0] >= 300:
            # No answer, or a refusal (the API is down, the run was stopped since):
            # nothing new was promised.
            return
        status, tool_call_id = answer
        if status != 200 or tool_call_id != original.tool_call_id:
            self.stats.replay_mismatches.append(
                ReplayMismatch(f"{original.tenant}/{original.tool_call_id}", tool_call_id, status)
            )

    async def _post(self, tenant: str, body: str) -> tuple[int, str] | None:
        try:
            response = await self._clients[tenant].post(
                "/v1/tool-calls", content=body, headers={"Content-Type": "application/json"}
            )
        except httpx.HTTPError as exc:
            self.stats.refused[type(exc).__name__] += 1
            return None
        if response.status_code >= 300:
            self.stats.refused[str(response.status_code)] += 1
            code = _problem_code(response)
            if 400 <= response.status_code < 500 and code not in EXPECTED_REFUSALS:
                self.stats.valid_refused.append(f"{body[:100]}: {response.status_code} {code}")
            if code == "run_stopped":
                self._stopped_by_another(tenant, json.loads(body)["runId"])
            return response.status_code, ""
        tool_call_id = response.json().get("toolCallId")
        return response.status_code, str(tool_call_id)

    def _stopped_by_another(self, tenant: str, run_id: str) -> None:
        """A refusal as ``run_stopped`` is the load's own doing only if this tenant
        stopped the run: the other tenant's run of the same name is another run."""
        if (tenant, run_id) not in self.stats.stops:
            self.stats.foreign_refusals.append(
                f"{tenant}: a submission to run {run_id} refused as stopped;"
                f" {tenant} never stopped it"
            )

    async def _stop_run(self, tenant: str, n: int) -> None:
        # A run still taking calls: some of its calls are in flight when it stops. The
        # other tenant's run of the same name goes on.
        run_id = f"chaos-{self._seed}-r{max(0, n // CALLS_PER_RUN - 1)}"
        self.stats.by_kind["run_stop"] += 1
        # Counted before the answer: a stop whose answer was lost may have happened.
        self.stats.stops.add((tenant, run_id))
        try:
            response = await self._clients[tenant].post(
                f"/v1/runs/{run_id}/stop", json={"reason": "chaos"}
            )
        except httpx.HTTPError:
            return
        if response.status_code < 300:
            self.stats.runs_stopped += 1

    async def approve_until(self, stop: asyncio.Event) -> None:
        """The simulated approvers (:func:`devtools.chaos.approvers.approve_until`)."""
        await approve_until(self._clients, self.stats.approvals, stop)

    async def dead_letters(self, tenant: str) -> list[int] | None:
        """The ids of the dead letters ``tenant``'s API key is shown (None: no answer)."""
        found: list[int] = []
        after = 0
        while True:
            try:
                response = await self._clients[tenant].get(
                    "/v1/outbox/dead-letters", params={"after": after, "limit": 200}
                )
                page = response.json() if response.status_code == 200 else None
            except (httpx.HTTPError, ValueError):
                return None
            if page is None:
                return None
            found += [int(d["id"]) for d in page["deadLetters"]]
            if page.get("next") is None:
                return found
            after = int(page["next"])

    async def discard(self, tenant: str, row_id: int) -> str:
        """Discard a dead letter as ``tenant``: the answer's status, or the error."""
        try:
            response = await self._clients[tenant].post(
                f"/v1/outbox/dead-letters/{row_id}/discard", json={"confirm": True}
            )
        except httpx.HTTPError as exc:
            return type(exc).__name__
        return str(response.status_code)


def _problem_code(response: httpx.Response) -> str | None:
    """The problem+json ``code`` of an answer, or None if it is not one."""
    if not response.headers.get("content-type", "").startswith("application/problem+json"):
        return None
    try:
        code = response.json().get("code")
    except (ValueError, AttributeError):
        return None
    return code if isinstance(code, str) else None
