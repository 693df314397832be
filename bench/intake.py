"""Intake throughput at 1, 16 and 64 concurrent clients, next to the ceilings of this
machine measured in the same run:

  library  ``dispatcher.intake.service.submit`` in the caller's transaction (SQLAlchemy async,
           psycopg 3, pool size = clients)
  library-psycopg  the same ``submit()`` in a caller's raw psycopg transaction
           (AsyncConnectionPool, the psycopg ceiling's pool): the library for a caller
           without SQLAlchemy
  session  the SQL ``submit()`` sends, captured from it, sent through the caller's
           ``AsyncSession`` (same engine and pool), one transaction per call: the fair
           ceiling of a library call in the caller's transaction (bench.intake_session)
  psycopg-in-session  raw psycopg's rows (below) on the psycopg connection of the
           caller's ``AsyncSession``, one transaction per call: the floor any library
           call in the caller's session stands on
  faststream  faststream-outbox's ``publish(body, queue=..., session=session)`` in the
           caller's ``AsyncSession`` (same engine settings and pool): the outbox library
           a Python user would otherwise pick, writing one row (bench.intake_peers)
  http     ``POST /v1/tool-calls`` against ``tool-dispatcher serve`` in its own process,
           driven by a minimal raw asyncio HTTP/1.1 keep-alive client in this process
  pgbench  the same rows in one plain transaction (INSERT the call RETURNING *, INSERT
           its 2 events, INSERT its 3 outbox rows, COMMIT) from pgbench, ``-M prepared``
  psycopg  that transaction from raw psycopg 3 (AsyncConnectionPool, no ORM)

Every cell runs on a fresh database copied from a migrated template, so no cell
inherits another's table growth. Run it as::

    .venv/bin/python -m bench.intake [--seconds 6] [--clients 1,16,64] [--rounds 3]
        [--database-url postgresql://postgres@127.0.0.1:5432/postgres]
        [--only library,library-psycopg,session,psycopg-in-session,faststream,http,
               pgbench,psycopg]

With ``--rounds N`` every cell is measured N times, the modes in turn forward and then
backward, and a ratio is the median of the rounds' own ratios: on a shared machine
whose speed drifts by a third within minutes, the two sides of a ratio are then
measured close together and in both orders.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import secrets
import statistics
import time
from collections.abc import Iterator

import psutil  # type: ignore[import-untyped]
import psycopg

from bench.harness import Cell, machine_busy_seconds, render_table
from bench.intake_http import server_flavour
from bench.intake_modes import RUNNERS
from devtools.databases import with_database
from dispatcher.db import migrate

MODES = (
    "library", "library-psycopg", "session", "psycopg-in-session", "faststream",
    "http", "http-cores", "pgbench", "psycopg",
)  # fmt: skip
# Targets at 16 clients.
TARGETS = {
    # The best peer: faststream-outbox's publish in the caller's session.
    "library/faststream": 1.2,
    "library/session": 0.9,
    "library/psycopg": 0.75,
    "library-psycopg/psycopg": 0.75,
    "http/pgbench": 0.6,
    "http-cores/pgbench": 0.6,
}
TARGET_CLIENTS = 16
# Printed beside the targets, without one. Raw psycopg's own rows written in a caller's
# session (psycopg-in-session) against raw psycopg is the share of raw psycopg's rate
# left to any library call in a caller's AsyncSession: the session's begin, checkout,
# commit and return cost what they cost, whatever the call writes. The library against
# that floor is what the library itself costs beyond raw psycopg's writes.
BOUNDS = {
    "session/psycopg": None,
    "psycopg-in-session/psycopg": None,
    "library/psycopg-in-session": None,
}
NOISY_OTHER_LOAD = 25.0

# --- scratch databases ------------------------------------------------------------


class ScratchDatabases:
    """A migrated template ``td_bench_<hex>`` and one copy of it per cell."""

    def __init__(self, admin_url: str) -> None:
        self.admin_url = admin_url
        self.template = f"td_bench_{secrets.token_hex(4)}"
        self._cells = 0

    def _admin(self, *statements: str) -> None:
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            for statement in statements:
                conn.execute(statement)

    def create_template(self) -> None:
        self._admin(f'CREATE DATABASE "{self.template}"')
        migrate.upgrade(with_database(self.admin_url, self.template))

    @contextlib.contextmanager
    def cell(self) -> Iterator[str]:
        self._cells += 1
        name = f"{self.template}_{self._cells}"
        # CHECKPOINT: no cell pays for the previous cell's dirty buffers.
        self._admin(f'CREATE DATABASE "{name}" TEMPLATE "{self.template}"', "CHECKPOINT")
        try:
            yield with_database(self.admin_url, name)
        finally:
            self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def drop(self) -> None:
        self._admin(f'DROP DATABASE IF EXISTS "{self.template}" WITH (FORCE)')


# --- report -------------------------------------------------------------------------


def _fmt(value: float, digits: int = 1) -> str:
    return "-" if value != value else f"{value:,.{digits}f}"  # NaN check


def app_cpu_per_call(cell: Cell) -> float:
    """CPU µs per call of the process running the intake code (the bench process for
    library/psycopg, the server for http, PostgreSQL for pgbench). Contention from
    other work on the machine moves it far less than it moves calls/s."""
    role = {"http": "server", "http-cores": "server", "pgbench": "postgres"}.get(
        cell.mode, "client"
    )
    if role not in cell.cpu or not cell.rate:
        return math.nan
    return cell.cpu[role] / 100 / cell.rate * 1e6


def report(cells: list[Cell], clients: list[int], markdown: bool) -> str:
    header = [
        "mode", "clients", "calls/s", "p50 ms", "p99 ms", "errors",
        "app CPU µs/call", "CPU % client/server/pg/other",
    ]  # fmt: skip
    rounds = len({c.round for c in cells}) > 1
    if rounds:
        header.insert(2, "round")
    rows = []
    for cell in sorted(cells, key=lambda c: (MODES.index(c.mode), c.clients, c.round)):
        cpu = "/".join(
            _fmt(cell.cpu[k], 0) if k in cell.cpu else "-"
            for k in ("client", "server", "postgres", "other")
        )
        rows.append(
            [
                cell.mode,
                str(cell.clients),
                *([str(cell.round + 1)] if rounds else []),
                _fmt(cell.rate, 0),
                _fmt(cell.percentile(0.50), 2),
                _fmt(cell.percentile(0.99), 2),
                str(cell.errors),
                _fmt(app_cpu_per_call(cell), 0),
                cpu,
            ]
        )
    return render_table(rows, header, markdown=markdown)


def ratios(cells: list[Cell], clients: list[int]) -> list[str]:
    """Each target's ratio of calls/s at each client count: the median of the ratios
    within each round (both sides measured in the same round)."""
    by = {(c.mode, c.clients, c.round): c.rate for c in cells}
    rounds = sorted({c.round for c in cells})
    lines = []
    targets: dict[str, float | None] = {**TARGETS, **BOUNDS}
    for name, target in targets.items():
        num, den = name.split("/")
        for n in clients:
            values = [
                by[(num, n, r)] / by[(den, n, r)]
                for r in rounds
                if by.get((num, n, r)) and by.get((den, n, r))
            ]
            if not values:
                continue
            value = statistics.median(values)
            each = ""
            if len(values) > 1:
                each = f" (median of {', '.join(f'{v:.2f}' for v in values)})"
            verdict = ""
            if n == TARGET_CLIENTS and target is not None:
                verdict = f"  target >= {target}: {'PASS' if value >= target else 'MISS'}"
            lines.append(f"{num} / {den} at {n:>2} clients: {value:.2f}x{each}{verdict}")
    return lines


async def wait_quiet(limit: float, busy: float = 25.0) -> float:
    """Wait (up to ``limit`` seconds) until the rest of the machine uses less than
    ``busy`` percent of one core over one second; returns the last reading. On a shared
    machine this keeps a cell from measuring someone else's work."""
    deadline = time.monotonic() + limit
    while True:
        before = machine_busy_seconds()
        await asyncio.sleep(1.0)
        reading = 100 * (machine_busy_seconds() - before)
        if reading < busy or time.monotonic() >= deadline:
            return reading


def schedule(modes: list[str], clients: list[int], rounds: int) -> Iterator[tuple[int, int, str]]:
    """(clients, round, mode) in measuring order: each client count's rounds together,
    the modes forward in even rounds and backward in odd ones."""
    for n in clients:
        for r in range(rounds):
            for mode in modes if r % 2 == 0 else modes[::-1]:
                yield n, r, mode


async def main_async(args: argparse.Namespace) -> int:
    modes = [m for m in MODES if m in args.only]
    dbs = ScratchDatabases(args.database_url)
    print(
        f"intake bench: {psutil.cpu_count()} cores, modes {','.join(modes)}, clients "
        f"{','.join(map(str, args.clients))}, {args.seconds:g} s per cell "
        f"(+{args.warmup:g} s warm-up), database {dbs.template}",
        flush=True,
    )
    print(f"http: server {server_flavour()}; client: raw asyncio HTTP/1.1 keep-alive", flush=True)
    cells: list[Cell] = []
    dbs.create_template()
    try:
        for n, round_, mode in schedule(modes, args.clients, args.rounds):
            with dbs.cell() as url:
                if args.wait_quiet:
                    await wait_quiet(args.wait_quiet)
                cell = await RUNNERS[mode](url, n, args.seconds, args.warmup)
            cell.round = round_
            cells.append(cell)
            p50, p99 = _fmt(cell.percentile(0.5), 2), _fmt(cell.percentile(0.99), 2)
            line = (
                f"  {mode:<8} {n:>3} clients: {cell.rate:>8,.0f} calls/s  p50 {p50} ms  "
                f"p99 {p99} ms  app {_fmt(app_cpu_per_call(cell), 0)} µs/call  "
                f"other load {_fmt(cell.cpu.get('other', math.nan), 0)}%"
            )
            print(line + (f"  [{cell.note}]" if cell.note else ""), flush=True)
    finally:
        dbs.drop()
    print()
    print(report(cells, args.clients, markdown=False))
    print()
    for line in ratios(cells, args.clients):
        print(line)
    noisy = [c for c in cells if c.cpu.get("other", 0.0) > NOISY_OTHER_LOAD]
    if noisy:
        print(
            f"warning: {len(noisy)} of {len(cells)} cells shared the machine with other work "
            f"(other load > {NOISY_OTHER_LOAD:.0f}% of a core); their calls/s are low, "
            "app CPU µs/call is the steadier figure. --wait-quiet SECONDS helps."
        )
    print()
    print(report(cells, args.clients, markdown=True))
    return 0 if all(c.calls and not c.errors for c in cells) else 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.intake", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--seconds", type=float, default=6.0, help="measured seconds per cell")
    parser.add_argument("--warmup", type=float, default=1.5, help="unmeasured seconds first")
    parser.add_argument(
        "--wait-quiet",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="before each cell, wait up to this long for other load to drop below 25%%",
    )
    parser.add_argument(
        "--clients", type=lambda s: [int(x) for x in s.split(",")], default=[1, 16, 64]
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="measure every cell this many times, alternating the order of the modes",
    )
    parser.add_argument(
        "--database-url",
        default="postgresql://postgres@127.0.0.1:5432/postgres",
        help="a server where this user may CREATE DATABASE; scratch databases are dropped",
    )
    parser.add_argument(
        "--only",
        type=lambda s: [x for x in s.split(",") if x],
        default=list(MODES),
        help="comma-separated subset of " + ",".join(MODES),
    )
    args = parser.parse_args(argv)
    unknown = set(args.only) - set(MODES)
    if unknown:
        parser.error(f"unknown mode(s): {', '.join(sorted(unknown))}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    code = asyncio.run(main_async(args))
    print(f"\n(total {time.monotonic() - started:.0f} s)")
    return code


if __name__ == "__main__":
    raise SystemExit(main())
