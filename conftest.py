"""The suite's fixtures live in ``tests/fixtures`` (one plugin per concern), for the
tests in ``tests/`` and the benchmarks' own in ``bench/tests``; each test is marked
with the folder it lives in, so ``pytest -m unit`` runs the pure unit tests
and ``pytest -m "not process"`` leaves out the tests that start processes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from hypothesis import settings

# No wall-clock limit on an example: a test never holds one, and an example that talks
# to PostgreSQL on a busy machine can take longer than hypothesis's default 200 ms.
settings.register_profile("suite", deadline=None)
settings.load_profile("suite")

pytest_plugins = [
    "tests.fixtures.services",
    "tests.fixtures.sandbox",
    "tests.fixtures.capabilities",
    "tests.fixtures.api",
    "tests.fixtures.stack",
    "tests.fixtures.otlp",
    "tests.fixtures.browser",
    "tests.fixtures.metrics",
    "tests.fixtures.history",
]

TESTS = Path(__file__).resolve().parent / "tests"
BENCH_TESTS = TESTS.parent / "bench" / "tests"
# A test folder is a concept; its name is the marker of every test in it.
FOLDERS = (
    "unit",
    "ledger",
    "intake",
    "bus",
    "worker",
    "control",
    "reconciler",
    "retention",
    "relay",
    "sandbox",
    "client",
    "process",
    "console",
    "deploy",
    "webhooks",
)
# Fixtures that reach a server outside the test's own process.
SERVICES = {"pg_server_url", "kafka_bootstrap"}


class _NoImplicitLoopPolicy(asyncio.DefaultEventLoopPolicy):
    """Python 3.11's policy makes a new event loop out of thin air whenever
    ``get_event_loop()`` is called in the main thread with none set, as pytest-asyncio
    does after a test ran ``asyncio.run``; nobody closes that loop, and when the
    garbage collector finds it during a later test, its ResourceWarnings fail that test
    (``filterwarnings = error``). Python 3.12 stops making them; this does so now."""

    def get_event_loop(self) -> asyncio.AbstractEventLoop:
        if self._local._loop is None:  # type: ignore[attr-defined]
            raise RuntimeError("no current event loop in this thread")
        return super().get_event_loop()


def pytest_configure(config: pytest.Config) -> None:
    asyncio.set_event_loop_policy(_NoImplicitLoopPolicy())


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(BENCH_TESTS):
            # The benchmarks' own tests live beside them (bench/tests).
            item.add_marker("bench")
            continue
        folder = item.path.relative_to(TESTS).parts[0]
        if folder not in FOLDERS:
            continue
        item.add_marker(folder)
        servers = SERVICES & set(getattr(item, "fixturenames", ()))
        if folder == "unit" and servers:
            raise pytest.UsageError(
                f"{item.nodeid} needs a server ({', '.join(sorted(servers))}): a unit test"
                " may not; move it to the folder of its concept"
            )
