"""Stopping a process: one signal helper, and the sleep every loop takes between its
steps, cut short when the process is asked to stop."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextmanager
def stop_on_signals(stop: asyncio.Event) -> Iterator[asyncio.Event]:
    """Set ``stop`` on SIGTERM or SIGINT while the block runs (on the running loop):
    work in flight finishes, then the process returns instead of dying mid-step."""
    loop = asyncio.get_running_loop()
    for signum in STOP_SIGNALS:
        loop.add_signal_handler(signum, stop.set)
    try:
        yield stop
    finally:
        for signum in STOP_SIGNALS:
            loop.remove_signal_handler(signum)


async def until_signal(run: Callable[[asyncio.Event], Awaitable[None]]) -> int:
    """Run ``run(stop)`` until SIGTERM or SIGINT sets ``stop``; exit status 0."""
    stop = asyncio.Event()
    with stop_on_signals(stop):
        await run(stop)
    return 0


async def sleep_unless(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep ``seconds`` or until ``stop`` is set; True when stopped."""
    if stop.is_set():
        return True
    try:
        await asyncio.wait_for(stop.wait(), timeout=seconds)
    except TimeoutError:
        return False
    return True
