"""CPU per provider request of this process's HTTP client, measured against the sandbox:
the provider transport (aiohttp, one pool) against httpx in pools of 2 (the client
layout it replaced), and bare aiohttp as the floor, each at the same requests in
flight with the same headers and body, one after the other in one run.

    .venv/bin/python -m bench.client_cpu [--requests 5000] [--in-flight 64] [--uvloop]

CPU is ``time.process_time()`` of this process only (the sandbox runs in its own), over
the requests sent; every request creates a fresh key, as a worker's would.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable

import aiohttp
import httpx
import uvloop

from bench.sandbox import start_sandbox
from devtools.embedded import free_port
from dispatcher.provider.client import traceparent
from dispatcher.provider.transport import Transport, json_body

BODY = {"orderId": "o-1", "amount": 5}
_keys = itertools.count()

Send = Callable[[str], Awaitable[int]]


def _headers(key: str) -> dict[str, str]:
    return {"Idempotency-Key": key, "traceparent": traceparent(key), "X-Tool-Call-Id": key}


async def _run(send: Send, requests: int, in_flight: int, tag: str) -> float:
    """CPU seconds per request of ``requests`` sends, ``in_flight`` at once."""

    async def burst(n: int) -> None:
        todo = iter(range(n))

        async def lane() -> None:
            for _ in todo:
                status = await send(f"{tag}:{next(_keys)}")
                assert status < 300, status

        await asyncio.gather(*(lane() for _ in range(in_flight)))

    await burst(4 * in_flight)  # warm: every connection open
    started = time.process_time()
    await burst(requests)
    return (time.process_time() - started) / requests


async def transport_cpu(url: str, requests: int, in_flight: int) -> float:
    async with Transport(in_flight) as transport:

        async def send(key: str) -> int:
            reply = await transport.send(
                "POST", url, headers=_headers(key), body=json_body(BODY), timeout_seconds=10
            )
            return reply.status

        return await _run(send, requests, in_flight, "transport")


async def httpx_pools_cpu(url: str, requests: int, in_flight: int) -> float:
    """httpx as ProviderClient used it: pools of 2, each request borrowing a free slot."""
    limits = httpx.Limits(max_connections=2, max_keepalive_connections=2, keepalive_expiry=2.0)
    clients = [httpx.AsyncClient(limits=limits) for _ in range((in_flight + 1) // 2)]
    free: asyncio.Queue[httpx.AsyncClient] = asyncio.Queue()
    for i in range(in_flight):
        free.put_nowait(clients[i % len(clients)])

    async def send(key: str) -> int:
        http = await free.get()
        try:
            response = await http.post(url, json=BODY, headers=_headers(key), timeout=10)
            return response.status_code
        finally:
            free.put_nowait(http)

    try:
        return await _run(send, requests, in_flight, "httpx")
    finally:
        for client in clients:
            await client.aclose()


async def aiohttp_cpu(url: str, requests: int, in_flight: int) -> float:
    connector = aiohttp.TCPConnector(limit=in_flight)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def send(key: str) -> int:
            async with session.post(url, json=BODY, headers=_headers(key)) as response:
                await response.read()
                return response.status

        return await _run(send, requests, in_flight, "aiohttp")


async def main(args: argparse.Namespace) -> None:
    port = free_port()
    sandbox = await start_sandbox(port)
    url = f"http://127.0.0.1:{port}/v1/requests"
    try:
        ours = await transport_cpu(url, args.requests, args.in_flight)
        pools = await httpx_pools_cpu(url, args.requests, args.in_flight)
        bare = await aiohttp_cpu(url, args.requests, args.in_flight)
    finally:
        sandbox.terminate()
        await sandbox.wait()
    loop = "uvloop" if args.uvloop else "asyncio"
    print(f"{args.requests} requests, {args.in_flight} in flight, {loop} loop, CPU per request:")
    print(f"  provider transport (aiohttp, one pool) {ours * 1e6:8.0f} µs")
    print(f"  httpx in pools of 2                    {pools * 1e6:8.0f} µs")
    print(f"  bare aiohttp (floor)                   {bare * 1e6:8.0f} µs")
    print(f"  ratio transport / httpx pools of 2     {ours / pools:8.2f}")
    print(f"  ratio transport / bare aiohttp         {ours / bare:8.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--in-flight", type=int, default=64)
    parser.add_argument("--uvloop", action="store_true", help="run on uvloop, as the services do")
    arguments = parser.parse_args()
    (uvloop.run if arguments.uvloop else asyncio.run)(main(arguments))
