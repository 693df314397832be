"""The retention job in a chaos run, and what it archived.

Retention keeps finished calls for :data:`AGE_SECONDS` only, and the job runs as it
runs in production, ``tool-dispatcher retention --once``, one pass every
:data:`EVERY_SECONDS` while the load, the faults and the other processes go on. Some
passes are armed to kill themselves (kill -9) at one of the job's crash points, chosen
by the seed; the next pass must resume what they left. After the run settled, one last
pass runs unarmed, and :func:`archived` reads back everything the archive holds, for
the checker: archived calls are the run's calls as much as live ones.
"""

from __future__ import annotations

import asyncio
import random
import sys
from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dispatcher.retention.archive import Archive
from dispatcher.retention.crashpoints import LABELS
from dispatcher.retention.rows import from_arrow
from dispatcher.states import (
    TERMINAL_STATES,
    ApprovalStatus,
    EscalationStatus,
    ReconciliationStatus,
)
from dispatcher.states import ExecutionStatus as S

AGE_SECONDS = 15.0
"""How long a finished call stays after its last change: a replay (at most
:data:`devtools.chaos.load.REPLAY_WITHIN` after its acknowledgement) still finds it."""
WINDOW_SECONDS = 30.0
"""The chaos capabilities' provider idempotency window: a call leaves only after it."""
EVERY_SECONDS = 3.0
ARMED_SHARE = 0.3
"""Passes that kill themselves at a crash point."""


def environment(work: Path) -> dict[str, str]:
    """The retention settings of every process of the run (only the job reads them)."""
    return {
        "TOOL_DISPATCHER_RETENTION_DAYS": repr(AGE_SECONDS / 86_400),
        "TOOL_DISPATCHER_ARCHIVE_URL": f"file://{work / 'archive'}",
        "TOOL_DISPATCHER_RETENTION_BATCH_SIZE": "50",
    }


class RetentionJob:
    """Runs the passes; counts how they ended (exit code, or -9 when a crash point
    killed one)."""

    def __init__(self, env: Mapping[str, str], logs: Path, *, seed: int, cli: str) -> None:
        self._env = dict(env)
        # One log for every pass, opened here: the passes run on the event loop.
        self._log = (logs / "retention.log").open("a")
        self._rng = random.Random(seed * 104_729 + 3)  # noqa: S311 - replayable
        self._cli = cli
        self.exits: Counter[str] = Counter()
        self.crashes: Counter[str] = Counter()
        self._passes = 0

    async def run_until(self, stop: asyncio.Event) -> None:
        # The armed passes take the crash points in turn, from one the seed picks, so
        # that even a short run meets each of them.
        labels = sorted(LABELS)
        turn = self._rng.randrange(len(labels))
        while not stop.is_set():
            label = None
            if self._rng.random() < ARMED_SHARE:
                label, turn = labels[turn % len(labels)], turn + 1
            await self.one_pass(crash_at=label)
            try:
                await asyncio.wait_for(stop.wait(), EVERY_SECONDS)
            except TimeoutError:
                pass

    async def one_pass(self, *, crash_at: str | None = None) -> int:
        self._passes += 1
        env = dict(self._env)
        if crash_at is not None:
            env["TOOL_DISPATCHER_CRASH_AT"] = crash_at
        self._log.write(f"--- pass {self._passes}, crash at {crash_at or 'nothing'}\n")
        self._log.flush()
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            self._cli,
            "retention",
            "--once",
            env=env,
            stdout=self._log,
            stderr=self._log,
        )
        code = await process.wait()
        self.exits[str(code)] += 1
        if code == -9 and crash_at is not None:
            self.crashes[crash_at] += 1
        return code

    def close(self) -> None:
        self._log.close()

    def summary(self) -> dict[str, Any]:
        return {
            "passes": self._passes,
            "exits": dict(sorted(self.exits.items())),
            "killedAt": dict(sorted(self.crashes.items())),
        }


@dataclass
class Archived:
    """What the archive holds, as the database held it: rows by table, with the file
    each came from."""

    calls: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    escalations: list[dict[str, Any]] = field(default_factory=list)
    approvals: list[dict[str, Any]] = field(default_factory=list)

    def copies(self) -> Counter[tuple[str, str]]:
        """How many times the archive holds each call (once, if all is well)."""
        return Counter((r["tenant"], r["tool_call_id"]) for r in self.calls)


def archived(url: str, tenants: Iterable[str]) -> Archived:
    """Every row of every tenant's archive (each row carries its ``tenant``)."""
    archive = Archive(url)
    found = Archived()
    for tenant in tenants:
        for table in ("calls", "events", "escalations", "approvals"):
            paths = archive.tenant_files(tenant, table)
            if not paths:
                continue
            rows = from_arrow(table, archive.read(paths))
            getattr(found, table).extend(rows)
    return found


def breaches(
    found: Archived, live: Collection[tuple[str, str]], live_events: Iterable[tuple[str, Any]]
) -> list[str]:
    """What the archive shows retention did wrong: a call archived twice, archived and
    still live, archived before it was finished (or while an escalation or an approval
    was open), or one that moved after it was archived (an event of it, still in the
    live log, that the archive does not hold)."""
    found_events = {r["event_id"] for r in found.events}
    open_escalations = {
        (r["tenant"], r["tool_call_id"])
        for r in found.escalations
        if r["status"] != EscalationStatus.RESOLVED.value
    }
    pending = {
        (r["tenant"], r["tool_call_id"])
        for r in found.approvals
        if r["status"] == ApprovalStatus.PENDING.value
    }
    out = []
    for name, n in sorted(found.copies().items()):
        if n > 1:
            out.append(f"{'/'.join(name)}: archived {n} times")
        if name in live:
            out.append(f"{'/'.join(name)}: archived, and still live")
        if name in open_escalations:
            out.append(f"{'/'.join(name)}: archived with an escalation open")
        if name in pending:
            out.append(f"{'/'.join(name)}: archived with its approval pending")
    for row in found.calls:
        shown = f"{row['tenant']}/{row['tool_call_id']}"
        if S(row["status"]) not in TERMINAL_STATES:
            out.append(f"{shown}: archived while {row['status']}")
        if row["reconciliation_status"] == ReconciliationStatus.PENDING.value:
            out.append(f"{shown}: archived while the reconciler still followed it")
    archived_calls = set(found.copies())
    for tenant, event in live_events:
        if (tenant, event.tool_call_id) in archived_calls and event.event_id not in found_events:
            out.append(f"{tenant}/{event.tool_call_id}: {event.event_type} after it was archived")
    return out
