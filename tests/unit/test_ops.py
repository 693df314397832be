"""The ops server (dispatcher.ops) on the test's own event loop: /healthz is answered
by the loop, so a blocked loop fails it; /readyz names the checks that failed or hung;
/metrics is Prometheus text. Real HTTP from a thread, nothing mocked."""

from __future__ import annotations

import asyncio
import time

import httpx

from devtools.embedded import free_port
from dispatcher.ops import NotReady, Ops, serve_ops

HOST = "127.0.0.1"


def get(url: str, timeout: float = 5.0) -> httpx.Response | str:
    """A GET from another thread; a timeout is an answer here, not an error."""
    try:
        return httpx.get(url, timeout=timeout)
    except httpx.TimeoutException:
        return "timeout"


async def test_a_blocked_loop_fails_healthz_and_recovers() -> None:
    async with serve_ops(Ops(), HOST, free_port(HOST)) as url:
        assert url is not None
        healthy = await asyncio.to_thread(get, f"{url}/healthz")
        assert isinstance(healthy, httpx.Response) and healthy.status_code == 200
        assert healthy.json() == {"status": "ok"}

        loop = asyncio.get_running_loop()
        probe = loop.run_in_executor(None, get, f"{url}/healthz", 1.0)
        # The loop blocked by a synchronous call, as a CPU-bound or blocking bug does.
        time.sleep(2.5)  # noqa: ASYNC251 - blocking the loop is the point
        assert await probe == "timeout"

        again = await asyncio.to_thread(get, f"{url}/healthz", 1.0)
        assert isinstance(again, httpx.Response) and again.status_code == 200


async def test_readyz_names_the_failed_and_the_hung_checks() -> None:
    ops = Ops()
    gate = asyncio.Event()

    async def fine() -> None:
        return None

    async def refused() -> None:
        raise NotReady("not joined to consumer group g")

    async def hung() -> None:
        await gate.wait()

    ops.add_check("database", fine)
    ops.add_check("consumer group", refused)
    ops.add_check("broker", hung)
    async with serve_ops(ops, HOST, free_port(HOST)) as url:
        answer = await asyncio.to_thread(get, f"{url}/readyz")
        assert isinstance(answer, httpx.Response)
        assert answer.status_code == 503
        body = answer.json()
        assert body["failed"] == ["broker", "consumer group"]
        assert body["checks"]["database"] == "ok"
        assert body["checks"]["consumer group"] == "not joined to consumer group g"
        assert body["checks"]["broker"].startswith("no answer within")

        ops.checks = {"database": fine}
        ready = await asyncio.to_thread(get, f"{url}/readyz")
        assert isinstance(ready, httpx.Response) and ready.status_code == 200
        assert ready.json() == {"status": "ready", "checks": {"database": "ok"}}

        metrics = await asyncio.to_thread(get, f"{url}/metrics")
        assert isinstance(metrics, httpx.Response) and metrics.status_code == 200
        assert metrics.headers["content-type"].startswith("text/plain")
        assert "# TYPE python_info gauge" in metrics.text


async def test_port_zero_is_off_and_a_taken_default_port_is_skipped() -> None:
    port = free_port(HOST)
    async with serve_ops(Ops(), HOST, 0) as off:
        assert off is None
    async with serve_ops(Ops(), HOST, port) as first:
        assert first is not None
        async with serve_ops(Ops(), HOST, port, required=False) as second:
            assert second is None
