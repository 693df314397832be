"""The sandbox as a process: restarts on a PostgreSQL store, the command line, SIGTERM."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys

import httpx
import pytest

from devtools.embedded import free_port
from devtools.sandbox import SandboxServer, serve_sandbox


@pytest.mark.postgres
async def test_state_survives_a_restart_on_postgresql(database_url: str) -> None:
    port = free_port()
    async with (
        SandboxServer(port=port, database_url=database_url) as sandbox,
        httpx.AsyncClient(base_url=sandbox.url, timeout=5) as client,
    ):
        first = await client.post("/v1/requests", json={"a": 1}, headers={"Idempotency-Key": "k"})
        pending = await client.post(
            "/v1/requests",
            json={"simulate": "pending", "pendingLookups": 1},
            headers={"Idempotency-Key": "p"},
        )
        await client.get(f"/v1/requests/{pending.json()['externalRequestId']}")

    async with (
        SandboxServer(port=port, database_url=database_url) as sandbox,
        httpx.AsyncClient(base_url=sandbox.url, timeout=5) as client,
    ):
        replay = await client.post("/v1/requests", json={"a": 1}, headers={"Idempotency-Key": "k"})
        assert replay.content == first.content
        assert replay.headers["idempotent-replayed"] == "true"
        # The one lookup before the restart still counts: this one settles it.
        settled = await client.get("/v1/requests", params={"idempotencyKey": "p"})
        assert settled.json()["status"] == "succeeded"
        counts = (await client.get("/v1/effects")).json()
        assert counts["effects"] == {"k": 1, "p": 1}
        # Received counts describe this process's traffic only.
        assert counts["received"] == {"k": 1, "p": 1}


async def test_serve_sandbox_reports_ready_and_stops() -> None:
    ready, stop = asyncio.Event(), asyncio.Event()
    port = free_port()
    task = asyncio.create_task(serve_sandbox("127.0.0.1", port, ready=ready, stop=stop))
    await asyncio.wait_for(ready.wait(), 5)
    async with httpx.AsyncClient(timeout=5) as client:
        health = await client.get(f"http://127.0.0.1:{port}/v1/health")
        assert health.json() == {"status": "ok", "store": "memory"}
    stop.set()
    await asyncio.wait_for(task, 5)


async def test_keep_alive_connection_serves_many_requests() -> None:
    async with SandboxServer() as sandbox:
        limits = httpx.Limits(max_connections=1)
        async with httpx.AsyncClient(base_url=sandbox.url, limits=limits, timeout=5) as client:
            for i in range(20):
                response = await client.post(
                    "/v1/requests", json={"i": i}, headers={"Idempotency-Key": f"ka:{i}"}
                )
                assert response.status_code == 200
            assert (await client.get("/v1/effects")).json()["total"] == 20


async def test_the_command_serves_until_sigterm() -> None:
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "devtools.sandbox",
        "--port",
        str(port),
        # No ops endpoints (0): the default port may be held by another test's sandbox.
        "--ops-port",
        "0",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        banner = await asyncio.wait_for(process.stdout.readline(), 15)
        assert f"http://127.0.0.1:{port}" in banner.decode()
        async with httpx.AsyncClient(timeout=5) as client:
            response = await client.post(
                f"http://127.0.0.1:{port}/v1/requests", json={}, headers={"Idempotency-Key": "c"}
            )
            assert response.status_code == 200
        process.send_signal(signal.SIGTERM)
        out, err = await asyncio.wait_for(process.communicate(), 10)
        assert process.returncode == 0, err.decode()
        assert b"stopped" in out
        assert err == b""
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


@pytest.mark.parametrize(
    "argv",
    [["--port", "http"], ["--port", "70000"], ["--database-url", "mysql://x"], ["--nope"]],
)
def test_bad_arguments_exit_2_with_one_line(argv: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "devtools.sandbox", *argv],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1
    assert "error:" in done.stderr


def test_an_unreachable_database_exits_1_with_one_line() -> None:
    url = f"postgresql://nobody@127.0.0.1:{free_port()}/none"
    done = subprocess.run(
        [sys.executable, "-m", "devtools.sandbox", "--port", "0", "--database-url", url],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr.startswith("sandbox: error: ")
    assert len(done.stderr.strip().splitlines()) == 1
