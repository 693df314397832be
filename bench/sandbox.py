"""The sandbox provider's own request rate: the ceiling a worker benchmark compares with.

Starts ``python -m devtools.sandbox`` in a subprocess (so the load generator does not
share its event loop) and drives it with concurrent keep-alive connections speaking raw
HTTP/1.1, because an httpx client would saturate a core before the server does.

    .venv/bin/python -m bench.sandbox [--connections 32] [--seconds 5] [--database-url URL]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import sys
import time

from devtools.embedded import free_port

_counter = itertools.count()


def _request(host: str, port: int, mode: str) -> bytes:
    n = next(_counter)
    if mode == "lookup":
        head = f"GET /v1/requests?idempotencyKey=warm:{n % 100} HTTP/1.1\r\nHost: {host}:{port}\r\n"
        return (head + "\r\n").encode()
    key = f"bench:{n}" if mode == "create" else "bench:same"
    body = b'{"orderId":"o-1","amount":5}'
    return (
        f"POST /v1/requests HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Content-Type: application/json\r\nIdempotency-Key: {key}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


async def _read_response(reader: asyncio.StreamReader) -> int:
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    length = 0
    for line in head.split(b"\r\n"):
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
    await reader.readexactly(length)
    return status


async def _connection(
    host: str, port: int, mode: str, deadline: float, latencies: list[float]
) -> int:
    reader, writer = await asyncio.open_connection(host, port)
    done = 0
    try:
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            writer.write(_request(host, port, mode))
            status = await _read_response(reader)
            if status >= 300:
                raise RuntimeError(f"unexpected status {status}")
            latencies.append(time.perf_counter() - started)
            done += 1
    finally:
        writer.close()
    return done


async def _warm(host: str, port: int) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    body = b"{}"
    for i in range(100):
        writer.write(
            (
                f"POST /v1/requests HTTP/1.1\r\nHost: {host}\r\nIdempotency-Key: warm:{i}\r\n"
                f"Content-Length: {len(body)}\r\n\r\n"
            ).encode()
            + body
        )
        await _read_response(reader)
    writer.close()


async def start_sandbox(port: int, database_url: str | None = None) -> asyncio.subprocess.Process:
    """The sandbox in its own process, once it listens."""
    argv = [sys.executable, "-m", "devtools.sandbox", "--port", str(port)]
    if database_url:
        argv += ["--database-url", database_url]
    server = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE)
    assert server.stdout is not None
    print((await asyncio.wait_for(server.stdout.readline(), 30)).decode().strip())
    return server


async def measure(
    host: str, port: int, *, mode: str, connections: int, seconds: float
) -> tuple[int, float, list[float]]:
    """Requests done, elapsed seconds and latencies of ``connections`` keep-alive clients."""
    await _warm(host, port)
    latencies: list[float] = []
    started = time.perf_counter()
    deadline = started + seconds
    counts = await asyncio.gather(
        *(_connection(host, port, mode, deadline, latencies) for _ in range(connections))
    )
    return sum(counts), time.perf_counter() - started, latencies


async def run(connections: int, seconds: float, mode: str, database_url: str | None) -> None:
    host, port = "127.0.0.1", free_port()
    server = await start_sandbox(port, database_url)
    try:
        total, elapsed, latencies = await measure(
            host, port, mode=mode, connections=connections, seconds=seconds
        )
        cuts = statistics.quantiles(latencies, n=100)
        print(
            f"mode={mode} connections={connections}: {total} requests in {elapsed:.1f}s = "
            f"{total / elapsed:,.0f} req/s; p50 {cuts[49] * 1000:.2f} ms, "
            f"p99 {cuts[98] * 1000:.2f} ms"
        )
    finally:
        server.terminate()
        await server.wait()


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.sandbox", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument(
        "--mode",
        choices=["create", "replay", "lookup"],
        default="create",
        help="create: a new key each request (an effect each); replay: one key; lookup: GET",
    )
    parser.add_argument("--database-url", default=None)
    args = parser.parse_args()
    asyncio.run(run(args.connections, args.seconds, args.mode, args.database_url))


if __name__ == "__main__":
    main()
