"""Every event the system writes matches its JSON Schema in ``docs/events``, in the log
and on the events topic (every event but the log-only ones, ``LOG_ONLY``), and every
run's view folded from its log agrees with the recorded state of its calls.

One scenario drives each writer of events for real: intake, approvals (granted,
rejected, expired), dispatch by the executor against the sandbox provider, crash
recovery, the redrive of a lost command, reconciler settlement and escalation,
compensation of a stopped run's call, an operator's acknowledgement and retry.
"""

from __future__ import annotations

import asyncio
import json

import pytest
import yaml
from jsonschema import Draft202012Validator, FormatChecker
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from devtools.chaos.checker import unfenced
from devtools.sandbox import SandboxServer
from dispatcher.capabilities import CapabilityRegistry
from dispatcher.control import approvals, escalations, runs
from dispatcher.control import retry as control
from dispatcher.control.actor import Actor
from dispatcher.db.tables import execution_events, outbox, tool_calls
from dispatcher.ledger.events import LOG_ONLY, EventType, envelope
from dispatcher.provider.client import ProviderClient
from dispatcher.provider.transport import Transport
from dispatcher.schemas import DecisionRequest, EventView, Finding, RetryRequest
from dispatcher.settings import DEFAULT_TOPICS
from dispatcher.states import EscalationStatus
from dispatcher.states import ExecutionStatus as S
from dispatcher.tenancy import ordering_key
from dispatcher.views import queues
from dispatcher.views.run_view import fold_run
from dispatcher.worker.executor import Executor
from dispatcher.worker.recovery import recover_expired
from dispatcher.worker.redrive import redrive_stale
from tests.fixtures.calls import expire_leases, make_due, submit_call, unknown_call
from tests.fixtures.capabilities import every_kind
from tests.fixtures.paths import REPO
from tests.fixtures.reconciling import new_reconciler, until_settled
from tests.fixtures.rows import approval_of

pytestmark = pytest.mark.postgres

DOCS = REPO / "docs"
Sessions = async_sessionmaker[AsyncSession]
BOB = Actor("bob", "acme", "test")


def validators() -> dict[str, Draft202012Validator]:
    found = {}
    for path in sorted((DOCS / "events").glob("*.json")):
        schema = json.loads(path.read_text())
        Draft202012Validator.check_schema(schema)
        assert schema["title"] == path.stem
        found[path.stem] = Draft202012Validator(schema, format_checker=FormatChecker())
    return found


def test_every_event_type_has_a_schema_and_asyncapi_names_them() -> None:
    schemas = validators()
    assert sorted(schemas) == sorted(e.value for e in EventType)
    spec = yaml.safe_load((DOCS / "asyncapi.yaml").read_text())
    assert spec["asyncapi"].startswith("3.")
    referenced = {
        m["payload"]["$ref"]
        for m in spec["components"]["messages"].values()
        if "$ref" in m.get("payload", {})
    }
    assert {f"./events/{name}.json" for name in schemas if name not in LOG_ONLY} <= referenced
    assert {"commands", "events", "escalations"} <= set(spec["channels"])
    # The events topic lists what is published on it: not the log-only types, whose
    # schemas describe them in the log (the API's events list).
    on_topic = {
        spec["components"]["messages"][m["$ref"].rsplit("/", 1)[-1]]["name"]
        for m in spec["channels"]["events"]["messages"].values()
    }
    assert on_topic.isdisjoint(LOG_ONLY)
    assert {e.value for e in EventType} - LOG_ONLY <= on_topic


@pytest.fixture
def registry(sandbox: SandboxServer) -> CapabilityRegistry:
    return every_kind(sandbox.url)


async def scenario(
    sessions: Sessions, registry: CapabilityRegistry, http: Transport, sandbox_url: str
) -> None:
    executor = Executor(
        sessions, registry, ProviderClient(http), worker_id="w", topics=DEFAULT_TOPICS
    )

    async def decide(call: str, verdict: str) -> None:
        apr = (await approval_of(sessions, call))["approval_id"]
        async with sessions() as session, session.begin():
            await approvals.decide(
                session, apr, DecisionRequest(decision=verdict, reason="checked"),  # type: ignore[arg-type]
                actor=BOB, scopes={"approve"}, tenant="acme", registry=registry,
            )  # fmt: skip

    # Approvals: granted then dispatched, rejected, expired.
    granted = await submit_call(sessions, registry, "approve-me", {"n": 1}, run_id="run-a")
    await decide(granted, "approve")
    assert await executor.execute(granted, "acme") is S.COMPLETED
    await decide(
        await submit_call(sessions, registry, "approve-me", {"n": 2}, run_id="run-a"), "reject"
    )
    await submit_call(sessions, registry, "approve-fast", {"n": 3}, run_id="run-a")
    await asyncio.sleep(0.1)
    async with sessions() as session, session.begin():
        assert len(await approvals.expire_due(session)) == 1

    # Dispatch: a definitive failure, retried by an operator with a new key.
    failed = await submit_call(sessions, registry, "send", {"simulate": "fail"}, run_id="run-b")
    assert await executor.execute(failed, "acme") is S.FAILED
    async with sessions() as session, session.begin():
        await control.retry_call(
            session, failed, RetryRequest(reason="transient", new_idempotency_key=True),
            tenant="acme", actor=BOB, registry=registry,
        )  # fmt: skip
    assert await executor.execute(failed, "acme") is S.FAILED
    pending = await submit_call(
        sessions, registry, "refund", {"simulate": "pending", "pendingLookups": 1}, run_id="run-b"
    )
    assert await executor.execute(pending, "acme") is S.ACCEPTED

    # Recovery: a read-only call and a side-effecting one whose worker died.
    ro = await submit_call(sessions, registry, "lookup", {"n": 5}, run_id="run-c")
    se = await submit_call(sessions, registry, "send", {"n": 6}, run_id="run-c")
    assert (
        await executor.claim(ro, "acme") is not None
        and await executor.claim(se, "acme") is not None
    )
    await expire_leases(sessions)
    await recover_expired(sessions, registry, topics=DEFAULT_TOPICS)
    assert await executor.execute(ro, "acme") is S.COMPLETED

    # Redrive: an authorized call whose published command the broker then lost.
    lost = await submit_call(sessions, registry, "send", {"n": 7}, run_id="run-c")
    long_ago = text("now() - interval '2 minutes'")
    async with sessions() as session, session.begin():
        await session.execute(
            outbox.update()
            .where(outbox.c.key == ordering_key("acme", lost))
            .values(published_at=long_ago, created_at=long_ago)
        )
        await session.execute(
            tool_calls.update().where(tool_calls.c.tool_call_id == lost).values(updated_at=long_ago)
        )
    assert await redrive_stale(sessions, topics=DEFAULT_TOPICS, older_than_seconds=60) == [lost]
    assert await executor.execute(lost, "acme") is S.COMPLETED

    # Reconciler: confirmation, escalation (cannot be looked up), compensation of a
    # stopped run's call.
    await unknown_call(
        sessions, registry, http, sandbox_url, "refund", "k-ok", {"kind": "drop_after_apply"}
    )
    blind = await unknown_call(
        sessions, registry, http, sandbox_url, "refund-blind", "k-blind",
        {"kind": "drop_after_apply"},
    )  # fmt: skip
    undo = await unknown_call(
        sessions, registry, http, sandbox_url, "refund", "k-undo", {"kind": "drop_after_apply"},
        call_input={"n": 9},
    )  # fmt: skip
    async with sessions() as session, session.begin():
        await session.execute(
            tool_calls.update().where(tool_calls.c.tool_call_id == undo).values(run_id="run-d")
        )
    await submit_call(sessions, registry, "send", {"n": 10}, run_id="run-d")
    async with sessions() as session, session.begin():
        stopped = await runs.stop_run(
            session, tenant="acme", run_id="run-d", actor=BOB, reason="abort", registry=registry
        )
    assert stopped.compensation_requested == [undo] and len(stopped.cancelled) == 1
    await make_due(sessions)
    await until_settled(new_reconciler(sessions, registry, http))

    # The escalation: acknowledged, then resolved by an operator.
    async with sessions() as session:
        opened = await queues.list_escalations(session, status=EscalationStatus.OPEN)
    # The blind call cannot be looked up; neither can the "send" call recovery left unknown.
    [open_one] = [e for e in opened if e.tool_call_id == blind]
    async with sessions() as session, session.begin():
        await escalations.acknowledge(session, open_one.escalation_id, actor=BOB)
    async with sessions() as session, session.begin():
        await escalations.resolve(
            session, open_one.escalation_id, finding=Finding.CONFIRMED_FAILURE,
            reason="provider says no", actor=BOB,
        )  # fmt: skip


async def test_every_event_written_matches_its_schema_and_folds_to_the_state(
    sessions: Sessions,
    registry: CapabilityRegistry,
    http: Transport,
    sandbox: SandboxServer,
) -> None:
    await scenario(sessions, registry, http, sandbox.url)
    schemas = validators()

    async with sessions() as session:
        rows = [
            dict(r._mapping)
            for r in await session.execute(
                select(execution_events).order_by(execution_events.c.seq)
            )
        ]
        published = [
            dict(r._mapping)
            for r in await session.execute(
                # tests.reconcile_support.unknown_call's executor publishes on "events".
                select(outbox)
                .where(outbox.c.topic.in_([DEFAULT_TOPICS.events, "events"]))
                .order_by(outbox.c.id)
            )
        ]
        calls = {r.tool_call_id: r._mapping for r in await session.execute(select(tool_calls))}

    seen = {row["event_type"] for row in rows}
    # The scenario really produced the facts this test is about.
    assert seen >= {e.value for e in EventType} - {"tool.call.rejected"}, {
        e.value for e in EventType
    } - seen
    problems = []
    for row in rows:
        body = envelope(row)
        validator = schemas.get(row["event_type"])
        if validator is None:
            problems.append(f"no schema for {row['event_type']}")
            continue
        problems += [f"log {row['event_type']}: {e.message}" for e in validator.iter_errors(body)]
    for message in published:
        body = message["payload"]
        assert message["headers"]["ce_type"] == body["eventType"]
        assert message["headers"]["ce_id"] == body["eventId"]
        validator = schemas.get(body["eventType"])
        if validator is None:
            problems.append(f"no schema for {body['eventType']}")
            continue
        problems += [f"topic {body['eventType']}: {e.message}" for e in validator.iter_errors(body)]
    assert problems == []
    # Every event in the log is on the topic too, but those of the log-only types.
    assert sorted(m["payload"]["eventId"] for m in published) == sorted(
        r["event_id"] for r in rows if r["event_type"] not in LOG_ONLY
    )
    assert LOG_ONLY <= seen

    by_run: dict[str, list[EventView]] = {}
    for row in rows:
        by_run.setdefault(row["run_id"], []).append(EventView.of(row))
    folded = {}
    for run_id, events in by_run.items():
        for call in fold_run(run_id, events).tool_calls:
            folded[call.tool_call_id] = (call.status.value, call.verification_status.value)
    recorded = {k: (c["status"], c["verification_status"]) for k, c in calls.items()}
    assert folded == recorded

    # Each move out of a claim (an outcome, a takeover) names the claim it ends, as the
    # claim's event named it: what the chaos checker's fencing invariant reads.
    assert unfenced([(row["tenant"], EventView.of(row)) for row in rows]) == []
