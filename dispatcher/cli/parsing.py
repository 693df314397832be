"""Command-line plumbing shared by every subcommand: one-line argument errors, the
registry a service needs, and one signal loop."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import NoReturn

from dispatcher.capabilities import CapabilityRegistry, load_registry
from dispatcher.settings import Settings


class OneLineArgumentParser(argparse.ArgumentParser):
    """Bad input ends with exit code 2 and one line on stderr, not a usage dump."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def fail(message: str, code: int = 2) -> NoReturn:
    """One line on stderr, then exit (2: the invocation is wrong; 1: the world is)."""
    print(f"tool-dispatcher: error: {message}", file=sys.stderr)
    raise SystemExit(code)


def require_registry(settings: Settings) -> CapabilityRegistry:
    """The registry a service runs with. There is no default: a service that fell back
    to the sandbox registry would send real requests to a local test server."""
    if settings.capabilities_file is None:
        fail("TOOL_DISPATCHER_CAPABILITIES_FILE is not set (the capability registry)")
    try:
        return load_registry(settings.capabilities_file)
    except ValueError as exc:
        fail(str(exc).splitlines()[0])


async def until_signal(run: Callable[[asyncio.Event], Awaitable[None]]) -> int:
    """Run until SIGTERM/SIGINT sets the stop event; work in flight finishes first."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await run(stop)
    return 0
