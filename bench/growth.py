"""How the service holds up as its history grows: every repeated operation timed and
explained on an empty database and on one with months of history, and what each
finished call costs in bytes.

    .venv/bin/python -m bench.growth [--calls 2000000] [--days 60] [--tenants 50]
        [--revision head] [--repeat 7] [--http-rounds 5] [--wait-quiet SECONDS]
        [--skip-http] [--skip-ops]
        [--database-url postgresql://postgres@127.0.0.1:5432/postgres] [--keep]
        [--reuse EMPTY_DB,FULL_DB]

Two scratch databases are migrated to ``--revision`` and given the same live set
(calls in flight, pending approvals, open escalations, waiting commands:
``bench.growth_paths.LIVE``); the full one first gets ``--calls`` finished calls over
``--days`` across ``--tenants`` tenants, written with ``generate_series`` in chunks
(``bench.growth_fill``). Then, for each operation (``bench.growth_ops``), the median
time of ``--repeat`` runs and the rows examined and buffers touched by its statements
(``EXPLAIN (ANALYZE, BUFFERS)``, ``bench.plans``), on both, and the ratio full/empty
against a ceiling of 1.5x; HTTP intake's rate on the full database against 0.95x of its
rate on the empty one. Bytes per finished call are what the history added to every
table (heap, TOAST and indexes), divided by its finished calls; the projection is the
steady-state size at 10, 100 and 1,000 calls/s for 30 days of retention and the
configured one.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import statistics
import time
from typing import Any

from bench.growth_fill import Shape, fill
from bench.growth_ops import OPERATIONS, Target, measure
from bench.growth_report import (
    CEILING,
    HTTP_FLOOR,
    Growth,
    Row,
    human,
    operations_table,
    projection_table,
    ratio,
    size_tables,
    sizes,
    statements_detail,
    verdict,
)
from bench.growth_rows import OUTBOX_WINDOW_HOURS
from bench.intake import wait_quiet
from bench.intake_http import run_http
from devtools.databases import create_database, drop_database, with_database
from devtools.sandbox import SandboxServer
from dispatcher.db import migrate
from dispatcher.provider.transport import Transport
from dispatcher.settings import Settings

RETENTION_DAYS = 30.0


def configured_retention() -> float | None:
    """The retention a deployment keeps calls for, if this code has such a setting."""
    field = Settings.model_fields.get("retention_days")
    return float(field.default) if field is not None and field.default is not None else None


def build(args: argparse.Namespace, names: tuple[str, str]) -> tuple[str, str]:
    """Both databases, migrated and filled; their URLs."""
    shape = Shape(args.calls, args.days, args.tenants)
    urls = []
    for name, history in zip(names, (False, True), strict=True):
        url = create_database(args.database_url, name)
        migrate.upgrade(url, args.revision)
        started = time.monotonic()
        print(f"{name}: migrated to {args.revision}; filling ({'history + ' * history}live set)")
        fill(url, shape, history=history)
        print(f"{name}: built in {time.monotonic() - started:,.0f} s", flush=True)
        urls.append(url)
    return urls[0], urls[1]


async def operations(
    empty: str, full: str, repeat: int
) -> tuple[list[Row], dict[str, list[tuple[str, int, int]]]]:
    """Every operation on both databases, alternately, so both see the same machine."""
    rows, detail = [], {}
    async with SandboxServer() as sandbox, Transport(32) as transport:
        targets = [await Target.open(name, url, sandbox, transport)
                   for name, url in (("empty", empty), ("full", full))]  # fmt: skip
        try:
            for op in OPERATIONS:
                try:
                    e, f = await measure(op, targets, repeat)
                except Exception as exc:  # noqa: BLE001 - one operation's failure is reported, not fatal
                    # Typically the code expects a newer schema than --revision built.
                    print(f"  {op.name}: failed: {type(exc).__name__}: {str(exc)[:160]}")
                    rows.append(Row(op.name, *(float("nan"),) * 2, 0, 0, 0, 0, note="failed"))
                    continue
                rows.append(Row(op.name, e.seconds * 1e3, f.seconds * 1e3, e.rows, f.rows,
                                e.buffers, f.buffers, returned=f.returned))  # fmt: skip
                detail[op.name] = [
                    (a.statement, a.rows, b.rows)
                    for a, b in zip(e.statements, f.statements, strict=False)
                ]
                print(f"  {op.name}: {e.seconds * 1e3:.2f} -> {f.seconds * 1e3:.2f} ms, "
                      f"rows {e.rows:,} -> {f.rows:,}", flush=True)  # fmt: skip
        finally:
            for target in targets:
                await target.close()
    return rows, detail


async def http_intake(empty: str, full: str, rounds: int, quiet: float) -> list[float]:
    """Rounds of ``POST /v1/tool-calls`` at 16 clients against ``tool-dispatcher serve``,
    the databases in turn (empty first, then full first): each round's full/empty. With
    ``quiet``, each cell first waits up to that long for the machine to idle."""
    ratios = []
    for r in range(rounds):
        order = [("empty", empty), ("full", full)][:: 1 if r % 2 == 0 else -1]
        rates: dict[str, float] = {}
        for name, url in order:
            if quiet:
                await wait_quiet(quiet)
            cell = await run_http(url, clients=16, seconds=5.0, warmup=1.5)
            rates[name] = cell.rate
            print(f"  http round {r + 1}, {name}: {cell.rate:,.0f} calls/s "
                  f"{'[' + cell.note + ']' if cell.note else ''}", flush=True)  # fmt: skip
        ratios.append(ratio(rates["full"], rates["empty"]))
    return ratios


def report(growth: Growth, rows: list[Row], detail: dict[str, Any], http: list[float]) -> None:
    tables, indexes = size_tables(growth)
    print(f"\n## Bytes per finished call ({growth.calls:,} finished calls of history)\n")
    print(tables)
    print(f"\nOutbox: {growth.outbox:,.0f} B per call written in its {OUTBOX_WINDOW_HOURS} h "
          f"window ({growth.outbox_calls:,} calls); the rest, {growth.retained:,.0f} B per call, "
          "is kept as long as the call.\n")  # fmt: skip
    print(indexes)
    retentions = [RETENTION_DAYS]
    configured = configured_retention()
    if configured is not None and configured != RETENTION_DAYS:
        retentions.append(configured)
    print(f"\n## Projected steady-state size (configured retention: "
          f"{'none' if configured is None else f'{configured:g} days'})\n")  # fmt: skip
    print(projection_table(growth, retentions))
    if rows:
        print(f"\n## Operations, empty database vs full (ceiling {CEILING:g}x)\n")
        print(operations_table(rows))
    grown = statements_detail(detail)
    if grown:
        print("\nStatements whose rows examined grew past the ceiling:")
        print("\n".join(grown))
    if http:
        value = statistics.median(http)
        each = ", ".join(f"{h:.2f}" for h in http)
        print(f"\nHTTP intake, full/empty calls/s: {value:.2f}x (rounds {each}): "
              f"{verdict(value, floor=HTTP_FLOOR)} (target >= {HTTP_FLOOR:g}x)")  # fmt: skip


async def run(args: argparse.Namespace) -> None:
    token = secrets.token_hex(4)
    names = (
        tuple(args.reuse) if args.reuse else (f"td_growth_{token}_empty", f"td_growth_{token}_full")
    )
    urls: tuple[str, str] | None = None
    try:
        if args.reuse:
            urls = (
                with_database(args.database_url, names[0]),
                with_database(args.database_url, names[1]),
            )
        else:
            urls = build(args, names)
        empty_sizes, full_sizes = (sizes(u, OUTBOX_WINDOW_HOURS) for u in urls)
        growth = Growth.between(full_sizes, empty_sizes)
        print(f"sizes: empty {human(empty_sizes.total)}, full {human(full_sizes.total)}, "
              f"{growth.total:,.0f} B per finished call", flush=True)  # fmt: skip
        rows, detail = ([], {}) if args.skip_ops else await operations(*urls, args.repeat)
        skip = args.skip_http or args.skip_ops
        http = [] if skip else await http_intake(*urls, args.http_rounds, args.wait_quiet)
        report(growth, rows, detail, http)
    finally:
        if args.keep or args.reuse:
            print(f"\nkept: {', '.join(names)}")
        else:
            for name in names:
                drop_database(args.database_url, name)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.growth", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--calls", type=int, default=2_000_000, help="finished calls of history")
    parser.add_argument("--days", type=float, default=60.0, help="the history's span")
    parser.add_argument("--tenants", type=int, default=50)
    parser.add_argument("--revision", default="head", help="the schema to build on")
    parser.add_argument("--repeat", type=int, default=7, help="timed runs per operation")
    parser.add_argument("--http-rounds", type=int, default=5)
    parser.add_argument(
        "--wait-quiet", type=float, default=0.0, metavar="SECONDS",
        help="before each HTTP cell, wait up to this long for other load to drop",
    )  # fmt: skip
    parser.add_argument("--skip-http", action="store_true")
    parser.add_argument("--skip-ops", action="store_true", help="sizes only")
    parser.add_argument("--keep", action="store_true", help="keep both databases")
    parser.add_argument(
        "--reuse", type=lambda s: s.split(","), metavar="EMPTY_DB,FULL_DB",
        help="measure two databases kept by an earlier run (the operations add to them)",
    )  # fmt: skip
    parser.add_argument(
        "--database-url",
        default="postgresql://postgres@127.0.0.1:5432/postgres",
        help="a server where this user may CREATE DATABASE; scratch databases are dropped",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    print(f"growth bench: {args.calls:,} calls over {args.days:g} days, {args.tenants} tenants, "
          f"schema {args.revision}", flush=True)  # fmt: skip
    asyncio.run(run(args))
    print(f"\n(total {time.monotonic() - started:,.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
