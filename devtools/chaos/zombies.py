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
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import psycopg

from devtools.chaos.load import (
    APPROVED,
    READ_ONLY,
    READ_ONLY_KEYS,
    SIDE_EFFECT_KEYS,
    TENANT,
)
from devtools.chaos.load import SIDE_EFFECTS as REFUND
from devtools.chaos.schedule import FaultKind, PlannedFault
from devtools.chaos.supervisor import Supervisor
from dispatcher.tenancy import provider_key, stored_provider_key
from kit.owners import owner_prefix

log = logging.getLogger(__name__)

REQUESTS = "/v1/requests"
CATCH_SECONDS = 10.0
"""How long to wait for a worker to hold a call of the kind before stopping one anyway
(about 0.4 read-only submissions a second of the first tenant, whose provider keys the
baits match: four, on average)."""
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
        (READ_ONLY,),
        {
            "kind": "latency",
            "latencyMs": CAUGHT_MS,
            "keyPrefix": provider_key(TENANT, READ_ONLY_KEYS),
        },
        0.1,
    ),
    # Held and never applied: a lookup finds nothing and the reconciler re-sends; the
    # zombie, woken up, sees its read time out and records "unknown".
    FaultKind.ZOMBIE_RESEND: Bait(
        (REFUND, APPROVED),
        {"kind": "timeout", "apply": False, "keyPrefix": provider_key(TENANT, SIDE_EFFECT_KEYS)},
        0.5,
    ),
}

_HELD = """
SELECT tenant, tool_call_id, provider_key, lease_owner, idempotency_key FROM tool_calls
WHERE status = 'dispatching' AND capability_id = ANY(%s) AND lease_owner LIKE ANY(%s)
  AND updated_at < now() - make_interval(secs => %s)
ORDER BY lease_owner
"""
# A toolCallId names a call only with its tenant: the run's tenants share some.
_RECLAIMED = """
SELECT tenant, tool_call_id, lease_owner FROM tool_calls
WHERE status = 'dispatching'
  AND (tenant, tool_call_id) IN (SELECT * FROM unnest(%s::text[], %s::text[]))
  AND lease_owner IS NOT NULL AND lease_owner NOT LIKE %s
LIMIT 1
"""


@dataclass(frozen=True, slots=True)
class Held:
    """Calls of one worker in flight: ``((tenant, tool_call_id), provider_key)`` each
    (the key the sandbox receives for the call, which its rules match)."""

    worker: str
    owner: str
    """What the worker's lease owner starts with (a LIKE pattern)."""
    calls: list[tuple[tuple[str, str], str]]


@dataclass
class FenceZombies:
    supervisor: Supervisor
    database_url: str
    sandbox: Sandbox

    async def stop(self, fault: PlannedFault) -> tuple[str, Awaitable[None] | None]:
        """Stop the first worker caught holding calls of the fault's kind (or, none
        caught, the fault's target); the target described, and what wakes it up (None:
        it was not stopped)."""
        bait = BAITS[fault.kind]
        workers = self.supervisor.of_role("worker")
        owners = {
            m.name: owner_prefix("worker", m.process.pid) + "%"
            for m in workers[fault.target % len(workers) :] + workers
            if m.process is not None and self.supervisor.alive(m.name)
        }
        if not owners:
            return "no worker up", None
        held = await self._catch(bait, owners) or Held(*next(iter(owners.items())), [])
        if not self.supervisor.pause(held.worker):
            return f"{held.worker} (already stopped)", None
        # The next request under each key (the new claim's) is slowed: the zombie wakes
        # up while the new claim is still in flight.
        slowed = {
            call: await self._rule(
                {"kind": "latency", "latencyMs": SLOW_MS, "idempotencyKey": key, "times": 1}
            )
            for call, key in held.calls
        }
        deadline = time.monotonic() + fault.seconds
        return f"{held.worker} holding {len(held.calls)}", self._wake(held, slowed, deadline)

    async def _catch(self, bait: Bait, owners: dict[str, str]) -> Held | None:
        """The first worker caught holding calls by the bait, one request at a time: a
        rule for one request, put back when it was used and nothing was caught. None is
        left over when one is caught, so the rules that slow the new claims come first."""
        deadline = time.monotonic() + CATCH_SECONDS
        rule: int | None = None
        while time.monotonic() < deadline:
            if held := await self._held(bait, owners):
                return held
            if rule not in await self._rules():
                if rule is not None and (held := await self._held(bait, owners, settle=0.2)):
                    return held
                rule = await self._rule({**bait.rule, "times": 1})
            await asyncio.sleep(0.05)
        return None

    async def _rule(self, rule: dict[str, Any]) -> int:
        """Install a rule on requests; its id."""
        installed = await self.sandbox(
            "POST", "/v1/faults", {**rule, "path": REQUESTS, "method": "POST"}
        )
        return int(installed["rules"][-1]["id"])

    async def _held(self, bait: Bait, owners: dict[str, str], settle: float = 0.0) -> Held | None:
        await asyncio.sleep(settle)
        rows = await self._query(
            _HELD, list(bait.capabilities), list(owners.values()), bait.held_for
        )
        for worker, owner in owners.items():  # the fault's target first
            prefix = owner.rstrip("%")
            if calls := [
                ((str(r[0]), str(r[1])), stored_provider_key(str(r[0]), str(r[4]), r[2]))
                for r in rows
                if str(r[3]).startswith(prefix)
            ]:
                return Held(worker, owner, calls)
        return None

    async def _wake(self, held: Held, slowed: dict[tuple[str, str], int], deadline: float) -> None:
        """Resume the zombie as soon as another claim of one of its calls shows and that
        claim's request has reached the provider (or at ``deadline``, the planned stop's
        end): woken earlier, the zombie's repeated read would take the slowed answer."""
        calls = [call for call, _ in held.calls]
        if not calls:  # caught with nothing of the kind: a plain zombie
            await asyncio.sleep(max(0.0, deadline - time.monotonic()))
        tenants, ids = [t for t, _ in calls], [i for _, i in calls]
        while calls and time.monotonic() < deadline:
            if found := await self._query(_RECLAIMED, tenants, ids, held.owner):
                tenant, call, claimant = found[0]
                await self._used(slowed[(tenant, call)], within=1.0)
                log.info("waking %s: %s/%s claimed by %s", held.worker, tenant, call, claimant)
                break
            await asyncio.sleep(0.1)
        self.supervisor.resume(held.worker)

    async def _used(self, rule: int, *, within: float) -> None:
        """Return once ``rule`` is used up, or after ``within`` seconds."""
        for _ in range(int(within / 0.02)):
            if rule not in await self._rules():
                return
            await asyncio.sleep(0.02)

    async def _rules(self) -> set[int]:
        """The ids of the sandbox's rules not used up yet."""
        return {int(r["id"]) for r in (await self.sandbox("GET", "/v1/faults", None))["rules"]}

    async def _query(self, statement: str, *params: Any) -> list[tuple[Any, ...]]:
        try:
            async with await psycopg.AsyncConnection.connect(
                self.database_url, autocommit=True, connect_timeout=2
            ) as conn:
                cur = await conn.execute(statement, params)
                return list(await cur.fetchall())
        except (OSError, psycopg.Error):  # the database is down for another fault
            return []
