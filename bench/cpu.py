"""Machine CPU per call: the CPU time (user + system) every process of a benchmark run
used in a window, divided by the calls done in it, and the table that compares a
round with its ideal.

The window of a dispatch round is known only afterwards, from the database's own
timestamps (first claim to last outcome), so a :class:`Sampler` thread records the
CPU times of the run's processes every few milliseconds and :func:`cpu_between` reads
the window off the samples, interpolating linearly between the two around each edge.
A process born during the window counts from zero; one that exits keeps its last
sample (its CPU after that is lost, at most one interval's worth).
"""

from __future__ import annotations

import bisect
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import psutil  # type: ignore[import-untyped]
import psycopg

from bench.harness import machine_busy_seconds

ProcessKey = tuple[int, float]
"""A process as (pid, create time): a pid reused within a run is another process."""


@dataclass(frozen=True, slots=True)
class Sample:
    at: float
    """time.time(), comparable with PostgreSQL's now() on the same machine."""
    cpu: dict[ProcessKey, float]
    """User + system seconds of each process seen at this sample."""
    machine: float
    """Busy seconds of the whole machine since boot (all cores)."""


def totals(
    samples: Sequence[Sample], keep: Callable[[ProcessKey], bool] | None = None
) -> list[float]:
    """The CPU seconds of all processes seen so far (those ``keep`` keeps), at each
    sample: a process missing from a sample (not yet born: 0; exited: its last value)
    is carried forward."""
    last: dict[ProcessKey, float] = {}
    out = []
    for sample in samples:
        last.update(sample.cpu)
        out.append(sum(v for k, v in last.items() if keep is None or keep(k)))
    return out


def _at(times: Sequence[float], values: Sequence[float], t: float) -> float:
    """``values`` linearly interpolated at ``t``, clamped to the first and last."""
    i = bisect.bisect_left(times, t)
    if i == 0:
        return values[0]
    if i == len(times):
        return values[-1]
    t0, t1 = times[i - 1], times[i]
    share = (t - t0) / (t1 - t0) if t1 > t0 else 1.0
    return values[i - 1] + share * (values[i] - values[i - 1])


def cpu_between(samples: Sequence[Sample], start: float, end: float) -> tuple[float, float]:
    """CPU seconds the sampled processes used between ``start`` and ``end``, and what
    the rest of the machine used meanwhile (someone else's load on a shared machine)."""
    if not samples:
        raise ValueError("no samples")
    times = [s.at for s in samples]
    ours = totals(samples)
    machine = [s.machine for s in samples]
    used = _at(times, ours, end) - _at(times, ours, start)
    busy = _at(times, machine, end) - _at(times, machine, start)
    return used, max(0.0, busy - used)


def by_role(
    samples: Sequence[Sample], roles: Mapping[ProcessKey, str], start: float, end: float
) -> dict[str, float]:
    """CPU seconds each role (``roles`` names each process's) used between ``start``
    and ``end``."""
    times = [s.at for s in samples]
    out = {}
    for role in sorted(set(roles.values())):
        used = totals(samples, lambda k, role=role: roles.get(k) == role)  # type: ignore[misc]
        out[role] = _at(times, used, end) - _at(times, used, start)
    return out


def _key(proc: psutil.Process) -> ProcessKey | None:
    try:
        return (proc.pid, proc.create_time())
    except psutil.Error:
        return None


def cpu_times(procs: Iterable[psutil.Process]) -> dict[ProcessKey, float]:
    out: dict[ProcessKey, float] = {}
    for proc in procs:
        try:
            with proc.oneshot():
                t = proc.cpu_times()
                out[(proc.pid, proc.create_time())] = t.user + t.system
        except psutil.Error:
            continue
    return out


def with_children(pids: Iterable[int | None]) -> list[psutil.Process]:
    """The processes ``pids`` name and all their descendants (a console script that
    forks, a broker with helpers)."""
    procs = []
    for pid in pids:
        if pid is None:
            continue
        try:
            proc = psutil.Process(pid)
            procs += [proc, *proc.children(recursive=True)]
        except psutil.Error:
            continue
    return procs


def processes(pids: Iterable[int | None], known: dict[int, psutil.Process]) -> list[psutil.Process]:
    """The live processes ``pids`` name, each looked up once (``known`` keeps them)."""
    out = []
    for pid in pids:
        if pid is None:
            continue
        if pid not in known:
            try:
                known[pid] = psutil.Process(pid)
            except psutil.Error:
                continue
        out.append(known[pid])
    return out


class Rescanned:
    """``find()``'s processes, asked again at most every ``seconds`` (a scan of every
    process of the machine costs milliseconds). CPU times are cumulative, so a process
    found late still counts from its birth; only one born and gone between two scans
    is missed."""

    def __init__(self, find: Callable[[], Iterable[psutil.Process]], seconds: float) -> None:
        self._find = find
        self._seconds = seconds
        self._procs: list[psutil.Process] = []
        self._at = -math.inf

    def __call__(self) -> list[psutil.Process]:
        now = time.monotonic()
        if now - self._at >= self._seconds:
            self._procs, self._at = list(self._find()), now
        return self._procs


class Sampler:
    """Samples the CPU times of ``find()``'s processes every ``interval`` seconds in a
    thread, so that blocking calls of the benchmark's event loop do not delay it.
    ``find`` is asked at every sample: wrap an expensive one in :class:`Rescanned`."""

    def __init__(
        self,
        find: Callable[[], Iterable[psutil.Process]],
        interval: float = 0.05,
        role: Callable[[psutil.Process], str] | None = None,
    ) -> None:
        self._find = find
        self._interval = interval
        self._role = role
        self.roles: dict[ProcessKey, str] = {}
        """Each process's role (``role(process)``, asked once per process)."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.samples: list[Sample] = []

    def sample(self) -> None:
        procs = list(self._find())
        cpu = cpu_times(procs)
        if self._role is not None:
            for proc in procs:
                key = _key(proc)
                if key is not None and key not in self.roles:
                    self.roles[key] = self._role(proc)
        self.samples.append(Sample(time.time(), cpu, machine_busy_seconds()))

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.sample()

    def start(self) -> Sampler:
        self.sample()
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> list[Sample]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sample()
        return self.samples


@dataclass(frozen=True, slots=True)
class Round:
    """One measured round: its calls, the seconds they took, the CPU the run used."""

    name: str
    calls: int
    seconds: float
    cpu_seconds: float
    other_seconds: float = 0.0
    roles: dict[str, float] = field(default_factory=dict)
    """CPU seconds by role (worker, relay, postgres...): where ``cpu_seconds`` went."""

    @property
    def rate(self) -> float:
        return self.calls / self.seconds if self.seconds else 0.0

    @property
    def cpu_per_call_us(self) -> float:
        return 1e6 * self.cpu_seconds / self.calls if self.calls else 0.0

    @property
    def other_per_call_us(self) -> float:
        return 1e6 * self.other_seconds / self.calls if self.calls else 0.0


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def compare_rows(
    rounds: Sequence[Round],
    ideal: Round,
    *,
    targeted: Iterable[str],
    min_rate: float = 0.5,
    max_cpu: float | None = None,
) -> list[list[str]]:
    """Table rows: each round's rate and CPU per call, their ratios to ``ideal``'s, and
    the target verdicts for the rounds named in ``targeted`` (rate at least
    ``min_rate`` x the ideal's, CPU per call at most ``max_cpu`` x)."""
    targets = set(targeted)
    rows = []
    for r in rounds:
        rate_ratio = r.rate / ideal.rate if ideal.rate else 0.0
        cpu_ratio = r.cpu_per_call_us / ideal.cpu_per_call_us if ideal.cpu_per_call_us else 0.0
        rate_verdict = cpu_verdict = ""
        if r.name in targets:
            rate_verdict = f"{verdict(rate_ratio >= min_rate)} (>= {min_rate}x)"
            if max_cpu is not None:
                cpu_verdict = f"{verdict(cpu_ratio <= max_cpu)} (<= {max_cpu}x)"
        row = [
            r.name,
            f"{r.calls:,}",
            f"{r.rate:,.0f}",
            f"{r.cpu_per_call_us:,.0f}",
            f"{rate_ratio:.2f}x",
            f"{cpu_ratio:.2f}x",
            rate_verdict,
        ]
        if max_cpu is not None:
            row.append(cpu_verdict)
        row.append(f"{r.other_per_call_us:,.0f}")
        rows.append(row)
    return rows


def role_of(proc: psutil.Process, named: Mapping[int, str], default: str = "other") -> str:
    """The role of ``proc``: its own or its nearest ancestor's in ``named`` (pid to
    role), else for a PostgreSQL process "pg backends" (the run's connections,
    autovacuum) or "pg shared" (the server's own processes, which also work for
    everyone else's databases on it), else ``default``."""
    try:
        for p in (proc, *proc.parents()):
            if p.pid in named:
                return named[p.pid]
        if proc.name() not in ("postgres", "postmaster"):
            return default
        title = " ".join(proc.cmdline())
    except psutil.Error:
        return default
    return "pg backends" if works_for_one_database(title) else "pg shared"


def role_rows(rounds: Sequence[Round]) -> tuple[list[str], list[list[str]]]:
    """Header and rows: each round's CPU µs per call by role; a role under 1 µs/call in
    every round (a short-lived connection that exited before it was named) is left out."""
    roles = sorted(
        {role for r in rounds for role, cpu in r.roles.items() if 1e6 * cpu / r.calls >= 0.5}
    )
    rows = [
        [r.name, *(f"{1e6 * r.roles.get(role, 0.0) / r.calls:,.0f}" for role in roles)]
        for r in rounds
    ]
    return ["round (CPU µs/call by process)", *roles], rows


def postmaster_of(url: str) -> int:
    """The pid of the PostgreSQL server ``url`` connects to (a backend's parent)."""
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
        # While the backend lives: it exits with the connection.
        return int(psutil.Process(row[0]).ppid())


def counts_for(title: str, database: str, backends: Iterable[int] = ()) -> bool:
    """Whether a PostgreSQL server's process (by its title) works for ``database``: a
    backend or autovacuum worker only if it names ``database``, a parallel worker only
    if its leader is one of ``backends``; the shared ones (checkpointer, WAL writer,
    background writer, launchers, I/O workers) always: what they do cannot be split by
    database."""
    words = title.split()
    if "parallel worker for PID" in title:
        return words[-1] in {str(pid) for pid in backends}
    if works_for_one_database(title):
        return database in words
    return True


def works_for_one_database(title: str) -> bool:
    """A backend (a client's connection), an autovacuum worker or a parallel worker,
    rather than one of the server's shared processes."""
    return (
        "[local]" in title
        or ("(" in title and ")" in title)
        or "autovacuum worker" in title
        or "parallel worker for PID" in title
    )


def server_processes(
    postmaster: int, database: str, harness: Iterable[int] = ()
) -> list[psutil.Process]:
    """The server ``postmaster`` and those of its processes that work for ``database``
    (:func:`counts_for`): another server on the machine, or another database's
    backends on this one (someone else's tests), are not this run's, nor the
    ``harness`` backends (the benchmark's own connection)."""
    try:
        root = psutil.Process(postmaster)
        children = root.children()
    except psutil.Error:
        return []
    titles = {}
    left_out = set(harness)
    for child in children:
        if child.pid in left_out:
            continue
        try:
            titles[child] = " ".join(child.cmdline())
        except psutil.Error:
            continue
    ours = [p for p, t in titles.items() if "parallel worker" not in t and counts_for(t, database)]
    pids = [p.pid for p in ours]
    ours += [
        p for p, t in titles.items() if "parallel worker" in t and counts_for(t, database, pids)
    ]
    return [root, *ours]
