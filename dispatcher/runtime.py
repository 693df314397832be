"""How every long-running process of the service runs its event loop: :func:`run`.

uvloop by default: the service's CPU goes into the event loop's own bookkeeping
(sockets, timers, callbacks) as much as into its code, and uvloop does that part in C.
psycopg's async connections and aiokafka run on it unchanged. ``event_loop="asyncio"``
(``TOOL_DISPATCHER_EVENT_LOOP``) falls back to the standard loop, to tell a uvloop
problem from any other.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import uvloop

from dispatcher.settings import EventLoop, Settings

T = TypeVar("T")


def run(main: Coroutine[Any, Any, T], settings: Settings | None = None) -> T:
    """Run ``main`` to completion on a new event loop of the kind ``settings`` choose
    (uvloop without settings: the sandbox, which reads only its arguments)."""
    kind: EventLoop = "uvloop" if settings is None else settings.event_loop
    if kind == "uvloop":
        return uvloop.run(main)
    return asyncio.run(main)
