"""What every benchmark here shares: driving N concurrent clients for a fixed window,
latency percentiles, CPU accounting per process, and the printed tables."""

from __future__ import annotations

import asyncio
import math
import os
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil  # type: ignore[import-untyped]
from sqlalchemy.engine import make_url

# One call of one client; the harness times it.
Call = Callable[[], Awaitable[object]]


@dataclass
class Cell:
    """The outcome of one (mode, clients) measurement."""

    mode: str
    clients: int
    calls: int = 0
    seconds: float = 0.0
    errors: int = 0
    latencies: list[float] = field(default_factory=list, repr=False)
    # Percent of one core used during the window, by role ("client", "server", "postgres").
    cpu: dict[str, float] = field(default_factory=dict)
    note: str = ""
    # Which repetition of the cell this is (bench.intake --rounds).
    round: int = 0

    @property
    def rate(self) -> float:
        return self.calls / self.seconds if self.seconds else 0.0

    def percentile(self, q: float) -> float:
        """Latency quantile in milliseconds (nearest rank); NaN without samples."""
        if not self.latencies:
            return math.nan
        ordered = sorted(self.latencies)
        rank = min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))
        return ordered[rank] * 1000


async def drive(
    cell: Cell,
    calls: Sequence[Call],
    *,
    seconds: float,
    warmup: float,
    cpu: CpuMeter | None = None,
) -> Cell:
    """Run each of ``calls`` in its own loop, back to back, and count the calls that
    complete inside a window of ``seconds`` that opens after ``warmup``."""
    recording = False
    stopping = False
    first_error: list[BaseException] = []

    async def client(call: Call) -> None:
        while not stopping:
            started = time.perf_counter()
            try:
                await call()
            except Exception as exc:  # noqa: BLE001 - counted and shown; one bad call must not end the cell
                if recording:
                    cell.errors += 1
                if not first_error:
                    first_error.append(exc)
                await asyncio.sleep(0.01)
                continue
            if recording:
                cell.latencies.append(time.perf_counter() - started)

    tasks = [asyncio.create_task(client(c)) for c in calls]
    try:
        await asyncio.sleep(warmup)
        recording = True
        if cpu:
            cpu.start()
        opened = time.perf_counter()
        await asyncio.sleep(seconds)
        recording = False
        cell.seconds = time.perf_counter() - opened
        if cpu:
            cell.cpu = cpu.stop()
        stopping = True
        await asyncio.wait(tasks, timeout=30)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    cell.calls = len(cell.latencies)
    if first_error:
        cell.note = f"{type(first_error[0]).__name__}: {first_error[0]}"[:200]
    return cell


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine has been busy since boot (all cores)."""
    t = psutil.cpu_times()
    return float(sum(t) - t.idle - getattr(t, "iowait", 0.0))


class CpuMeter:
    """CPU seconds used by groups of processes between start() and stop(), as percent
    of one core. A group is a callable so that processes born mid-run are found.

    ``other`` is what the rest of the machine used meanwhile: on a shared machine it
    tells whether a cell competed with someone else for the two cores."""

    def __init__(self, groups: dict[str, Callable[[], Iterable[psutil.Process]]]) -> None:
        self._groups = groups
        self._before: dict[str, dict[int, float]] = {}
        self._machine = 0.0
        self._started = 0.0

    @staticmethod
    def _times(procs: Iterable[psutil.Process]) -> dict[int, float]:
        out: dict[int, float] = {}
        for proc in procs:
            try:
                t = proc.cpu_times()
                out[proc.pid] = t.user + t.system
            except psutil.Error:
                continue
        return out

    def start(self) -> None:
        self._before = {name: self._times(find()) for name, find in self._groups.items()}
        self._machine = machine_busy_seconds()
        self._started = time.perf_counter()

    def stop(self) -> dict[str, float]:
        elapsed = time.perf_counter() - self._started
        result: dict[str, float] = {}
        for name, find in self._groups.items():
            before = self._before.get(name, {})
            after = self._times(find())
            used = sum(t - before.get(pid, 0.0) for pid, t in after.items())
            result[name] = 100 * used / elapsed if elapsed else 0.0
        machine = 100 * (machine_busy_seconds() - self._machine) / elapsed if elapsed else 0.0
        result["other"] = max(0.0, machine - sum(result.values()))
        return result


def postgres_processes(database: str) -> list[psutil.Process]:
    """The local PostgreSQL server's shared processes (walwriter, checkpointer...) and
    the backends connected to ``database``; other databases' backends are left out."""
    procs = []
    for proc in psutil.process_iter(["name", "cmdline"]):
        if proc.info["name"] not in ("postgres", "postmaster"):
            continue
        title = " ".join(proc.info["cmdline"] or [])
        is_backend = ("(" in title and ")" in title) or "[local]" in title
        if not is_backend or f" {database} " in title:
            procs.append(proc)
    return procs


def postgres_meter(url: str, **roles: psutil.Process | list[psutil.Process]) -> CpuMeter:
    """CPU of the given processes (a role may be several) and of the PostgreSQL
    processes serving ``url``."""
    database = make_url(url).database or ""
    groups = {
        name: (lambda p=procs: p if isinstance(p, list) else [p]) for name, procs in roles.items()
    }
    return CpuMeter({**groups, "postgres": lambda: postgres_processes(database)})


def render_table(rows: list[list[str]], header: list[str], *, markdown: bool = False) -> str:
    """A plain aligned table, or a GitHub-flavoured markdown one."""
    if markdown:
        lines = ["| " + " | ".join(header) + " |"]
        lines.append("|" + "|".join("---" if i == 0 else "---:" for i in range(len(header))) + "|")
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        return "\n".join(lines)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    fmt = "  ".join(f"{{:{'<' if i == 0 else '>'}{w}}}" for i, w in enumerate(widths))
    return "\n".join(fmt.format(*r) for r in [header, *rows])


def service_env(database_url: str, bootstrap: str, capabilities: Path) -> dict[str, str]:
    """The environment of the service's processes in a benchmark: this one's, less any
    TOOL_DISPATCHER_ setting of the caller's shell, plus the run's own."""
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("TOOL_DISPATCHER_")},
        "TOOL_DISPATCHER_DATABASE_URL": database_url,
        "TOOL_DISPATCHER_KAFKA_BOOTSTRAP": bootstrap,
        "TOOL_DISPATCHER_KAFKA_ENABLE_IDEMPOTENCE": "false",
        "TOOL_DISPATCHER_CAPABILITIES_FILE": str(capabilities),
    }


async def start_python(args: Sequence[str], env: dict[str, str]) -> asyncio.subprocess.Process:
    """``python args...`` (e.g. ``-m tool_dispatcher relay``) with its output discarded."""
    return await asyncio.create_subprocess_exec(
        sys.executable,
        *args,
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )


async def stop_process(proc: asyncio.subprocess.Process, within: float = 15) -> None:
    """SIGTERM ``proc`` (if it still runs) and wait; SIGKILL after ``within`` s."""
    if proc.returncode is None:
        proc.terminate()
    try:
        await asyncio.wait_for(proc.wait(), within)
    except TimeoutError:
        proc.kill()
        await proc.wait()
