"""Zombies where the fence decides: a worker stopped with calls in flight, woken up just
as another claim of one of them has been taken and is still in flight.

A plain zombie (``zombie``) holds side-effecting calls, which the recovery sweep moves to
``result_unknown``: its late outcome is refused by the status check alone. These two
catch it where only the lease owner and version can refuse it, the call being
``dispatching`` again under someone else:

- ``zombie_read_only``: the worker holds read-only calls; the sweep re-dispatches them
  and the other worker claims one;
- ``zombie_resend``: the worker holds side-effecting calls whose requests the provider
  never applied; the sweep leaves them ``result_unknown``, the reconciler finds nothing
  under their keys and re-sends one.

Their answers under the new claim are slowed, so the zombie, woken up the moment the new
claim shows, writes (or is fenced out) while that claim is still ``dispatching``.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from dispatcher.testing.chaos.load import APPROVED, READ_ONLY, READ_ONLY_KEYS, SIDE_EFFECT_KEYS
from dispatcher.testing.chaos.load import SIDE_EFFECTS as REFUND
from dispatcher.testing.chaos.schedule import FaultKind, PlannedFault
from dispatcher.testing.chaos.supervisor import Supervisor

log = logging.getLogger(__name__)

REQUESTS = "/v1/requests"
CATCH_SECONDS = 6.0
"""How long to wait for the victim to hold a call of the kind before stopping it anyway."""
CAUGHT_MS = 500
"""How long the provider takes to answer a read-only call while a zombie is being caught;
a zombie's repeated read (its first one times out as it wakes) may take as long."""
SLOW_MS = 1800
"""How long the provider takes to answer the new claim (under the 2 s request timeout)."""

Sandbox = Callable[[str, str, Any], Awaitable[Any]]
"""The sandbox's admin API: method, path, JSON body; the JSON answer."""


@dataclass(frozen=True, slots=True)
class Bait:
    """How a fence zombie is caught with calls of one kind in flight."""

    capabilities: tuple[str, ...]
    rule: dict[str, Any]
    """The sandbox rule that keeps such calls in flight long enough to be caught."""
    held_for: float
    """A claim this old (s) is in flight, not just answered."""


BAITS = {
    # Answered after a while: the zombie has an answer when it wakes up. As it wakes its
    # read times out (the timer and the answer are both due; the timer wins) and, the
    # call being read-only, is repeated: its second answer must come before the slowed
    # one of the new claim.
    FaultKind.ZOMBIE_READ_ONLY: Bait(
        (READ_ONLY,), {"kind": "latency", "latencyMs": CAUGHT_MS, "keyPrefix": READ_ONLY_KEYS}, 0.1
    ),
    # Held and never applied: a lookup finds nothing and the reconciler re-sends; the
    # zombie, woken up, sees its read time out and records "unknown".
    FaultKind.ZOMBIE_RESEND: Bait(
        (REFUND, APPROVED), {"kind": "timeout", "apply": False, "keyPrefix": SIDE_EFFECT_KEYS}, 0.5
    ),
}

_HELD = """
SELECT tool_call_id, idempotency_key FROM tool_calls
WHERE status = 'dispatching' AND capability_id = ANY(%s) AND lease_owner LIKE %s
  AND updated_at < now() - make_interval(secs => %s)
"""
_RECLAIMED = """
SELECT tool_call_id, lease_owner FROM tool_calls
WHERE status = 'dispatching' AND tool_call_id = ANY(%s)
  AND lease_owner IS NOT NULL AND lease_owner NOT LIKE %s
LIMIT 1
"""


@dataclass
class FenceZombies:
    supervisor: Supervisor
    database_url: str
    sandbox: Sandbox

    async def stop(self, fault: PlannedFault) -> tuple[str, Awaitable[None] | None]:
        """Stop a worker holding calls of the fault's kind; the target described, and
        what wakes it up (None: it was not stopped)."""
        bait = BAITS[fault.kind]
        workers = self.supervisor.of_role("worker")
        victim = workers[fault.target % len(workers)]
        if victim.process is None or not self.supervisor.alive(victim.name):
            return f"{victim.name} (down)", None
        # The worker's id (dispatcher.worker.consumer.new_worker_id) names its pid.
        owner = f"{socket.gethostname()}:{victim.process.pid}:%"
        held = await self._catch(bait, owner)
        if not self.supervisor.pause(victim.name):
            return f"{victim.name} (already stopped)", None
        held = held or await self._held(bait, owner)
        # The next request under each key (the new claim's) is slowed: the zombie wakes
        # up while the new claim is still in flight.
        for _, key in held:
            rule = {"kind": "latency", "latencyMs": SLOW_MS, "idempotencyKey": key, "times": 1}
            await self._rule(rule)
        ids = [call for call, _ in held]
        deadline = time.monotonic() + fault.seconds
        return f"{victim.name} holding {len(ids)}", self._wake(victim.name, owner, ids, deadline)

    async def _catch(self, bait: Bait, owner: str) -> list[tuple[str, str]]:
        """The victim's calls caught by the bait, one request at a time: a rule for one
        request, put back when another worker's request used it. None is left over when
        one is caught, so the rules that slow the new claims come first."""
        deadline = time.monotonic() + CATCH_SECONDS
        rule: int | None = None
        while time.monotonic() < deadline:
            if held := await self._held(bait, owner):
                return held
            rules = await self.sandbox("GET", "/v1/faults", None)
            if rule not in {r["id"] for r in rules["rules"]}:
                if rule is not None and (held := await self._held(bait, owner, settle=0.2)):
                    return held
                rule = await self._rule({**bait.rule, "times": 1})
            await asyncio.sleep(0.05)
        return []

    async def _rule(self, rule: dict[str, Any]) -> int:
        """Install a rule on requests; its id."""
        installed = await self.sandbox(
            "POST", "/v1/faults", {**rule, "path": REQUESTS, "method": "POST"}
        )
        return int(installed["rules"][-1]["id"])

    async def _held(self, bait: Bait, owner: str, settle: float = 0.0) -> list[tuple[str, str]]:
        await asyncio.sleep(settle)
        rows = await self._query(_HELD, list(bait.capabilities), owner, bait.held_for)
        return [(str(r[0]), str(r[1])) for r in rows]

    async def _wake(self, name: str, owner: str, ids: Sequence[str], deadline: float) -> None:
        """Resume the zombie as soon as another claim of one of its calls shows (or at
        ``deadline``, the planned stop's end)."""
        if not ids:  # caught with nothing of the kind: a plain zombie
            await asyncio.sleep(max(0.0, deadline - time.monotonic()))
        while ids and time.monotonic() < deadline:
            if found := await self._query(_RECLAIMED, list(ids), owner):
                log.info("waking %s: %s claimed by %s", name, found[0][0], found[0][1])
                break
            await asyncio.sleep(0.1)
        self.supervisor.resume(name)

    async def _query(self, statement: str, *params: Any) -> list[tuple[Any, ...]]:
        try:
            async with await psycopg.AsyncConnection.connect(
                self.database_url, autocommit=True, connect_timeout=2
            ) as conn:
                cur = await conn.execute(statement, params)
                return list(await cur.fetchall())
        except (OSError, psycopg.Error):  # the database is down for another fault
            return []
