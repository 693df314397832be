"""Ops endpoints of the real processes: every long-running command of a
stack answers /healthz, /readyz and /metrics on its configured port; a stopped worker
fails /healthz; a worker started before the broker is alive but not ready until it has
joined its group; a process whose database is unreachable is not ready, naming it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess

import httpx
import pytest

from devtools.embedded import Tansu, free_port
from devtools.sandbox import SandboxServer
from tests.fixtures.metrics import PREFIXES, catalogue
from tests.fixtures.stack import MakeStack, ProcessStack, exited
from tests.fixtures.waiting import eventually

pytestmark = [pytest.mark.postgres, pytest.mark.kafka, pytest.mark.slow]

HOST = "127.0.0.1"


async def answer(port: int, path: str, within: float = 3.0) -> httpx.Response | None:
    """The endpoint's answer, or None if nothing answered (yet) within ``within`` s."""
    try:
        async with httpx.AsyncClient(timeout=within) as client:
            return await client.get(f"http://{HOST}:{port}{path}")
    except httpx.TransportError:
        return None


async def wait_for(
    stack: ProcessStack, process: subprocess.Popen[bytes], port: int, path: str, status: int
) -> httpx.Response:
    """Wait until ``path`` answers ``status``; the process must stay up meanwhile."""
    last: list[httpx.Response | None] = [None]

    async def answered() -> bool:
        assert process.poll() is None, stack.log_of(process)
        last[0] = await answer(port, path)
        return last[0] is not None and last[0].status_code == status

    await eventually(answered, what=f"{path} on :{port} to answer {status}")
    assert last[0] is not None
    return last[0]


async def test_every_process_answers_healthz_readyz_and_metrics(
    make_stack: MakeStack, sandbox: SandboxServer, database_url: str
) -> None:
    stack = make_stack(sandbox_url=sandbox.url)
    ports = {name: free_port(HOST) for name in ("worker", "relay", "reconcile", "approvals")}
    processes = {
        "worker": stack.start("worker", ops_port=str(ports["worker"])),
        "relay": stack.start("relay", ops_port=str(ports["relay"])),
        "reconcile": stack.start("reconcile", ops_port=str(ports["reconcile"])),
        "approvals": stack.start("approvals", "expire", ops_port=str(ports["approvals"])),
    }
    ports["sandbox"] = free_port(HOST)
    processes["sandbox"] = stack.start(
        "sandbox",
        "--port",
        str(free_port(HOST)),
        "--ops-port",
        str(ports["sandbox"]),
        "--database-url",
        database_url,
    )
    expected = {
        "worker": {"database", "broker", "consumer group"},
        "relay": {"database", "broker"},
        "reconcile": {"database"},
        "approvals": {"database"},
        "sandbox": {"database"},
    }
    ports["api"] = free_port(HOST)
    processes["api"] = stack.start("serve", http_port=str(ports["api"]))
    expected["api"] = set()
    exposed: dict[str, set[str]] = {}
    for name, process in processes.items():
        port = ports[name]
        if name == "api":
            # The API's own /readyz names no checks (it asks the database only).
            await wait_for(stack, process, port, "/readyz", 200)
            metrics = await answer(port, "/metrics")
            assert metrics is not None
            exposed[name] = scraped(metrics.text)
            continue
        ready = await wait_for(stack, process, port, "/readyz", 200)
        assert ready.json()["status"] == "ready", name
        assert set(ready.json()["checks"]) == expected[name], name
        assert set(ready.json()["checks"].values()) == {"ok"}, name
        health = await answer(port, "/healthz")
        assert health is not None and health.status_code == 200, name
        assert health.json() == {"status": "ok"}
        metrics = await answer(port, "/metrics")
        assert metrics is not None and metrics.status_code == 200, name
        assert "# TYPE process_cpu_seconds_total counter" in metrics.text, name
        exposed[name] = scraped(metrics.text)
    # The catalogue (docs/metrics.md) is what a running stack exposes, both ways, and
    # each metric is exposed by the process its table is for.
    # The retention job's metrics are pushed by its CronJob, not scraped: no
    # long-running process exposes them.
    entries = [e for e in catalogue() if e.process != "Retention"]
    everything = set().union(*exposed.values())
    assert everything == {e.name for e in entries}
    homes = {"API": "api", "Worker": "worker", "Relay": "relay", "Reconciler": "reconcile"}
    for entry in entries:
        if entry.process in homes:
            assert entry.name in exposed[homes[entry.process]], entry


def scraped(text: str) -> set[str]:
    """The service's metric names in a Prometheus text page, as its TYPE lines name them."""
    names = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}
    # prometheus_client adds a "<name>_created" gauge beside some histograms: the
    # histogram's own series, not a metric of ours.
    return {
        n
        for n in names
        if n.startswith(PREFIXES)
        and not (n.endswith("_created") and n[: -len("_created")] in names)
    }


async def test_a_stopped_worker_fails_healthz_until_it_continues(
    make_stack: MakeStack, sandbox: SandboxServer
) -> None:
    stack = make_stack(sandbox_url=sandbox.url)
    port = free_port(HOST)
    worker = stack.start("worker", ops_port=str(port))
    await wait_for(stack, worker, port, "/readyz", 200)
    # SIGSTOP freezes the process, its event loop with it: the socket still accepts
    # (the kernel's backlog), but no handler runs to answer.
    os.killpg(worker.pid, signal.SIGSTOP)
    try:
        assert await answer(port, "/healthz", within=1.0) is None
    finally:
        os.killpg(worker.pid, signal.SIGCONT)
    await wait_for(stack, worker, port, "/healthz", 200)


async def test_a_worker_started_before_the_broker_is_ready_only_once_joined(
    make_stack: MakeStack, sandbox: SandboxServer
) -> None:
    broker_port, port = free_port(HOST), free_port(HOST)
    stack = make_stack(sandbox_url=sandbox.url, kafka_bootstrap=f"{HOST}:{broker_port}")
    worker = stack.start("worker", ops_port=str(port))
    # Alive while it waits for the broker, but not ready: neither broker nor group.
    await wait_for(stack, worker, port, "/healthz", 200)
    waiting = await wait_for(stack, worker, port, "/readyz", 503)
    assert waiting.json()["failed"] == ["broker", "consumer group"], waiting.json()
    assert "not joined" in waiting.json()["checks"]["consumer group"]
    broker = Tansu(host=HOST, port=broker_port)
    broker.start()
    try:
        ready = await wait_for(stack, worker, port, "/readyz", 200)
        assert ready.json()["checks"]["consumer group"] == "ok"
    finally:
        stack.close()
        broker.stop()


async def test_readyz_names_an_unreachable_database(
    make_stack: MakeStack, sandbox: SandboxServer
) -> None:
    stack = make_stack(sandbox_url=sandbox.url)
    port = free_port(HOST)
    # Nothing listens there: every connection is refused, as while the server is down.
    nowhere = f"postgresql://postgres@{HOST}:{free_port(HOST)}/test"
    reconciler = stack.start("reconcile", ops_port=str(port), database_url=nowhere)
    failing = await wait_for(stack, reconciler, port, "/readyz", 503)
    assert failing.json()["failed"] == ["database"], failing.json()
    health = await answer(port, "/healthz")
    assert health is not None and health.status_code == 200


async def test_an_ops_port_that_was_set_and_is_taken_exits_1_in_one_line(
    make_stack: MakeStack, sandbox: SandboxServer
) -> None:
    stack = make_stack(sandbox_url=sandbox.url)
    with socket.socket() as taken:
        taken.bind((HOST, 0))
        taken.listen()
        port = taken.getsockname()[1]
        reconciler = stack.start("reconcile", ops_port=str(port))
        assert await exited(reconciler) == 1
    log = stack.log_of(reconciler).strip().splitlines()
    assert log[-1].startswith(f"tool-dispatcher: error: ops endpoints on {HOST}:{port}"), log
