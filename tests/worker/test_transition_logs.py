"""Every status transition is one INFO line on ``tool_dispatcher.transitions``: a call
submitted and dispatched (real PostgreSQL, the real sandbox) writes exactly one line per
status change its events record, with the change and the call's ids as fields."""

from __future__ import annotations

import json
import logging

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from devtools.registries import capability, registry_of
from devtools.sandbox import SandboxServer
from dispatcher.capabilities import CapabilityRegistry
from dispatcher.logs import TRANSITIONS_LOGGER
from dispatcher.provider.client import ProviderClient
from dispatcher.provider.transport import Transport
from dispatcher.settings import DEFAULT_TOPICS
from dispatcher.states import ExecutionStatus as S
from dispatcher.worker.executor import Executor
from kit.logs import JsonLines
from tests.fixtures.calls import submit_call
from tests.fixtures.rows import event_payloads
from tests.fixtures.sandbox import add_fault

pytestmark = pytest.mark.postgres

Sessions = async_sessionmaker[AsyncSession]


@pytest.fixture
def registry(sandbox: SandboxServer) -> CapabilityRegistry:
    return registry_of(capability("refund", sandbox.url, timeout=0.5, attempts=1))


@pytest.fixture
def executor(sessions: Sessions, registry: CapabilityRegistry, http: Transport) -> Executor:
    return Executor(
        sessions, registry, ProviderClient(http, {}), worker_id="w-logs", topics=DEFAULT_TOPICS
    )


def transitions_of(caplog: pytest.LogCaptureFixture, call: str) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == TRANSITIONS_LOGGER and getattr(r, "tool_call_id", None) == call
    ]


def change(record: logging.LogRecord) -> tuple[str, str]:
    # "from" is a keyword: the record's fields by name.
    return (record.__dict__["from"], record.__dict__["to"])


async def changes_recorded(sessions: Sessions, call: str) -> list[tuple[str, str]]:
    """The status changes the call's events record (``from`` and ``to``)."""
    return [
        ("|".join(p["from"]), p["to"]) for p in await event_payloads(sessions, call) if "to" in p
    ]


async def test_a_dispatched_call_logs_one_line_per_status_change(
    sessions: Sessions,
    registry: CapabilityRegistry,
    executor: Executor,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=TRANSITIONS_LOGGER)
    call = await submit_call(sessions, registry, "refund", {"n": 1}, key="log:1", run_id="run-7")

    assert await executor.execute(call, "acme") is S.COMPLETED
    assert await executor.execute(call, "acme") is None  # a duplicate command moves nothing

    lines = transitions_of(caplog, call)
    expected = [("authorized", "dispatching"), ("dispatching", "completed")]
    assert [change(r) for r in lines] == expected
    assert await changes_recorded(sessions, call) == expected
    for record in lines:
        assert record.levelno == logging.INFO
        assert (record.tenant, record.run_id, record.capability_id) == ("acme", "run-7", "refund")  # type: ignore[attr-defined]
    assert lines[0].getMessage() == f"tool call {call} (refund): authorized -> dispatching"

    line = json.loads(JsonLines().format(lines[1]))
    assert {k: line[k] for k in ("level", "logger", "from", "to")} == {
        "level": "INFO",
        "logger": TRANSITIONS_LOGGER,
        "from": "dispatching",
        "to": "completed",
    }
    assert (line["tool_call_id"], line["run_id"], line["capability_id"]) == (
        call,
        "run-7",
        "refund",
    )


async def test_a_batch_logs_each_call_it_moved_once(
    sessions: Sessions,
    registry: CapabilityRegistry,
    executor: Executor,
    sandbox: SandboxServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One claim statement and one routed outcome statement for three calls: one of
    them loses its answer (result_unknown), the others complete."""
    caplog.set_level(logging.INFO, logger=TRANSITIONS_LOGGER)
    calls = [
        await submit_call(sessions, registry, "refund", {"n": n}, key=f"log:b{n}") for n in range(3)
    ]
    await add_fault(sandbox.url, {"kind": "timeout", "method": "POST", "times": 1})

    statuses = await executor.execute_many([("acme", call) for call in calls])

    assert sorted(s.value for s in statuses.values() if s is not None) == [
        "completed",
        "completed",
        "result_unknown",
    ]
    for call in calls:
        lines = transitions_of(caplog, call)
        changes = [change(r) for r in lines]
        assert changes == await changes_recorded(sessions, call)
        assert changes == [("authorized", "dispatching"), ("dispatching", statuses[("acme", call)])]
