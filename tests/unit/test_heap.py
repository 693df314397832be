"""A long-running process prepares its heap (kit.heap) before its event loop: the
cyclic collector never walks the imports' objects again, and leaves a batch's
short-lived objects to reference counting. One-shot commands leave the collector as it
is."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Coroutine
from typing import Any

import pytest

import outbox_relay.__main__ as relay_main
from tests.fixtures.paths import REPO
from tool_dispatcher import main as cli

FROZEN = """
import gc, weakref
from kit.heap import YOUNG_THRESHOLD, prepare_service_heap

class Node:
    pass

cycle = Node()
cycle.me = cycle
garbage = weakref.ref(cycle)
del cycle
kept = Node()
walked_before = any(o is kept for o in gc.get_objects())
older = gc.get_threshold()[1:]
prepare_service_heap()
walked_after = any(o is kept for o in gc.get_objects())
print(garbage() is None, walked_before, walked_after, gc.get_freeze_count() > 0, gc.isenabled())
print(gc.get_threshold() == (YOUNG_THRESHOLD, *older))

# Cyclic garbage made after startup is still collected, once the young generation
# holds that many containers.
late = Node()
late.me = late
late_ref = weakref.ref(late)
del late
young = [[] for _ in range(YOUNG_THRESHOLD // 2)]
collected_early = late_ref() is None
young += [[] for _ in range(YOUNG_THRESHOLD)]
print(collected_early, late_ref() is None)
"""


def test_startup_garbage_is_collected_and_what_survives_is_never_walked_again() -> None:
    # In a process of its own: freezing this one would freeze the test run's heap.
    out = subprocess.run(
        [sys.executable, "-c", FROZEN], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()

    assert out[:5] == ["True", "True", "False", "True", "True"]
    # The young generation is collected at the service threshold, the older ones as before.
    assert out[5] == "True"
    # A cycle made later is not collected by every 700 allocations, but it still is.
    assert out[6:] == ["False", "True"]


@pytest.fixture
def frozen(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The commands that prepared their heap; the commands themselves do nothing."""
    calls: list[str] = []
    monkeypatch.setattr(cli, "configure_logging", lambda settings, quiet=False: None)
    monkeypatch.setattr(cli, "prepare_service_heap", lambda: calls.append("frozen"))
    monkeypatch.setattr(cli, "_run", lambda args, settings: calls.append(args.command) or 0)
    return calls


# What each service command needs besides its name to parse.
ARGUMENTS = {"recover": ["--once"], "approvals": ["expire"]}


@pytest.mark.parametrize("command", sorted(cli.TRACED))
def test_every_service_process_prepares_its_heap_before_it_runs(
    frozen: list[str], command: str
) -> None:
    assert cli.main([command, *ARGUMENTS.get(command, [])]) == 0
    assert frozen == ["frozen", command]


def test_a_one_shot_command_leaves_the_collector_alone(frozen: list[str]) -> None:
    assert cli.main(["migrate", "--check"]) == 0
    assert frozen == ["migrate"]


def test_the_standalone_relay_prepares_its_heap_before_its_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[str] = []

    def loop(main: Coroutine[Any, Any, None]) -> None:
        main.close()
        calls.append("loop")

    monkeypatch.setattr(relay_main.logs, "configure", lambda *a, **k: None)
    monkeypatch.setattr(relay_main, "prepare_service_heap", lambda: calls.append("frozen"))
    monkeypatch.setattr(relay_main.uvloop, "run", loop)

    argv = ["--database-url", "postgresql://x/y", "--bootstrap", "127.0.0.1:9092"]
    assert relay_main.main(argv) == 0
    assert calls == ["frozen", "loop"]
