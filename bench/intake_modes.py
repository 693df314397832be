"""The modes of ``bench.intake`` that run in the bench's own process (and pgbench's),
and the runner of every mode by name (:data:`RUNNERS`)."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]
import psycopg
from psycopg_pool import AsyncConnectionPool
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from bench.harness import Call, Cell, drive, postgres_meter
from bench.intake_http import run_http, run_http_per_core
from bench.intake_peers import run_faststream
from bench.intake_rows import CAPABILITY, INPUT, TENANT, pgbench_script, raw_rows
from bench.intake_session import capture, describe, replay_client
from devtools.registries import sandbox_registry
from dispatcher.db.engine import create_engine, session_factory
from dispatcher.intake.keys import fingerprint
from dispatcher.intake.service import submit
from dispatcher.intake.statement import CallerTransaction
from dispatcher.schemas import SubmitRequest
from dispatcher.settings import Settings


def library_engine(url: str, clients: int) -> AsyncEngine:
    # Like the raw psycopg pool it is compared with: no pre-ping round trip per checkout.
    return create_engine(Settings(database_url=url, db_pool_size=clients, db_pool_pre_ping=False))


def library_client(sessions: async_sessionmaker[AsyncSession], run: str) -> Call:
    """One client's call: ``submit()`` in a transaction of its own."""
    intake = _submitter(run)

    async def call() -> None:
        async with sessions() as session, session.begin():
            await intake(session)

    return call


def _submitter(
    run: str,
) -> Callable[[AsyncSession | psycopg.AsyncConnection[Any]], Awaitable[object]]:
    """The library call a client makes, in whichever transaction it is given."""
    registry = sandbox_registry()

    def intake(transaction: AsyncSession | psycopg.AsyncConnection[Any]) -> Awaitable[object]:
        request = SubmitRequest(run_id=run, capability_id=CAPABILITY, input=INPUT)
        return submit(transaction, request, tenant=TENANT, registry=registry)

    return intake


async def run_library(url: str, clients: int, seconds: float, warmup: float) -> Cell:
    return await _on_sessions("library", library_client, url, clients, seconds, warmup)


async def _on_sessions(
    mode: str,
    client: Callable[[async_sessionmaker[AsyncSession], str], Call],
    url: str,
    clients: int,
    seconds: float,
    warmup: float,
) -> Cell:
    """A cell whose clients each open the caller's ``AsyncSession`` on one engine, as
    :func:`_on_pool` for a raw psycopg pool."""
    engine = library_engine(url, clients)
    sessions = session_factory(engine)
    try:
        return await drive(
            Cell(mode, clients),
            [client(sessions, f"run-{i}") for i in range(clients)],
            seconds=seconds,
            warmup=warmup,
            cpu=postgres_meter(url, client=psutil.Process()),
        )
    finally:
        await engine.dispose()


def library_psycopg_client(pool: AsyncConnectionPool, run: str) -> Call:
    """One client's call: ``submit()`` in a psycopg transaction of its own."""
    intake = _submitter(run)

    async def call() -> None:
        async with pool.connection() as conn:  # commits on exit
            await intake(conn)

    return call


async def run_library_psycopg(url: str, clients: int, seconds: float, warmup: float) -> Cell:
    return await _on_pool("library-psycopg", library_psycopg_client, url, clients, seconds, warmup)


async def run_session(url: str, clients: int, seconds: float, warmup: float) -> Cell:
    engine = library_engine(url, clients)
    sessions = session_factory(engine)
    try:
        statements = await capture(engine, library_client(sessions, "run-0"))
        print(f"  session: {describe(statements)}", flush=True)
        return await drive(
            Cell("session", clients),
            [replay_client(sessions, statements, {"run-0": f"run-{i}"}) for i in range(clients)],
            seconds=seconds,
            warmup=warmup,
            cpu=postgres_meter(url, client=psutil.Process()),
        )
    finally:
        await engine.dispose()


def psycopg_client(pool: AsyncConnectionPool, run: str) -> Call:
    """One client's call: the same rows as intake writes, in raw psycopg."""
    write = raw_rows(run)

    async def call() -> None:
        async with pool.connection() as conn:  # commits on exit
            await write(conn)

    return call


def psycopg_in_session_client(sessions: async_sessionmaker[AsyncSession], run: str) -> Call:
    """One client's call: raw psycopg's rows on the psycopg connection of the caller's
    ``AsyncSession``, reached as ``submit()`` reaches it, in a transaction of its own.
    What is left of a call when its writes cost no more than raw psycopg's: the floor
    of any library call made in the caller's session, whatever it writes with."""
    write = raw_rows(run)

    async def call() -> None:
        async with sessions() as session, session.begin():
            await write((await CallerTransaction.of(session)).driver)

    return call


async def run_psycopg_in_session(url: str, clients: int, seconds: float, warmup: float) -> Cell:
    return await _on_sessions(
        "psycopg-in-session", psycopg_in_session_client, url, clients, seconds, warmup
    )


async def run_psycopg(url: str, clients: int, seconds: float, warmup: float) -> Cell:
    return await _on_pool("psycopg", psycopg_client, url, clients, seconds, warmup)


async def _on_pool(
    mode: str,
    client: Callable[[AsyncConnectionPool, str], Call],
    url: str,
    clients: int,
    seconds: float,
    warmup: float,
) -> Cell:
    """A cell whose clients share one raw psycopg pool, one connection each."""
    pool = AsyncConnectionPool(url, min_size=clients, max_size=clients, open=False)
    await pool.open(wait=True)
    try:
        return await drive(
            Cell(mode, clients),
            [client(pool, f"run-{i}") for i in range(clients)],
            seconds=seconds,
            warmup=warmup,
            cpu=postgres_meter(url, client=psutil.Process()),
        )
    finally:
        await pool.close()


async def run_pgbench(url: str, clients: int, seconds: float, warmup: float) -> Cell:
    del warmup  # pgbench connects first and times only the transactions
    cell = Cell("pgbench", clients)
    with tempfile.TemporaryDirectory(prefix="td-pgbench-") as tmp:
        script = Path(tmp, "intake.sql")
        await asyncio.to_thread(
            script.write_text, pgbench_script(json.dumps(INPUT), fingerprint(CAPABILITY, INPUT))
        )
        proc = await asyncio.create_subprocess_exec(
            "pgbench", "-n", "-M", "prepared", "-f", str(script),
            "-c", str(clients), "-j", str(min(2, clients)), "-T", str(round(seconds)),
            "-l", "--log-prefix", str(Path(tmp, "log")), url,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        # CPU is sampled inside the run: pgbench's backends are gone once it exits.
        cpu = postgres_meter(url, client=psutil.Process(proc.pid))
        communicate = asyncio.create_task(proc.communicate())
        await asyncio.sleep(0.5)
        cpu.start()
        await asyncio.sleep(max(0.5, round(seconds) - 1.0))
        cell.cpu = cpu.stop()
        out, err = await communicate
        text = out.decode() + err.decode()
        tps = re.search(r"tps = ([\d.]+) \(without initial connection time\)", text)
        failed = re.search(r"number of failed transactions: (\d+)", text)
        if proc.returncode != 0 or tps is None:
            cell.note = "pgbench failed: " + " | ".join(text.strip().splitlines()[-3:])
            return cell
        cell.latencies = await asyncio.to_thread(_pgbench_latencies, Path(tmp))
        cell.calls = len(cell.latencies)
        cell.seconds = cell.calls / float(tps.group(1))
        cell.errors = int(failed.group(1)) if failed else 0
    return cell


def _pgbench_latencies(log_dir: Path) -> list[float]:
    """Seconds per transaction from pgbench's per-transaction logs (third column, µs)."""
    return [
        int(line.split()[2]) / 1e6
        for log in log_dir.glob("log.*")
        for line in log.read_text().splitlines()
    ]


RUNNERS = {
    "library": run_library,
    "library-psycopg": run_library_psycopg,
    "session": run_session,
    "http": run_http,
    "http-cores": run_http_per_core,
    "pgbench": run_pgbench,
    "psycopg": run_psycopg,
    "psycopg-in-session": run_psycopg_in_session,
    "faststream": run_faststream,
}
