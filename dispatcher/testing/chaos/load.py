"""The load of a chaos run: a steady mix of submissions over HTTP, idempotent replays,
a few stopped runs, and a simulated approver. Every 2xx answer is recorded: those
are the promises the checker holds the service to."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx

from dispatcher.testing.hostile import hostile_body

log = logging.getLogger(__name__)

SIDE_EFFECTS = "refund"
APPROVED = "refund-approved"
READ_ONLY = "lookup"
# How the capabilities' idempotency keys begin (their templates, in the run's registry):
# the sandbox's fault rules pick a kind of call by it.
SIDE_EFFECT_KEYS = "refund:"
READ_ONLY_KEYS = "lookup:"
CALLS_PER_RUN = 6
# The share of submissions that are hostile (dispatcher.testing.hostile): each must be
# refused with a 4xx and write nothing, and must not hurt the valid ones beside it.
HOSTILE_SHARE = 0.05
# The only refusals a valid submission may get here: its run was stopped by the load.
EXPECTED_REFUSALS = frozenset({"run_stopped"})


@dataclass(frozen=True, slots=True)
class Ack:
    """A submission the API acknowledged with a 2xx."""

    tool_call_id: str
    http_status: int
    body: str
    """The request body, so a replay sends exactly the same."""


@dataclass(frozen=True, slots=True)
class ReplayMismatch:
    original: str
    answered: str | None
    http_status: int


@dataclass
class LoadStats:
    attempted: int = 0
    acks: list[Ack] = field(default_factory=list)
    replays: int = 0
    replay_mismatches: list[ReplayMismatch] = field(default_factory=list)
    refused: Counter[str] = field(default_factory=Counter)
    """Answers other than 2xx (by status), and requests that got no answer (by error)."""
    by_kind: Counter[str] = field(default_factory=Counter)
    approvals: Counter[str] = field(default_factory=Counter)
    runs_stopped: int = 0
    hostile: Counter[str] = field(default_factory=Counter)
    """Hostile submissions by ``kind:status`` (``kind:no-answer`` when none came)."""
    hostile_misanswered: list[str] = field(default_factory=list)
    """Hostile submissions answered with anything but a 4xx problem+json."""
    valid_refused: list[str] = field(default_factory=list)
    """Valid submissions refused with a 4xx they did not deserve."""

    def summary(self) -> dict[str, Any]:
        return {
            "attempted": self.attempted,
            "acknowledged": len(self.acks),
            "byKind": dict(sorted(self.by_kind.items())),
            "replays": self.replays,
            "replayMismatches": len(self.replay_mismatches),
            "notAcknowledged": dict(sorted(self.refused.items())),
            "approvals": dict(sorted(self.approvals.items())),
            "runsStopped": self.runs_stopped,
            "hostile": dict(sorted(self.hostile.items())),
            "hostileMisanswered": len(self.hostile_misanswered),
            "validRefused": len(self.valid_refused),
        }


class Load:
    """Submits ``rate`` requests a second (at most ``in_flight`` at a time)."""

    def __init__(
        self, api_url: str, api_key: str, *, seed: int, rate: float, in_flight: int = 16
    ) -> None:
        self.stats = LoadStats()
        self._rng = random.Random(seed * 7919 + 1)  # noqa: S311 - replayable, not secret
        self._rate = rate
        self._seed = seed
        self._slots = asyncio.Semaphore(in_flight)
        self._client = httpx.AsyncClient(
            base_url=api_url,
            headers={"Authorization": f"Bearer {api_key}"},
            timeout=httpx.Timeout(10.0, connect=2.0),
        )
        self._tasks: set[asyncio.Task[None]] = set()

    async def close(self) -> None:
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._client.aclose()

    async def submit_until(self, stop: asyncio.Event) -> None:
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

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._slots.release()

    async def _one(self, n: int) -> None:
        roll = self._rng.random()
        acks = self.stats.acks
        if roll < 0.10 and acks:
            await self._replay(self._rng.choice(acks))
            return
        if roll < 0.12 and acks:
            await self._stop_run(n)
            return
        run_id = f"chaos-{self._seed}-r{n // CALLS_PER_RUN}"
        if roll < 0.12 + HOSTILE_SHARE:
            await self._hostile(n, run_id)
            return
        run_id = f"chaos-{self._seed}-r{n // CALLS_PER_RUN}"
        order = f"o-{self._seed}-{n}"
        call_input: dict[str, Any] = {
            "orderId": order,
            "amount": round(self._rng.uniform(1, 500), 2),
        }
        if roll < 0.26:
            kind, capability = "read_only", READ_ONLY
        elif roll < 0.36:
            kind, capability = "needs_approval", APPROVED
        elif roll < 0.44:
            kind, capability = "provider_fails", SIDE_EFFECTS
            call_input["simulate"] = "fail"
        elif roll < 0.52:
            kind, capability = "provider_pending", SIDE_EFFECTS
            call_input["simulate"] = "pending"
            call_input["pendingLookups"] = 1
        else:
            kind, capability = "side_effects", SIDE_EFFECTS
        body = json.dumps(
            {
                "runId": run_id,
                "capabilityId": capability,
                "correlationId": f"intent-{n}",
                "input": call_input,
            }
        )
        self.stats.attempted += 1
        self.stats.by_kind[kind] += 1
        answer = await self._post(body)
        if answer is not None and answer[0] < 300:
            self.stats.acks.append(Ack(answer[1], answer[0], body))

    async def _hostile(self, n: int, run_id: str) -> None:
        capability = self._rng.choice([SIDE_EFFECTS, APPROVED, READ_ONLY])
        hostile = hostile_body(
            self._rng, f"{self._seed}-{n}", capability_id=capability, run_id=run_id
        )
        self.stats.by_kind["hostile_input"] += 1
        try:
            response = await self._client.post(
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

    async def _replay(self, original: Ack) -> None:
        self.stats.replays += 1
        self.stats.by_kind["replay"] += 1
        answer = await self._post(original.body)
        if answer is None or answer[0] >= 300:
            # No answer, or a refusal (the API is down, the run was stopped since):
            # nothing new was promised.
            return
        status, tool_call_id = answer
        if status != 200 or tool_call_id != original.tool_call_id:
            self.stats.replay_mismatches.append(
                ReplayMismatch(original.tool_call_id, tool_call_id, status)
            )

    async def _post(self, body: str) -> tuple[int, str] | None:
        try:
            response = await self._client.post(
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
            return response.status_code, ""
        tool_call_id = response.json().get("toolCallId")
        return response.status_code, str(tool_call_id)

    async def _stop_run(self, n: int) -> None:
        # A run still taking calls: some of its calls are in flight when it stops.
        run_id = f"chaos-{self._seed}-r{max(0, n // CALLS_PER_RUN - 1)}"
        self.stats.by_kind["run_stop"] += 1
        try:
            response = await self._client.post(f"/v1/runs/{run_id}/stop", json={"reason": "chaos"})
        except httpx.HTTPError:
            return
        if response.status_code < 300:
            self.stats.runs_stopped += 1

    async def approve_until(self, stop: asyncio.Event, interval: float = 0.5) -> None:
        """The simulated approver: decides every pending approval, one in five rejected."""
        while not stop.is_set():
            try:
                response = await self._client.get("/v1/approvals", params={"status": "pending"})
                pending = (
                    response.json().get("approvals", []) if response.status_code == 200 else []
                )
                for approval in pending:
                    await self._decide(approval["approvalId"])
            except (httpx.HTTPError, ValueError):
                pass  # the API is down for a fault; the approvals wait
            try:
                await asyncio.wait_for(stop.wait(), interval)
            except TimeoutError:
                pass

    async def _decide(self, approval_id: str) -> None:
        reject = hashlib.sha256(approval_id.encode()).digest()[0] % 5 == 0
        decision = "reject" if reject else "approve"
        response = await self._client.post(
            f"/v1/approvals/{approval_id}/decision", json={"decision": decision, "reason": "chaos"}
        )
        self.stats.approvals[f"{decision}:{response.status_code}"] += 1


def _problem_code(response: httpx.Response) -> str | None:
    """The problem+json ``code`` of an answer, or None if it is not one."""
    if not response.headers.get("content-type", "").startswith("application/problem+json"):
        return None
    try:
        code = response.json().get("code")
    except (ValueError, AttributeError):
        return None
    return code if isinstance(code, str) else None
