"""Bus intake throughput and produce-to-commit latency, in one run beside HTTP intake at
the same concurrency and raw psycopg writing the same rows (the ceiling):

  bus      ``tool-dispatcher bus-intake`` in its own process, consuming a request topic
           (8 partitions, bound to one tenant) of an embedded Tansu; N producer tasks
           in this process on one aiokafka producer (acks=all), each sending its next
           record as soon as the broker acknowledged its last: N records in flight, as
           N HTTP clients keep N requests in flight. A record is a CloudEvent in the
           Kafka binary binding carrying the body HTTP intake is sent.
  http     ``POST /v1/tool-calls`` against ``tool-dispatcher serve`` (bench.intake's http
           mode, its code)
  psycopg  raw psycopg writing the rows of one ``submit()`` (bench.intake's ceiling)

A bus round produces ``--calls`` records after a warm-up; its calls/s is those records
over the span from the first produce to the moment ``bus_offsets`` (written in the
transaction recording the calls) is seen past the last of them, polled every 5 ms. The
producers outrun the intake (they wait for the broker, not for the commit), so this
phase's latencies are a backlog's; then ``bus@RATE/s``: the same producers paced to
``--paced-rate`` records a second, the latency of an intake keeping up. A record's
latency is its producer's clock at send (also its record timestamp) to the first poll
that saw its offset recorded. The HTTP and psycopg rounds are timed windows
(``--seconds``), as in bench.intake. Every round has a fresh database copied from a
migrated template; every bus round a fresh broker and topic. Run it as::

    .venv/bin/python -m bench.bus_intake [--calls 20000] [--producers 16] [--rounds 3]
        [--seconds 6] [--paced-rate 500] [--paced-seconds 5] [--wait-quiet 10]
        [--database-url URL]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import secrets
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psutil  # type: ignore[import-untyped]
import psycopg
from aiokafka import AIOKafkaProducer

from bench.bus_producers import POLL_SECONDS, Commits, Sent, bus_process, produce_all
from bench.harness import Cell, CpuMeter, postgres_meter, render_table
from bench.intake import ScratchDatabases, schedule, wait_quiet
from bench.intake_http import run_http, server_flavour
from bench.intake_modes import run_psycopg
from bench.intake_rows import TENANT
from devtools.embedded import Tansu

MODES = ("bus", "http", "psycopg")
TARGET = 1.2  # bus / http
RATIOS = ("bus/http", "bus/psycopg", "http/psycopg")
WARMUP_PER_PRODUCER = 20
NOISY_OTHER_LOAD = 25.0


async def run_bus(url: str, args: argparse.Namespace, log: Path) -> list[Cell]:
    """A bus round on a fresh broker and topic: its throughput, then its latency."""
    topic = f"td-bench-{secrets.token_hex(4)}.requests.{TENANT}"
    broker = Tansu()
    bootstrap = await asyncio.to_thread(broker.start)
    commits, stop = Commits(url, topic), asyncio.Event()
    try:
        async with bus_process(url, bootstrap, topic, log) as pid:
            poller = asyncio.create_task(commits.poll(stop))
            producer = AIOKafkaProducer(
                bootstrap_servers=bootstrap, acks="all", enable_idempotence=False
            )
            await producer.start()
            try:
                warm = WARMUP_PER_PRODUCER * args.producers
                await commits.wait(await produce_all(producer, topic, args.producers, warm, "w"))
                meter = postgres_meter(
                    url, client=psutil.Process(), server=[psutil.Process(pid)],
                    broker=[psutil.Process(broker.pid)],
                )  # fmt: skip
                cells = [await _throughput(producer, commits, meter, args)]
                if args.paced_rate:
                    cells.append(await _paced(producer, commits, args))
            finally:
                await producer.stop()
                stop.set()
                await poller
    finally:
        await asyncio.to_thread(broker.stop)
    cells[0].errors = warm + sum(c.calls for c in cells) - await _count_calls(url)
    return cells


async def _throughput(
    producer: AIOKafkaProducer, commits: Commits, meter: CpuMeter, args: argparse.Namespace
) -> Cell:
    """``--calls`` records as fast as the producers are acknowledged: calls/s from the
    first produce to the last one recorded."""
    meter.start()
    started = time.time()
    sent = await produce_all(producer, commits.topic, args.producers, args.calls, "m")
    done = await commits.wait(sent)
    cell = _latencies(Cell("bus", args.producers), sent, commits)
    cell.cpu = meter.stop()
    cell.seconds = done - started
    return cell


async def _paced(producer: AIOKafkaProducer, commits: Commits, args: argparse.Namespace) -> Cell:
    """Records at ``--paced-rate`` a second for ``--paced-seconds``: the latency of a
    bus intake keeping up, not of a backlog."""
    n = round(args.paced_rate * args.paced_seconds)
    started = time.time()
    sent = await produce_all(producer, commits.topic, args.producers, n, "p", args.paced_rate)
    done = await commits.wait(sent)
    cell = _latencies(Cell(f"bus@{args.paced_rate:g}/s", args.producers), sent, commits)
    cell.seconds = done - started
    return cell


def _latencies(cell: Cell, sent: list[Sent], commits: Commits) -> Cell:
    cell.latencies = [(commits.recorded_at(s.partition, s.offset) or s.at) - s.at for s in sent]
    cell.calls = len(sent)
    return cell


async def _count_calls(url: str) -> int:
    async with await psycopg.AsyncConnection.connect(url) as conn:
        row = await (await conn.execute("SELECT count(*) FROM tool_calls")).fetchone()
        return int(row[0]) if row else 0


# --- one run --------------------------------------------------------------------


async def measure(mode: str, url: str, args: argparse.Namespace, logs: Path) -> list[Cell]:
    if mode == "bus":
        return await run_bus(url, args, logs / "bus-intake.log")
    runner = run_http if mode == "http" else run_psycopg
    return [await runner(url, args.producers, args.seconds, args.warmup)]


def _fmt(value: float, digits: int = 0) -> str:
    return "-" if math.isnan(value) else f"{value:,.{digits}f}"


def app_cpu_per_call(cell: Cell) -> float:
    """CPU µs per call of the process running the intake code: the bus-intake or API
    process, the bench's own for raw psycopg."""
    role = "client" if cell.mode == "psycopg" else "server"
    return cell.cpu[role] / 100 / cell.rate * 1e6 if role in cell.cpu and cell.rate else math.nan


def report(cells: list[Cell], markdown: bool) -> str:
    header = [
        "mode", "round", "calls", "calls/s", "p50 ms", "p99 ms", "errors",
        "app CPU µs/call", "CPU % client/server/broker/pg/other",
    ]  # fmt: skip
    rows = []
    for cell in sorted(cells, key=lambda c: (MODES.index(c.mode.split("@")[0]), c.mode, c.round)):
        cpu = "/".join(
            _fmt(cell.cpu[k]) if k in cell.cpu else "-"
            for k in ("client", "server", "broker", "postgres", "other")
        )
        rows.append(
            [
                cell.mode, str(cell.round + 1), f"{cell.calls:,}", _fmt(cell.rate),
                _fmt(cell.percentile(0.5), 1), _fmt(cell.percentile(0.99), 1), str(cell.errors),
                _fmt(app_cpu_per_call(cell)), cpu,
            ]
        )  # fmt: skip
    return render_table(rows, header, markdown=markdown)


def ratios(cells: list[Cell], producers: int) -> list[str]:
    """Each ratio of calls/s, the median of the rounds' own (both sides measured in the
    same round), and the bus's produce-to-commit percentiles of each round."""
    by = {(c.mode, c.round): c for c in cells}
    rounds = sorted({c.round for c in cells})
    lines = []
    for name in RATIOS:
        num, den = name.split("/")
        values = [
            by[(num, r)].rate / by[(den, r)].rate
            for r in rounds
            if (num, r) in by and (den, r) in by and by[(den, r)].rate
        ]
        if not values:
            continue
        each = f" (median of {', '.join(f'{v:.2f}' for v in values)})" if len(values) > 1 else ""
        value = statistics.median(values)
        verdict = ""
        if name == "bus/http":
            verdict = f"  target >= {TARGET}: {'PASS' if value >= TARGET else 'MISS'}"
        lines.append(f"{num} / {den} at {producers} producers: {value:.2f}x{each}{verdict}")
    for bus in (c for c in cells if c.mode.startswith("bus")):
        lines.append(
            f"{bus.mode} produce -> commit, round {bus.round + 1}: p50"
            f" {_fmt(bus.percentile(0.5), 1)} ms, p99 {_fmt(bus.percentile(0.99), 1)} ms"
        )
    lines.append(
        f"(a commit is seen by a {POLL_SECONDS * 1000:g} ms poll of bus_offsets; bus's own"
        " latency is a backlog's: its producers outrun it)"
    )
    return lines


async def main_async(args: argparse.Namespace) -> int:
    dbs = ScratchDatabases(args.database_url)
    print(
        f"bus intake bench: {psutil.cpu_count()} cores, {args.producers} producers/clients,"
        f" bus {args.calls:,} records a round (+{WARMUP_PER_PRODUCER * args.producers} warm-up),"
        f" http and psycopg {args.seconds:g} s (+{args.warmup:g} s warm-up), {args.rounds}"
        f" round(s), database {dbs.template}",
        flush=True,
    )
    print(f"http: server {server_flavour()}; client: raw asyncio HTTP/1.1 keep-alive")
    cells: list[Cell] = []
    dbs.create_template()
    try:
        with tempfile.TemporaryDirectory(prefix="td-bus-bench-") as tmp:
            for _, round_, mode in schedule(list(MODES), [args.producers], args.rounds):
                with dbs.cell() as url:
                    if args.wait_quiet:
                        await wait_quiet(args.wait_quiet)
                    measured = await measure(mode, url, args, Path(tmp))
                for cell in measured:
                    cell.round = round_
                    cells.append(cell)
                    print(_progress(cell), flush=True)
    finally:
        dbs.drop()
    print()
    print(report(cells, markdown=False))
    print()
    print("\n".join(ratios(cells, args.producers)))
    noisy = [c for c in cells if c.cpu.get("other", 0.0) > NOISY_OTHER_LOAD]
    if noisy:
        print(
            f"warning: {len(noisy)} of {len(cells)} rounds shared the machine with other work"
            f" (other load > {NOISY_OTHER_LOAD:.0f}% of a core). --wait-quiet SECONDS helps."
        )
    print()
    print(report(cells, markdown=True))
    return 0 if all(c.calls and not c.errors for c in cells) else 1


def _progress(cell: Cell) -> str:
    line = (
        f"  {cell.mode:<8} round {cell.round + 1}: {cell.rate:>8,.0f} calls/s  "
        f"p50 {_fmt(cell.percentile(0.5), 1)} ms  p99 {_fmt(cell.percentile(0.99), 1)} ms  "
        f"app {_fmt(app_cpu_per_call(cell))} µs/call  "
        f"other load {_fmt(cell.cpu.get('other', math.nan))}%"
    )
    return line + (f"  [{cell.note}]" if cell.note else "")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.bus_intake", description=__doc__.split("\n\n")[0]
    )
    add: Callable[..., object] = parser.add_argument
    add("--calls", type=int, default=20_000, help="records produced per bus round")
    add("--producers", type=int, default=16, help="bus producers, and HTTP and psycopg clients")
    add("--rounds", type=int, default=1, help="rounds, the modes forward then backward")
    add("--paced-rate", type=float, default=500, help="records/s of the latency phase, 0: none")
    add("--paced-seconds", type=float, default=5, help="seconds of the latency phase")
    add("--seconds", type=float, default=6.0, help="measured seconds of an http/psycopg round")
    add("--warmup", type=float, default=1.5, help="unmeasured seconds first (http/psycopg)")
    add(
        "--wait-quiet", type=float, default=0.0, metavar="SECONDS",
        help="before each round, wait up to this long for other load to drop below 25%%",
    )  # fmt: skip
    add(
        "--database-url",
        default="postgresql://postgres@127.0.0.1:5432/postgres",
        help="a server where this user may CREATE DATABASE; scratch databases are dropped",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    code = asyncio.run(main_async(args))
    print(f"\n(total {time.monotonic() - started:.0f} s)")
    return code


if __name__ == "__main__":
    raise SystemExit(main())
