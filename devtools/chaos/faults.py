"""Carrying out the planned faults against the running stack."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx
import psycopg

from devtools.chaos.infra import Infrastructure
from devtools.chaos.proxy import ProxyMode, TcpProxy
from devtools.chaos.schedule import KILLS, FaultKind, PlannedFault
from devtools.chaos.supervisor import Supervisor
from devtools.chaos.zombies import BAITS, FenceZombies

log = logging.getLogger(__name__)

REQUESTS = "/v1/requests"

_PROVIDER_RULES: dict[FaultKind, dict[str, Any]] = {
    FaultKind.PROVIDER_LATENCY: {"kind": "latency", "latencyMs": 600},
    FaultKind.PROVIDER_5XX: {"kind": "error", "status": 503},
    FaultKind.PROVIDER_429: {"kind": "rate_limit", "retryAfter": 0},
    # Applies, then holds the answer until the worker's read timeout fires.
    FaultKind.PROVIDER_TIMEOUT: {"kind": "timeout", "apply": True},
    FaultKind.PROVIDER_DROP_AFTER_APPLY: {"kind": "drop_after_apply"},
}
ZOMBIE_BAIT = {"kind": "latency", "latencyMs": 1500, "path": REQUESTS, "method": "POST"}
_PROXY_MODES = {
    FaultKind.PROXY_STALL: ProxyMode.STALL,
    FaultKind.PROXY_CUT: ProxyMode.CUT,
    FaultKind.PROXY_DELAY: ProxyMode.DELAY,
}


@dataclass
class Injector:
    """Injects faults; every fault with a duration is lifted by its own task."""

    supervisor: Supervisor
    infra: Infrastructure
    proxy: TcpProxy
    sandbox_url: str
    injected: Counter[str] = field(default_factory=Counter)
    log: list[dict[str, Any]] = field(default_factory=list)
    last_injected: float | None = None
    """When (monotonic) the last fault was injected."""
    _lifting: set[asyncio.Task[None]] = field(default_factory=set)
    _zombies: FenceZombies = field(init=False)

    def __post_init__(self) -> None:
        self._zombies = FenceZombies(
            self.supervisor,
            self.infra.database_url,
            self._sandbox,
        )

    async def inject(self, fault: PlannedFault, at: float) -> None:
        target = await self._apply(fault)
        self.last_injected = time.monotonic()
        self.injected[fault.kind.value] += 1
        self.log.append({"at": round(at, 2), "kind": fault.kind.value, "target": target})
        log.info("fault %s at %.1fs on %s", fault.kind.value, at, target)

    async def _apply(self, fault: PlannedFault) -> str:
        kind = fault.kind
        if kind is FaultKind.KILL_BUS_INTAKE:
            return await self.kill_mid_batch(fault)
        if kind in KILLS:
            members = self.supervisor.of_role(KILLS[kind])
            victim = members[fault.target % len(members)].name
            self.supervisor.kill(victim, fault.seconds)
            return victim
        if kind is FaultKind.ZOMBIE:
            workers = self.supervisor.of_role("worker")
            victim = workers[fault.target % len(workers)].name
            # Slow answers for a moment, so the worker is caught with requests in
            # flight: the case where fencing matters.
            await self._sandbox("POST", "/v1/faults", {**ZOMBIE_BAIT, "times": 8})
            await asyncio.sleep(0.5)
            if self.supervisor.pause(victim):
                self._later(fault.seconds, self._resume(victim))
            return victim
        if kind in BAITS:
            target, wake = await self._zombies.stop(fault)
            if wake is not None:
                self._later(0.0, wake)
            return target
        if kind is FaultKind.BROKER_RESTART:
            await self.infra.kill_broker()
            self._later(fault.seconds, self.infra.start_broker())
            return "broker"
        if kind is FaultKind.DB_RESTART:
            await self.infra.stop_database()
            self._later(fault.seconds, self.infra.start_database())
            return "database"
        if kind is FaultKind.PG_TERMINATE:
            try:
                return f"{await self.infra.terminate_connections()} connections"
            except (OSError, psycopg.Error) as exc:  # the database is down for another fault
                return f"not done: {type(exc).__name__}"
        if kind in _PROXY_MODES:
            self.proxy.set_mode(_PROXY_MODES[kind], delay_seconds=0.5)
            self._later(fault.seconds, self._proxy_back())
            return "proxy"
        rule = {**_PROVIDER_RULES[kind], "path": REQUESTS, "method": "POST", "times": fault.times}
        await self._sandbox("POST", "/v1/faults", rule)
        return f"next {fault.times} requests"

    async def kill_mid_batch(self, fault: PlannedFault) -> str:
        """kill -9 of a bus intake process with a batch in hand: read from Kafka, not yet
        recorded (so neither committed). ``bus_offsets`` is locked against writes, which
        holds a batch at its first statement and nothing else of the service; the first
        process seen waiting on it is killed, else the planned one; then the lock goes.
        Without the database (another fault), a plain kill."""
        members = [m.name for m in self.supervisor.of_role(KILLS[fault.kind])]
        planned = members[fault.target % len(members)]
        try:
            conn = await psycopg.AsyncConnection.connect(
                self.infra.database_url, connect_timeout=2, application_name="chaos-injector"
            )
        except (OSError, psycopg.Error) as exc:
            self.supervisor.kill(planned, fault.seconds)
            return f"{planned} (database away: {type(exc).__name__})"
        try:
            caught = await _caught_mid_batch(conn, members, planned)
        except (OSError, psycopg.Error) as exc:
            log.warning("no bus intake caught mid-batch: %s", exc)
            caught = None
        self.supervisor.kill(caught or planned, fault.seconds)
        with contextlib.suppress(OSError, psycopg.Error):
            await conn.rollback()
        with contextlib.suppress(OSError, psycopg.Error):
            await conn.close()
        return f"{caught} (mid-batch)" if caught else planned

    def _later(self, seconds: float, lift: Any) -> None:
        async def run() -> None:
            await asyncio.sleep(seconds)
            await lift

        task = asyncio.create_task(run())
        self._lifting.add(task)
        task.add_done_callback(self._lifting.discard)

    async def _resume(self, name: str) -> None:
        self.supervisor.resume(name)

    async def _proxy_back(self) -> None:
        self.proxy.set_mode(ProxyMode.PASS)

    async def lift_all(self) -> None:
        """Wait for every planned lift, then make sure nothing is left broken."""
        if self._lifting:
            await asyncio.gather(*self._lifting, return_exceptions=True)
        await self.infra.start_broker()
        await self.infra.start_database()
        self.proxy.set_mode(ProxyMode.PASS)
        self.supervisor.release_all()
        await self._sandbox("DELETE", "/v1/faults")

    async def _sandbox(self, method: str, path: str, body: Any = None) -> Any:
        async with httpx.AsyncClient(base_url=self.sandbox_url, timeout=5.0) as client:
            response = await client.request(method, path, json=body)
            response.raise_for_status()
            return response.json()


MID_BATCH_WITHIN = 3.0
"""How long a batch is waited for: the load writes a request record about every half
second, each recorded in the batch that fetches it."""


async def _caught_mid_batch(
    conn: psycopg.AsyncConnection[Any], names: list[str], planned: str
) -> str | None:
    """Lock ``bus_offsets`` in ``conn``'s transaction (left open: the caller kills, then
    rolls back) and wait for a process of ``names`` to wait on it: its name, the
    planned one first if both are. SHARE mode conflicts with the recorder's first
    statement (``INSERT ... ON CONFLICT`` on ``bus_offsets``), no one else writes the
    table, and plain reads go on."""
    await conn.execute("SET LOCAL lock_timeout = '2s'")
    await conn.execute("LOCK TABLE bus_offsets IN SHARE MODE")
    deadline = time.monotonic() + MID_BATCH_WITHIN
    while time.monotonic() < deadline:
        # Within one transaction pg_stat_activity is read once; a fresh look each time.
        await conn.execute("SELECT pg_stat_clear_snapshot()")
        cursor = await conn.execute(
            "SELECT DISTINCT application_name FROM pg_stat_activity"
            " WHERE datname = current_database() AND wait_event_type = 'Lock'"
            " AND application_name = ANY(%s)",
            (names,),
        )
        waiting = {row[0] for row in await cursor.fetchall()}
        if waiting:
            return planned if planned in waiting else min(waiting)
        await asyncio.sleep(0.05)
    return None
