"""A TCP proxy between the workers and the provider that misbehaves on command.

Faults on the wire, where an HTTP-level fault cannot reach: ``stall`` forwards nothing
in either direction (requests already sent may or may not have arrived, answers hang);
``cut`` resets every open connection and refuses new ones; ``delay`` holds each chunk
before passing it on. ``pass`` is a plain proxy.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
from enum import StrEnum

log = logging.getLogger(__name__)

_CHUNK = 64 * 1024


class ProxyMode(StrEnum):
    PASS = "pass"  # noqa: S105 - a mode, not a password
    STALL = "stall"
    CUT = "cut"
    DELAY = "delay"


class TcpProxy:
    """Listens on ``host:port`` (0: a free port) and forwards to ``upstream``."""

    def __init__(
        self, upstream_host: str, upstream_port: int, *, host: str = "127.0.0.1", port: int = 0
    ) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.host = host
        self._requested_port = port
        self.mode = ProxyMode.PASS
        self.delay_seconds = 0.2
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the proxy is not started")
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, self.host, self._requested_port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self._reset_all()
            await self._server.wait_closed()
            self._server = None
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def set_mode(self, mode: ProxyMode, delay_seconds: float = 0.2) -> None:
        self.mode = mode
        self.delay_seconds = delay_seconds
        if mode is ProxyMode.STALL:
            self._flowing.clear()
        else:
            self._flowing.set()
        if mode is ProxyMode.CUT:
            self._reset_all()

    def _reset_all(self) -> None:
        for writer in list(self._writers):
            _reset(writer)
        self._writers.clear()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.mode is ProxyMode.CUT:
            _reset(writer)
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            _reset(writer)
            return
        self._writers.update((writer, up_writer))
        pumps = [
            asyncio.create_task(self._pump(reader, up_writer)),
            asyncio.create_task(self._pump(up_reader, writer)),
        ]
        self._tasks.update(pumps)
        try:
            # Either side closing ends the pair: HTTP/1.1 keep-alive has no half-close.
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in pumps:
                task.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            self._tasks.difference_update(pumps)
            for w in (writer, up_writer):
                self._writers.discard(w)
                w.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while True:
                data = await reader.read(_CHUNK)
                if not data:
                    return
                await self._flowing.wait()
                if self.mode is ProxyMode.DELAY:
                    await asyncio.sleep(self.delay_seconds)
                if self.mode is ProxyMode.CUT:
                    return
                writer.write(data)
                await writer.drain()


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP RST (SO_LINGER 0): the peer sees a reset, not a clean end."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.close()
