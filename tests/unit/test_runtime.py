"""Every long-running process runs on uvloop, through one helper (dispatcher.runtime.run).

The entry points are found in the source with :mod:`ast`: a process that started its
own loop (``asyncio.run``) would run on the standard loop, so only the helper may
start one, and ``python -m outbox_relay``, which sits below the dispatcher and cannot
import it, starts uvloop itself.
"""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import uvloop

from dispatcher import runtime
from dispatcher.settings import Settings
from tests.fixtures.paths import REPO

PACKAGES = ("dispatcher", "outbox_relay", "reconciler")
# Where a loop may be started, and with what.
ALLOWED = {
    ("dispatcher/runtime.py", "uvloop.run"): "the helper",
    ("dispatcher/runtime.py", "asyncio.run"): "the helper, TOOL_DISPATCHER_EVENT_LOOP=asyncio",
    ("outbox_relay/__main__.py", "uvloop.run"): "below the dispatcher: cannot use the helper",
    # The sync client runs in the caller's program, whose loop is the caller's choice.
    ("dispatcher/client/sync.py", "asyncio.Runner"): "not a service process",
}
LOOP_STARTERS = {"asyncio.run", "asyncio.Runner", "uvloop.run", "uvloop.new_event_loop"}


async def _loop_type() -> type[asyncio.AbstractEventLoop]:
    return type(asyncio.get_running_loop())


def test_the_helper_runs_on_uvloop_by_default() -> None:
    assert runtime.run(_loop_type()) is uvloop.Loop
    assert runtime.run(_loop_type(), Settings()) is uvloop.Loop


def test_the_setting_falls_back_to_the_standard_loop() -> None:
    loop_type = runtime.run(_loop_type(), Settings(event_loop="asyncio"))
    assert not issubclass(loop_type, uvloop.Loop)


def loop_starts(source: str) -> set[str]:
    """``module.function`` of every call in ``source`` that starts an event loop."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        owner = node.func.value
        if isinstance(owner, ast.Name) and f"{owner.id}.{node.func.attr}" in LOOP_STARTERS:
            found.add(f"{owner.id}.{node.func.attr}")
    return found


def test_loop_starts_are_found() -> None:
    assert loop_starts("import asyncio\nasyncio.run(main())\nx.run()") == {"asyncio.run"}


def test_no_process_starts_a_loop_but_through_the_helper() -> None:
    found = {
        (path.relative_to(REPO).as_posix(), call)
        for package in PACKAGES
        for path in Path(REPO, package).rglob("*.py")
        for call in loop_starts(path.read_text())
    }
    assert found - ALLOWED.keys() == set(), "start the loop with dispatcher.runtime.run"
    assert ALLOWED.keys() - found == set(), "an exception no longer needed: remove it"
