"""The day a provider goes down, as a drill: calls of one side-effecting capability
arrive at ``--rate`` a second for ``--seconds`` while the provider is down for
``--outage`` seconds (from ``--outage-at``), through the service's own processes (the
API, a worker, the relay and the reconciler loop) on an embedded broker and a scratch
database. ``--down`` says how: ``refuse`` (nothing listens: connection refused),
``reset`` (connections accepted and reset at once: a request may have left) or ``503``
(``503`` with ``Retry-After: 1`` to everything). Two drills, each on a fresh database
and broker:

  as-is    nobody acts: each call spends its retry attempts, and ends ``failed`` if
           nothing reached the provider, else ``result_unknown`` for the reconciler.
  paused   an operator pauses the capability (every tenant) ``--react`` seconds into
           the outage and resumes it when the provider answers again.
  breaker  nobody acts; the capability has a circuit breaker (``--threshold`` failed
           attempts within 30 s open it, ``--cool-down`` seconds before one probe).

Printed per drill: the calls by final status, how many ended ``failed``, the requests
(and lookups) that reached the provider while it was down (counted by the provider,
so not when it refuses connections), the attempts that failed (counted from the
outcome events' ``attempts``: every attempt of this run that failed failed for the
outage), the most effects any key had, and the drain time: from the provider's return
to every call settled. Run it as::

    .venv/bin/python -m bench.outage [--down refuse|reset|503] [--rate 20]
        [--seconds 40] [--outage 30] [--outage-at 5] [--react 3] [--threshold 5]
        [--cool-down 5] [--drills as-is,paused,breaker] [--database-url URL]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.harness import render_table, service_env, start_python, stop_process
from bench.intake import ScratchDatabases
from bench.outage_provider import Provider
from bench.outage_reads import (
    drained,
    failed_attempts,
    failed_probes,
    failed_span,
    most_effects,
    status_counts,
)
from devtools.embedded import Tansu, free_port
from devtools.registries import capability, registry_of, registry_toml
from devtools.sandbox import SandboxServer
from dispatcher.settings import hash_api_key

CAPABILITY = "send-email"
KEY = "tdk_bench_outage_operator"
DRILLS = ("as-is", "paused", "breaker")


@dataclass
class Drill:
    name: str
    statuses: Counter[str] = field(default_factory=Counter)
    refused: int | None = 0
    """Requests that reached the provider while it was down (None: not countable)."""
    drain_seconds: float | None = None
    """From the provider's return to every call settled (None: not within the wait)."""
    submitted: int = 0
    failed_span: tuple[float, float] | None = None
    """When the failed calls were submitted: seconds into the load, first and last."""
    failed_attempts: int = 0
    """Attempts that failed, from the outcome events (the provider was down for each)."""
    most_effects: int = 0
    """The most effects the provider applied for one key (1: none twice)."""
    failed_probes: int = 0
    """Probe calls the breaker let through that failed (each opened it again)."""


async def run_drill(name: str, url: str, args: argparse.Namespace, home: Path) -> Drill:
    drill = Drill(name)
    broker = Tansu(log_file=home / f"tansu-{name}.log")
    bootstrap = await asyncio.to_thread(broker.start)
    async with SandboxServer() as sandbox:
        provider = Provider(sandbox, args.down)
        proxy = provider.proxy
        await proxy.start()
        caps = home / f"caps-{name}.toml"
        port, env = free_port(), _env(url, bootstrap, caps, proxy.port, _breaker(name, args))
        env["TOOL_DISPATCHER_HTTP_PORT"] = str(port)
        processes = [
            await start_python(["-m", "tool_dispatcher", command], env)
            for command in ("serve", "worker", "relay", "reconcile")
        ]
        try:
            async with httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{port}",
                headers={"Authorization": f"Bearer {KEY}"},
                timeout=10,
            ) as api:
                await _ready(api)
                await _drive(drill, api, provider, args)
                settled = await drained(url, drill.submitted, args.settle)
                if settled is not None:
                    drill.drain_seconds = settled - provider.recovered_at
                drill.statuses = await status_counts(url)
                drill.failed_span = await failed_span(url)
                drill.failed_attempts = await failed_attempts(url)
                drill.most_effects = await most_effects(sandbox.url)
                drill.failed_probes = await failed_probes(url)
        finally:
            for process in processes:
                await stop_process(process)
            await proxy.stop()
            await asyncio.to_thread(broker.stop)
    drill.refused = provider.reached
    return drill


def _breaker(name: str, args: argparse.Namespace) -> dict[str, float] | None:
    if name != "breaker":
        return None
    return {"threshold": args.threshold, "windowSeconds": 30, "coolDownSeconds": args.cool_down,
            "probes": 1}  # fmt: skip


def _env(
    url: str, bootstrap: str, caps: Path, proxy_port: int, breaker: dict[str, float] | None
) -> dict[str, str]:
    down = f"http://127.0.0.1:{proxy_port}"
    # Every request and lookup goes through the proxy: the provider is down for all.
    extra: dict[str, Any] = {"breaker": breaker} if breaker else {}
    send = capability(CAPABILITY, down, by_key=True, reconcile={"maxAttempts": 20}, **extra)
    caps.write_text(registry_toml(registry_of(send)))
    run = secrets.token_hex(4)
    keys = [{"sha256": hash_api_key(KEY), "tenant": "acme", "scopes": ["submit", "read",
            "operate", "admin"]}]  # fmt: skip
    return {
        **service_env(url, bootstrap, caps),
        "TOOL_DISPATCHER_API_KEYS": json.dumps(keys),
        "TOOL_DISPATCHER_DISPATCH_TOPIC": f"outage-commands-{run}",
        "TOOL_DISPATCHER_EVENTS_TOPIC": f"outage-events-{run}",
        "TOOL_DISPATCHER_ESCALATIONS_TOPIC": f"outage-escalations-{run}",
        "TOOL_DISPATCHER_WORKER_GROUP_ID": f"outage-workers-{run}",
        "TOOL_DISPATCHER_RECONCILE_INTERVAL_SECONDS": "1",
        "TOOL_DISPATCHER_SUBMIT_RATE_PER_SECOND": "10000",
        "TOOL_DISPATCHER_LOG_LEVEL": "WARNING",
    }


async def _ready(api: httpx.AsyncClient, within: float = 60) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            if (await api.get("/readyz")).status_code == 200:
                return
        except httpx.TransportError:
            pass
        await asyncio.sleep(0.2)
    raise RuntimeError("the API did not come up")


async def _drive(
    drill: Drill, api: httpx.AsyncClient, provider: Provider, args: argparse.Namespace
) -> None:
    """The load, paced from the start, and the outage (and the operator) on its clock."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    events: list[tuple[float, Callable[[], object]]] = [
        (args.outage_at, lambda: _spawn(provider.fail())),
        (args.outage_at + args.outage, lambda: _spawn(provider.recover())),
    ]
    if drill.name == "paused":
        events += [
            (args.outage_at + args.react, lambda: _spawn(_operator(api, "pause"))),
            (args.outage_at + args.outage, lambda: _spawn(_operator(api, "resume"))),
        ]
    events.sort(key=lambda e: e[0])
    sends: list[asyncio.Task[None]] = []
    total = round(args.rate * args.seconds)
    for n in range(total):
        at = n / args.rate
        while events and events[0][0] <= at:
            events.pop(0)[1]()
        await asyncio.sleep(max(0.0, start + at - loop.time()))
        sends.append(asyncio.create_task(_submit(api, n, drill)))
    while events:
        due, act = events.pop(0)
        await asyncio.sleep(max(0.0, start + due - loop.time()))
        act()
    await asyncio.gather(*sends)
    await asyncio.gather(*_TASKS)


_TASKS: set[asyncio.Task[None]] = set()


def _spawn(coroutine: Coroutine[Any, Any, None]) -> None:
    task = asyncio.create_task(coroutine)
    _TASKS.add(task)
    task.add_done_callback(_TASKS.discard)


async def _operator(api: httpx.AsyncClient, verb: str) -> None:
    why = "down" if verb == "pause" else "back"
    body = {"reason": f"bench: provider {why}", "everyTenant": True}
    reply = await api.post(f"/v1/capabilities/{CAPABILITY}/{verb}", json=body)
    reply.raise_for_status()


async def _submit(api: httpx.AsyncClient, n: int, drill: Drill) -> None:
    """One call, as a producer sends it: a lost answer is sent again with its key (the
    API answers the same call), three times at most."""
    body = {"runId": f"run-{n // 10}", "capabilityId": CAPABILITY, "idempotencyKey": f"k-{n}",
            "input": {"to": f"user{n}@example.com"}}  # fmt: skip
    for _ in range(3):
        try:
            reply = await api.post("/v1/tool-calls", json=body)
        except httpx.TransportError:
            await asyncio.sleep(0.5)
            continue
        if reply.status_code in (200, 201):
            drill.submitted += 1
        return


def report(drills: list[Drill], markdown: bool) -> str:
    statuses = sorted({s for d in drills for s in d.statuses})
    rows = [
        [
            d.name,
            str(d.submitted),
            str(d.statuses.get("failed", 0)),
            ", ".join(f"{s} {d.statuses[s]}" for s in statuses if d.statuses.get(s)),
            "n/a" if d.refused is None else str(d.refused),
            str(d.failed_attempts),
            str(d.most_effects),
            "-" if d.failed_span is None else f"{d.failed_span[0]:.1f}-{d.failed_span[1]:.1f}",
            "not settled" if d.drain_seconds is None else f"{d.drain_seconds:.1f}",
        ]
        for d in drills
    ]
    header = [
        "drill",
        "calls",
        "failed",
        "by final status",
        "reached while down",
        "failed attempts",
        "most effects a key",
        "failed submitted at s",
        "drain s",
    ]
    return render_table(rows, header, markdown=markdown)


async def main_async(args: argparse.Namespace) -> int:
    dbs = ScratchDatabases(args.database_url)
    print(
        f"outage drill: {args.rate:g} calls/s for {args.seconds:g} s; the provider down"
        f" ({args.down}) from {args.outage_at:g} s for {args.outage:g} s; paused drill: the"
        f" operator pauses {args.react:g} s into it and resumes at its end",
        flush=True,
    )
    drills: list[Drill] = []
    dbs.create_template()
    try:
        with tempfile.TemporaryDirectory(prefix="td-outage-") as tmp:
            for name in args.drills:
                with dbs.cell() as url:
                    drill = await run_drill(name, url, args, Path(tmp))
                drills.append(drill)
                print(f"  {name}: {dict(drill.statuses)}, reached {drill.refused}", flush=True)
    finally:
        dbs.drop()
    print()
    print(report(drills, markdown=False))
    print(summary({d.name: d for d in drills}, args))
    print()
    print(report(drills, markdown=True))
    return 0 if all(d.drain_seconds is not None for d in drills) else 1


def summary(drills: dict[str, Drill], args: argparse.Namespace) -> str:
    """Each drill against the drill with nobody acting, and the breaker's bound."""
    lines = []
    base = drills.get("as-is")
    for name, drill in drills.items():
        if base is None or drill is base:
            continue
        line = (
            f"{name}: failed {drill.statuses.get('failed', 0)} against"
            f" {base.statuses.get('failed', 0)} as-is; failed attempts {drill.failed_attempts}"
            f" against {base.failed_attempts}"
        )
        if base.refused and drill.refused is not None:
            line += f"; requests at the down provider {drill.refused / base.refused:.2f}x"
        lines.append(line)
    breaker = drills.get("breaker")
    if breaker is not None:
        bound = args.threshold + breaker.failed_probes
        lines.append(
            f"breaker: {breaker.failed_attempts} failed attempts against a bound of {bound:g}"
            f" ({args.threshold:g} threshold + {breaker.failed_probes} failed probes), ratio"
            f" {breaker.failed_attempts / bound:.2f}; most effects of a key"
            f" {breaker.most_effects}; drain {breaker.drain_seconds} s"
        )
    return "\n" + "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.outage", description=__doc__.split("\n\n")[0]
    )
    add: Callable[..., object] = parser.add_argument
    add("--rate", type=float, default=20.0, help="calls submitted a second")
    add("--down", choices=("refuse", "reset", "503"), default="refuse", help="how it is down")
    add("--seconds", type=float, default=40.0, help="seconds of submissions")
    add("--outage", type=float, default=30.0, help="seconds the provider refuses connections")
    add("--outage-at", type=float, default=5.0, help="when the outage begins (s)")
    add("--react", type=float, default=3.0, help="seconds into the outage the operator pauses")
    add("--threshold", type=float, default=5, help="the breaker's failed attempts to open")
    add("--cool-down", type=float, default=5.0, help="seconds the breaker waits to probe")
    add("--drills", type=lambda v: tuple(v.split(",")), default=DRILLS, help="which drills")
    add("--settle", type=float, default=180.0, help="seconds to wait for every call to settle")
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
