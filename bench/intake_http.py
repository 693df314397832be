"""The HTTP modes of ``bench.intake``: ``tool-dispatcher serve`` in processes of its own,
driven by a minimal raw asyncio HTTP/1.1 keep-alive client in the bench's process."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import re
import secrets
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import psutil  # type: ignore[import-untyped]

from bench.harness import Call, Cell, drive, postgres_meter, stop_process
from bench.intake_rows import CAPABILITY, INPUT, TENANT
from devtools.embedded import free_port, wait_for_port
from devtools.registries import SANDBOX_REGISTRY
from dispatcher.settings import hash_api_key

ROOT = Path(__file__).resolve().parent.parent


class _HttpConnection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection, one request at a time, responses framed by
    Content-Length (all the API sends). Much cheaper per request than httpx."""

    def __init__(self) -> None:
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._waiter: asyncio.Future[tuple[int, bytes]] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        end = self._buffer.find(b"\r\n\r\n")
        if end < 0 or self._waiter is None:
            return
        head = bytes(self._buffer[:end]).lower()
        length = re.search(rb"\r\ncontent-length: *(\d+)", head)
        total = end + 4 + (int(length.group(1)) if length else 0)
        if len(self._buffer) < total:
            return
        body = bytes(self._buffer[end + 4 : total])
        del self._buffer[:total]
        waiter, self._waiter = self._waiter, None
        waiter.set_result((int(head[9:12]), body))

    def connection_lost(self, exc: Exception | None) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(ConnectionError("the server closed the connection"))

    async def request(self, raw: bytes) -> tuple[int, bytes]:
        assert self._transport is not None
        self._waiter = asyncio.get_running_loop().create_future()
        self._transport.write(raw)
        return await self._waiter

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()


def server_flavour() -> str:
    """The server's event loop (dispatcher.runtime's, which the server inherits through
    this process's environment) and uvicorn's HTTP parser."""
    loop = os.environ.get("TOOL_DISPATCHER_EVENT_LOOP", "uvloop")
    http = "httptools" if importlib.util.find_spec("httptools") else "h11"
    return f"uvicorn loop={loop} http={http}"


@contextlib.asynccontextmanager
async def api_process(
    url: str, clients: int, key: str, log: Path
) -> AsyncIterator[tuple[int, int]]:
    """``python -m tool_dispatcher serve`` in its own process; yields (port, pid)."""
    port = free_port()
    env = {
        **os.environ,
        "TOOL_DISPATCHER_DATABASE_URL": url,
        "TOOL_DISPATCHER_API_KEYS": json.dumps([{"sha256": hash_api_key(key), "tenant": TENANT}]),
        "TOOL_DISPATCHER_HTTP_HOST": "127.0.0.1",
        "TOOL_DISPATCHER_HTTP_PORT": str(port),
        "TOOL_DISPATCHER_DB_POOL_SIZE": str(max(clients, 2)),
        # `serve` has no default registry; the library modes use this one too.
        "TOOL_DISPATCHER_CAPABILITIES_FILE": str(SANDBOX_REGISTRY),
        # One tenant at full speed is what is measured: its rate limit would cap it.
        "TOOL_DISPATCHER_SUBMIT_RATE_PER_SECOND": "0",
    }
    out = await asyncio.to_thread(log.open, "wb")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tool_dispatcher", "serve",
        cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        await asyncio.to_thread(wait_for_port, "127.0.0.1", port, 30.0)
        yield port, proc.pid
    finally:
        await stop_process(proc)
        out.close()


async def run_http(url: str, clients: int, seconds: float, warmup: float) -> Cell:
    return await _http_cell("http", url, clients, seconds, warmup, processes=1)


async def run_http_per_core(url: str, clients: int, seconds: float, warmup: float) -> Cell:
    """As deployed on this machine: one API process per core (the API is one Python
    process, so it uses one core; PostgreSQL's backends use them all), the clients
    split evenly between them, each kept on one as a load balancer would."""
    cores = psutil.cpu_count() or 1
    return await _http_cell("http-cores", url, clients, seconds, warmup, processes=cores)


async def _http_cell(
    mode: str, url: str, clients: int, seconds: float, warmup: float, *, processes: int
) -> Cell:
    key = "tdk_bench_" + secrets.token_hex(16)
    with tempfile.TemporaryDirectory(prefix="td-http-") as tmp:
        logs = [Path(tmp, f"server-{n}.log") for n in range(processes)]
        async with contextlib.AsyncExitStack() as stack:
            pool = -(-clients // processes)
            servers = [
                await stack.enter_async_context(api_process(url, pool, key, log)) for log in logs
            ]
            loop = asyncio.get_running_loop()
            ports = [servers[i % processes][0] for i in range(clients)]
            conns = [
                (await loop.create_connection(_HttpConnection, "127.0.0.1", port))[1]
                for port in ports
            ]
            procs = [psutil.Process(pid) for _, pid in servers]
            meter = postgres_meter(url, client=psutil.Process(), server=procs)
            try:
                cell = await drive(
                    Cell(mode, clients),
                    [_http_client(i, c, ports[i], key) for i, c in enumerate(conns)],
                    seconds=seconds,
                    warmup=warmup,
                    cpu=meter,
                )
            finally:
                for conn in conns:
                    conn.close()
        if cell.errors or not cell.calls:
            text = "".join(
                [await asyncio.to_thread(log.read_text, errors="replace") for log in logs]
            )
            tail = text.strip().splitlines()[-3:]
            cell.note = (cell.note + " | server: " + " / ".join(tail))[:300]
    return cell


def _http_client(i: int, conn: _HttpConnection, port: int, key: str) -> Call:
    body = json.dumps({"runId": f"run-{i}", "capabilityId": CAPABILITY, "input": INPUT}).encode()
    raw = (
        f"POST /v1/tool-calls HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body

    async def call() -> None:
        status, answer = await conn.request(raw)
        if status != 201:
            raise RuntimeError(f"HTTP {status}: {answer[:200]!r}")

    return call
