"""The fault plan of a chaos run: which fault, when, against what, for how long.

Pure and derived from the seed only, so a failing run can be replayed fault for fault
(the processes' timing is not replayable, the plan is).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from enum import StrEnum


class FaultKind(StrEnum):
    """Every fault the harness knows how to inject."""

    KILL_WORKER = "kill_worker"
    KILL_RELAY = "kill_relay"
    KILL_RECONCILER = "kill_reconciler"
    KILL_API = "kill_api"
    KILL_BUS_INTAKE = "kill_bus_intake"
    """kill -9 of a bus intake process, caught with a batch in hand when one comes
    (:meth:`devtools.chaos.faults.Injector.kill_mid_batch`)."""
    BROKER_RESTART = "broker_restart"
    """kill -9 of the broker; the one started after it remembers nothing."""
    PG_TERMINATE = "pg_terminate"
    """``pg_terminate_backend`` of every connection to the run's database."""
    DB_RESTART = "db_restart"
    """Only when the run owns the database server."""
    PROVIDER_LATENCY = "provider_latency"
    PROVIDER_5XX = "provider_5xx"
    PROVIDER_429 = "provider_429"
    PROVIDER_TIMEOUT = "provider_timeout"
    PROVIDER_DROP_AFTER_APPLY = "provider_drop_after_apply"
    PROXY_STALL = "proxy_stall"
    PROXY_CUT = "proxy_cut"
    PROXY_DELAY = "proxy_delay"
    ZOMBIE = "zombie"
    """A worker SIGSTOPped past its lease, resumed after the call was taken over."""
    ZOMBIE_READ_ONLY = "zombie_read_only"
    """A worker stopped holding read-only calls, resumed once another worker claimed
    one again (:mod:`devtools.chaos.zombies`)."""
    ZOMBIE_RESEND = "zombie_resend"
    """A worker stopped holding side-effecting calls the provider never applied,
    resumed once the reconciler re-sent one."""


KILLS = {
    FaultKind.KILL_WORKER: "worker",
    FaultKind.KILL_RELAY: "relay",
    FaultKind.KILL_RECONCILER: "reconciler",
    FaultKind.KILL_API: "api",
    FaultKind.KILL_BUS_INTAKE: "bus-intake",
}
"""Kill faults and the role whose process they hit."""


@dataclass(frozen=True, slots=True)
class PlannedFault:
    """One fault: injected ``at`` seconds into the run, lifted ``seconds`` later
    (restart, resume, proxy back to passing); ``target`` picks one of several
    processes of a role; ``times`` is how many requests a provider fault hits."""

    at: float
    kind: FaultKind
    seconds: float
    target: int = 0
    times: int = 0


def applicable(*, owns_database: bool, owns_broker: bool) -> list[FaultKind]:
    """The faults a run can inject: a borrowed server is never restarted."""
    skip = set()
    if not owns_database:
        skip.add(FaultKind.DB_RESTART)
    if not owns_broker:
        skip.add(FaultKind.BROKER_RESTART)
    return [kind for kind in FaultKind if kind not in skip]


def plan(
    seed: int,
    duration: float,
    *,
    owns_database: bool,
    owns_broker: bool,
    mean_gap: float = 4.0,
    warmup: float = 4.0,
    lead: FaultKind | None = None,
) -> list[PlannedFault]:
    """Faults spread over ``[warmup, duration)`` about ``mean_gap`` apart.

    Kinds are dealt from shuffled decks of every applicable kind, so a run long enough
    for one deck injects each kind at least once; ``lead`` (if given) comes first, alone
    until it is lifted.
    Each fault is lifted before the fault phase ends.
    """
    rng = random.Random(seed)  # noqa: S311 - replayable, not secret
    kinds = applicable(owns_database=owns_database, owns_broker=owns_broker)
    faults: list[PlannedFault] = []
    deck: list[FaultKind] = [lead] if lead is not None else []
    at = warmup
    while True:
        if not deck:
            deck = rng.sample(kinds, len(kinds))
        kind = deck.pop(0)
        seconds = _seconds(rng, kind)
        if at + seconds >= duration:
            break
        faults.append(
            PlannedFault(
                at=round(at, 3),
                kind=kind,
                seconds=round(seconds, 3),
                target=rng.randrange(2),
                times=rng.randint(5, 30) if kind.value.startswith("provider_") else 0,
            )
        )
        if lead is not None and len(faults) == 1:
            # The lead has the run to itself until it is lifted: nothing else gets in the
            # way of the defect it is there to provoke (a worker killed under a zombie).
            at += seconds
        at += rng.uniform(0.5, 1.5) * mean_gap
    return faults


def _seconds(rng: random.Random, kind: FaultKind) -> float:
    if kind is FaultKind.ZOMBIE:
        # Past the lease (timeouts x attempts + margin: about 7 s with the chaos
        # registry) and the broker's session timeout, so another worker takes over.
        return rng.uniform(10.0, 13.0)
    # The longest these stop a worker: each is resumed as soon as another claim of one
    # of its calls shows. A re-dispatch takes the lease (about 7 s) and a claim; a
    # re-send also waits out the capability's inFlightSeconds (10 s) and a lookup.
    if kind is FaultKind.ZOMBIE_READ_ONLY:
        return rng.uniform(14.0, 16.0)
    if kind is FaultKind.ZOMBIE_RESEND:
        return rng.uniform(20.0, 24.0)
    if kind in (FaultKind.PROXY_STALL, FaultKind.PROXY_CUT, FaultKind.PROXY_DELAY):
        return rng.uniform(2.0, 6.0)
    if kind in (FaultKind.BROKER_RESTART, FaultKind.DB_RESTART):
        return rng.uniform(1.0, 3.0)
    if kind.value.startswith("provider_") or kind is FaultKind.PG_TERMINATE:
        return 0.0
    return rng.uniform(0.5, 3.0)  # a killed process stays down this long
