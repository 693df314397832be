"""The growth benchmark's history is one the service could have written
(``bench/growth_fill.py``): every event matches its schema in ``docs/events``, in the
log and on the events topic; every run's log folds to its calls' recorded statuses; and
the main path's events carry exactly the payload fields the real worker writes. A
history fatter or leaner than the service's would misstate the bytes a call costs."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

import psycopg
import pytest
from jsonschema import Draft202012Validator, FormatChecker
from psycopg.rows import dict_row
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from bench.growth_fill import Shape, fill
from bench.growth_paths import HISTORY, LIVE
from devtools.registries import capability, registry_of
from devtools.sandbox import SandboxServer
from dispatcher.db.tables import execution_events
from dispatcher.intake.service import submit
from dispatcher.ledger.events import LOG_ONLY, envelope
from dispatcher.provider.client import ProviderClient
from dispatcher.provider.transport import Transport
from dispatcher.schemas import EventView, SubmitRequest
from dispatcher.settings import DEFAULT_TOPICS
from dispatcher.views.run_view import fold_run
from dispatcher.worker.executor import Executor

pytestmark = pytest.mark.postgres

CALLS = 2_000
EVENTS = Path(__file__).resolve().parents[2] / "docs" / "events"


@pytest.fixture
def history(database_url: str) -> str:
    fill(database_url, Shape(CALLS, days=2, chunk=700), history=True, say=lambda _: None)
    return database_url


def _validators() -> dict[str, Draft202012Validator]:
    return {
        p.stem: Draft202012Validator(json.loads(p.read_text()), format_checker=FormatChecker())
        for p in EVENTS.glob("*.json")
    }


def test_every_generated_event_matches_its_schema_in_the_log_and_on_the_topic(
    history: str,
) -> None:
    schemas = _validators()
    with psycopg.connect(history, row_factory=dict_row) as conn:
        events = conn.execute("SELECT * FROM execution_events ORDER BY seq").fetchall()
        messages = conn.execute(
            "SELECT payload FROM outbox WHERE topic = 'tool-dispatcher.events'"
        ).fetchall()
    problems = Counter(
        f"log {e['event_type']}: {error.message}"
        for e in events
        for error in schemas[e["event_type"]].iter_errors(envelope(e))
    )
    problems.update(
        f"topic {m['payload']['eventType']}: {error.message}"
        for m in messages
        for error in schemas[m["payload"]["eventType"]].iter_errors(m["payload"])
    )
    assert problems == Counter()
    assert messages, "the outbox holds the last day's messages"
    # The service writes no message for a log-only event: neither does the history.
    assert {m["payload"]["eventType"] for m in messages}.isdisjoint(LOG_ONLY)


def test_every_run_folds_to_its_calls_recorded_statuses_in_the_path_mix(history: str) -> None:
    with psycopg.connect(history, row_factory=dict_row) as conn:
        events = conn.execute("SELECT * FROM execution_events ORDER BY seq").fetchall()
        calls = conn.execute("SELECT * FROM tool_calls").fetchall()
        approvals = conn.execute("SELECT count(*) AS n FROM approvals").fetchone()
    by_run: dict[tuple[str, str], list[EventView]] = defaultdict(list)
    for e in events:
        by_run[(e["tenant"], e["run_id"])].append(EventView.of(e))
    folded = {
        (tenant, call.tool_call_id): (call.status.value, call.verification_status.value)
        for (tenant, run), log in by_run.items()
        for call in fold_run(run, log).tool_calls
    }
    recorded = {
        (c["tenant"], c["tool_call_id"]): (c["status"], c["verification_status"]) for c in calls
    }
    assert folded == recorded
    assert len(calls) == CALLS + sum(p.weight for p in LIVE)
    asked = sum(p.weight for p in HISTORY if p.approval) * CALLS // 1000
    assert approvals is not None and approvals["n"] == asked + sum(
        p.weight for p in LIVE if p.approval
    )


async def test_the_main_path_carries_the_payload_fields_the_service_writes(
    history: str, sessions: async_sessionmaker[AsyncSession], sandbox: SandboxServer
) -> None:
    """A call submitted and dispatched for real, beside the generated completed calls."""
    registry = registry_of(capability("send-email", sandbox.url))
    async with sessions() as session, session.begin():
        done = await submit(
            session,
            SubmitRequest(run_id="real-run", capability_id="send-email", input={"n": 1}),
            tenant="real",
            registry=registry,
        )
    async with Transport(4) as transport:
        executor = Executor(sessions, registry, ProviderClient(transport), worker_id="w",
                            topics=DEFAULT_TOPICS)  # fmt: skip
        await executor.execute(done.view.tool_call_id, "real")
    async with sessions() as session:
        rows = (await session.execute(select(execution_events))).mappings().all()
    keys: dict[tuple[bool, str], set[frozenset[str]]] = defaultdict(set)
    for row in rows:
        keys[(row["tenant"] == "real", row["event_type"])].add(frozenset(row["payload"]))
    for event_type in ("requested", "authorized", "dispatching", "completed"):
        real = keys[(True, f"tool.call.{event_type}")]
        assert len(real) == 1 and keys[(False, f"tool.call.{event_type}")] == real, event_type
