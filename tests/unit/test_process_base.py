"""What every process stands on is used, not rewritten: stopping on a signal goes through
:mod:`kit.signals`, and a process names itself (a lease owner) through
:mod:`kit.owners`. Found in the source with :mod:`ast`, in the product, the dev tooling
and the benchmarks alike: a hand-written handler or owner format is the one a later
change forgets (the chaos harness matched worker owners by a format of its own)."""

from __future__ import annotations

import ast
import os
import re

import pytest

from kit.owners import owner_id, owner_prefix
from outbox_relay.config import RelayConfig
from tests.fixtures.paths import REPO

PACKAGES = (
    "dispatcher", "outbox_relay", "reconciler", "kit", "tool_dispatcher", "devtools", "bench",
    "examples",
)  # fmt: skip
# Each helper's own module is where its one use lives.
HOMES = {"add_signal_handler": "kit/signals.py", "gethostname": "kit/owners.py"}


def calls_of(source: str, names: set[str]) -> set[str]:
    """The attribute names of ``names`` that ``source`` calls (``x.add_signal_handler``)."""
    return {
        node.func.attr
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in names
    }


def uses() -> set[tuple[str, str]]:
    return {
        (path.relative_to(REPO).as_posix(), call)
        for package in PACKAGES
        for path in sorted((REPO / package).rglob("*.py"))
        for call in calls_of(path.read_text(), set(HOMES))
    }


def test_the_calls_are_found() -> None:
    planted = "loop.add_signal_handler(s, stop.set)\nf'{socket.gethostname()}:{pid}'\n"
    assert calls_of(planted, set(HOMES)) == {"add_signal_handler", "gethostname"}


def test_signals_and_owner_names_go_through_the_kit() -> None:
    assert uses() == {(home, call) for call, home in HOMES.items()}


@pytest.mark.parametrize("kind", ["worker", "reconciler", "relay"])
def test_an_owner_names_its_kind_host_and_pid_uniquely(kind: str) -> None:
    first, second = owner_id(kind), owner_id(kind)
    assert first != second
    # What a supervisor matches a child's leases by (devtools/chaos/zombies.py).
    assert first.startswith(owner_prefix(kind, os.getpid()))
    assert re.fullmatch(rf"{kind}:[^:]+:{os.getpid()}:[0-9a-f]{{6}}", first), first


def test_a_relay_is_named_as_every_owner_unless_told() -> None:
    config = RelayConfig(database_url="postgresql://x/y", kafka_bootstrap="k:9092")
    assert config.relay_id.startswith(owner_prefix("relay", os.getpid()))
    named = RelayConfig(database_url="postgresql://x/y", kafka_bootstrap="k:9092", relay_id="r1")
    assert named.relay_id == "r1"


def consumer_stops(source: str) -> int:
    """How many ``<something consumer>.stop()`` calls ``source`` makes."""
    return sum(
        1
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "stop"
        and "consumer" in ast.unparse(node.func.value).lower()
    )


def test_consumers_are_stopped_through_the_kit() -> None:
    """``kit.kafka.stop_consumer`` finishes a close that aiokafka cuts short in an outage;
    a bare ``consumer.stop()`` there ends its caller's clean-up early. Benchmarks stop
    theirs with the broker up, and are left alone."""
    assert consumer_stops("await self._consumer.stop()\nawait producer.stop()\n") == 1
    found = {
        path.relative_to(REPO).as_posix(): n
        for package in PACKAGES
        if package != "bench"
        for path in sorted((REPO / package).rglob("*.py"))
        if (n := consumer_stops(path.read_text()))
    }
    assert found == {"kit/kafka.py": 1}
