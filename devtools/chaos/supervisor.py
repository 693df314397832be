"""The service's processes during a chaos run: started, killed, paused, restarted.

Each process runs in a session of its own, so a signal reaches it and its children
and nothing else. A process that exits on its own (a broker or database it could not
live without) is restarted by :meth:`Supervisor.watch` and counted; one the harness
killed is restarted once its planned pause is over.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)


@dataclass
class Managed:
    """One supervised process: its command line and what happened to it."""

    name: str
    role: str
    argv: list[str]
    env: dict[str, str]
    process: subprocess.Popen[bytes] | None = None
    down_until: float | None = None
    """Killed on purpose: not restarted before this (monotonic) time."""
    paused: bool = False
    starts: int = 0


@dataclass
class Supervisor:
    log_dir: Path
    env: Mapping[str, str]
    processes: dict[str, Managed] = field(default_factory=dict)
    unexpected_exits: Counter[str] = field(default_factory=Counter)
    _closing: bool = False

    def add(
        self, name: str, role: str, argv: Sequence[str], env: Mapping[str, str] | None = None
    ) -> Managed:
        # libpq names the process's database sessions after it (pg_stat_activity's
        # application_name), so a diagnosis can tell whose transaction holds a lock.
        managed = Managed(name, role, list(argv), {**self.env, "PGAPPNAME": name, **(env or {})})
        self.processes[name] = managed
        return managed

    def of_role(self, role: str) -> list[Managed]:
        return [m for m in self.processes.values() if m.role == role]

    def start(self, name: str) -> None:
        managed = self.processes[name]
        managed.starts += 1
        log_path = self.log_dir / f"{name}.log"
        # The child keeps its own copy of the descriptor; ours is closed at once.
        with log_path.open("ab") as out:
            managed.process = subprocess.Popen(  # noqa: S603 - our own interpreter and module
                [sys.executable, *managed.argv],
                env=managed.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        managed.down_until = None
        managed.paused = False

    def start_all(self) -> None:
        for name in self.processes:
            self.start(name)

    def kill(self, name: str, down_for: float) -> None:
        """kill -9 (the whole session); restarted by :meth:`watch` after ``down_for``."""
        managed = self.processes[name]
        managed.down_until = time.monotonic() + down_for
        self._signal(managed, signal.SIGKILL)
        managed.paused = False

    def pause(self, name: str) -> bool:
        managed = self.processes[name]
        if managed.paused or not self.alive(name):
            return False
        self._signal(managed, signal.SIGSTOP)
        managed.paused = True
        return True

    def resume(self, name: str) -> None:
        managed = self.processes[name]
        if managed.paused:
            self._signal(managed, signal.SIGCONT)
            managed.paused = False

    def alive(self, name: str) -> bool:
        process = self.processes[name].process
        return process is not None and process.poll() is None

    def restart_due(self) -> list[str]:
        """Start every process that is down and not held down; the names started."""
        now = time.monotonic()
        started = []
        for name, managed in self.processes.items():
            if self.alive(name):
                continue
            if managed.down_until is None and managed.process is not None:
                self.unexpected_exits[name] += 1
                log.warning("%s exited on its own (%s); restarting", name, managed.process.poll())
            elif managed.down_until is not None and now < managed.down_until:
                continue
            self.start(name)
            started.append(name)
        return started

    def release_all(self) -> None:
        """End every planned pause now: resume the stopped, restart the killed."""
        for name, managed in self.processes.items():
            self.resume(name)
            if managed.down_until is not None:
                managed.down_until = time.monotonic()
        self.restart_due()

    async def watch(self, interval: float = 0.2) -> None:
        while not self._closing:
            self.restart_due()
            await asyncio.sleep(interval)

    def stop_all(self, grace: float = 10.0) -> None:
        self._closing = True
        for managed in self.processes.values():
            if managed.process is not None and managed.process.poll() is None:
                self._signal(managed, signal.SIGCONT)
                self._signal(managed, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for managed in self.processes.values():
            if managed.process is None:
                continue
            try:
                managed.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self._signal(managed, signal.SIGKILL)
                managed.process.wait()

    @staticmethod
    def _signal(managed: Managed, signum: signal.Signals) -> None:
        process = managed.process
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signum)
        if signum is signal.SIGKILL:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=5)
