"""Control commands over the real HTTP API and real PostgreSQL: stopping a run (queued
calls cancelled, new ones refused even when racing the stop, in-flight ones finish,
unknown ones compensated by policy) and retrying a call."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from devtools.sandbox import SandboxServer
from dispatcher.capabilities import CapabilityRegistry
from dispatcher.control.actor import Actor
from dispatcher.control.runs import stop_run
from dispatcher.db.tables import runs, tool_calls
from dispatcher.errors import RunStopped
from dispatcher.intake.service import submit
from dispatcher.provider.client import ProviderClient
from dispatcher.provider.transport import Transport
from dispatcher.schemas import SubmitRequest
from dispatcher.settings import DEFAULT_TOPICS
from dispatcher.states import ExecutionStatus as S
from dispatcher.worker.executor import Executor
from tests.fixtures.api import ALICE, OPERATOR, READER, bearer
from tests.fixtures.calls import insert_call, make_due, submit_call, unknown_call
from tests.fixtures.capabilities import approval_capability, plain_capability, reconcile_capability
from tests.fixtures.reconciling import new_reconciler, until_settled
from tests.fixtures.rows import (
    approval_of,
    call_row,
    dispatch_commands,
    event_payloads,
    event_types,
)
from tests.fixtures.sandbox import add_fault, at_provider, books
from tests.fixtures.waiting import eventually

pytestmark = pytest.mark.postgres

Sessions = async_sessionmaker[AsyncSession]
OPS = Actor("oncall", "acme", "test")


@pytest.fixture
def registry(sandbox: SandboxServer) -> CapabilityRegistry:
    url = sandbox.url
    caps = [
        approval_capability("refund-big", url),
        plain_capability("send", url),
        # A request timeout well above dispatch_slowly's latency.
        reconcile_capability("refund-undo", url, timeout=10.0).model_copy(
            update={"on_run_stopped": "compensate"}
        ),
        reconcile_capability("refund-keep", url),
    ]
    return CapabilityRegistry({c.id: c for c in caps})


# Backends of this test's database waiting for an advisory lock (a run's lock) that the
# given backend holds.
_WAITING_FOR_RUN_LOCK = text(
    "SELECT count(*) FROM pg_stat_activity"
    " WHERE datname = current_database()"
    " AND wait_event_type = 'Lock' AND wait_event = 'advisory'"
    " AND CAST(:holder AS integer) = ANY(pg_blocking_pids(pid))"
)


async def backend_pid(session: AsyncSession) -> int:
    """The PostgreSQL backend of ``session``'s open transaction."""
    pid: int = (await session.execute(text("SELECT pg_backend_pid()"))).scalar_one()
    return pid


async def blocked_on_run_lock(sessions: Sessions, holder: int, task: asyncio.Task[Any]) -> None:
    """Until some backend waits for the run lock ``holder`` holds. Fails if ``task``
    finishes first: it did not wait for the lock."""

    async def waiting() -> bool:
        async with sessions() as session:
            count = (await session.execute(_WAITING_FOR_RUN_LOCK, {"holder": holder})).scalar()
        if count:
            return True
        if task.done():
            outcome = task.exception() or task.result()
            raise AssertionError(f"finished without waiting for the run's lock: {outcome!r}")
        return False

    await eventually(waiting, what=f"a backend to wait for the run lock held by {holder}")


def library_submit(run_id: str, key: str) -> SubmitRequest:
    return SubmitRequest(run_id=run_id, capability_id="send", input={"k": key}, idempotency_key=key)


async def statuses(sessions: Sessions, run_id: str) -> dict[str, str]:
    async with sessions() as session:
        rows = await session.execute(
            select(tool_calls.c.tool_call_id, tool_calls.c.status).where(
                tool_calls.c.run_id == run_id
            )
        )
        return {r.tool_call_id: r.status for r in rows}


async def test_stop_cancels_queued_calls_and_refuses_new_ones(
    sessions: Sessions, registry: CapabilityRegistry, api: httpx.AsyncClient
) -> None:
    body = {"runId": "run-1", "capabilityId": "refund-big", "input": {"orderId": "o-1"}}
    proposed = (await api.post("/v1/tool-calls", json=body, headers=bearer(ALICE))).json()
    queued = (
        await api.post(
            "/v1/tool-calls",
            json={"runId": "run-1", "capabilityId": "send", "input": {"to": "x"}},
            headers=bearer(ALICE),
        )
    ).json()
    done = await insert_call(sessions, "completed")
    elsewhere = await submit_call(sessions, registry, "send", {"n": 2}, run_id="run-2")

    assert (
        await api.post("/v1/runs/run-1/stop", json={}, headers=bearer(READER))
    ).status_code == 403
    reply = await api.post(
        "/v1/runs/run-1/stop", json={"reason": "agent loops"}, headers=bearer(OPERATOR)
    )
    assert reply.status_code == 200, reply.text
    stopped = reply.json()
    assert stopped["alreadyStopped"] is False and stopped["reason"] == "agent loops"
    assert stopped["stoppedBy"] == "oncall@acme (api)"
    assert sorted(stopped["cancelled"]) == sorted([proposed["toolCallId"], queued["toolCallId"]])

    assert await statuses(sessions, "run-1") == {
        proposed["toolCallId"]: "cancelled",
        queued["toolCallId"]: "cancelled",
        done: "completed",
    }
    assert (await call_row(sessions, elsewhere))["status"] == "authorized"
    assert (await approval_of(sessions, proposed["toolCallId"]))["status"] == "cancelled"
    cancelled = (await event_payloads(sessions, queued["toolCallId"]))[-1]
    assert cancelled["runStopped"] is True and cancelled["reason"] == "agent loops"
    # The queued call's command is still in the outbox; its worker will find it cancelled.
    assert await dispatch_commands(sessions, queued["toolCallId"]) == 1

    refused = await api.post(
        "/v1/tool-calls",
        json={"runId": "run-1", "capabilityId": "send", "input": {"to": "y"}},
        headers=bearer(ALICE),
    )
    assert refused.status_code == 409
    assert refused.json()["code"] == "run_stopped"
    with pytest.raises(RunStopped):
        async with sessions() as session, session.begin():
            await submit(
                session, library_submit("run-1", "lib-1"), tenant="acme", registry=registry
            )
    # Another tenant's run of the same name is not stopped.
    async with sessions() as session, session.begin():
        await submit(session, library_submit("run-1", "lib-1"), tenant="globex", registry=registry)

    again = await api.post("/v1/runs/run-1/stop", json={}, headers=bearer(OPERATOR))
    assert again.status_code == 200
    assert again.json()["alreadyStopped"] is True and again.json()["cancelled"] == []
    view = (await api.get("/v1/runs/run-1", headers=bearer(OPERATOR))).json()
    assert view["stopped"] is True and view["canStop"] is False
    assert view["stopReason"] == "agent loops"


async def test_only_a_stop_writes_a_runs_row(
    sessions: Sessions, registry: CapabilityRegistry
) -> None:
    """Intake guards a run by its advisory lock alone: a row per new run is what cost
    the library intake its throughput."""
    for n in range(3):
        await submit_call(sessions, registry, "send", {"n": n}, run_id=f"run-{n}")
    async with sessions() as session:
        assert (await session.execute(select(runs.c.run_id))).all() == []
    async with sessions() as session, session.begin():
        await stop_run(
            session, tenant="acme", run_id="never-seen", actor=OPS, reason="", registry=registry
        )
    async with sessions() as session:
        assert (await session.execute(select(runs.c.run_id))).scalars().all() == ["never-seen"]
    with pytest.raises(RunStopped):
        await submit_call(sessions, registry, "send", {"n": 9}, run_id="never-seen")


async def test_a_submission_committing_before_the_stop_is_cancelled_by_it(
    sessions: Sessions, registry: CapabilityRegistry
) -> None:
    async with sessions() as intake:
        await intake.begin()
        made = await submit(
            intake, library_submit("run-r", "early"), tenant="acme", registry=registry
        )
        holder = await backend_pid(intake)

        async def stop() -> list[str]:
            async with sessions() as session, session.begin():
                outcome = await stop_run(
                    session, tenant="acme", run_id="run-r", actor=OPS, reason="", registry=registry
                )
            return outcome.cancelled

        stopping = asyncio.create_task(stop())
        await blocked_on_run_lock(sessions, holder, stopping)  # it waits for the open intake
        assert not stopping.done()
        await intake.commit()
    assert await stopping == [made.view.tool_call_id]
    assert (await call_row(sessions, made.view.tool_call_id))["status"] == "cancelled"


async def test_a_submission_racing_an_uncommitted_stop_is_refused(
    sessions: Sessions, registry: CapabilityRegistry
) -> None:
    await submit_call(sessions, registry, "send", {"n": 1}, run_id="run-r")  # the run exists
    async with sessions() as stopper:
        await stopper.begin()
        await stop_run(
            stopper, tenant="acme", run_id="run-r", actor=OPS, reason="", registry=registry
        )
        holder = await backend_pid(stopper)

        async def late() -> None:
            async with sessions() as session, session.begin():
                await submit(
                    session, library_submit("run-r", "late"), tenant="acme", registry=registry
                )

        submitting = asyncio.create_task(late())
        await blocked_on_run_lock(sessions, holder, submitting)  # intake waits for the stop
        assert not submitting.done()
        await stopper.commit()
    with pytest.raises(RunStopped):
        await submitting
    # And a brand-new run stopped concurrently with its first submission.
    async with sessions() as stopper:
        await stopper.begin()
        await stop_run(
            stopper, tenant="acme", run_id="run-new", actor=OPS, reason="", registry=registry
        )
        holder = await backend_pid(stopper)
        submitting = asyncio.create_task(late_first("run-new", sessions, registry))
        await blocked_on_run_lock(sessions, holder, submitting)
        assert not submitting.done()
        await stopper.commit()
    with pytest.raises(RunStopped):
        await submitting
    assert set((await statuses(sessions, "run-r")).values()) == {"cancelled"}
    assert await statuses(sessions, "run-new") == {}


async def late_first(run_id: str, sessions: Sessions, registry: CapabilityRegistry) -> None:
    async with sessions() as session, session.begin():
        await submit(session, library_submit(run_id, "first"), tenant="acme", registry=registry)


async def test_concurrent_submissions_and_a_stop_leave_nothing_queued(
    sessions: Sessions, registry: CapabilityRegistry
) -> None:
    async def one(i: int) -> str:
        await asyncio.sleep(0.002 * i)
        try:
            async with sessions() as session, session.begin():
                await submit(
                    session, library_submit("run-c", f"c-{i}"), tenant="acme", registry=registry
                )
        except RunStopped:
            return "refused"
        return "accepted"

    async def stop() -> str:
        await asyncio.sleep(0.02)
        async with sessions() as session, session.begin():
            await stop_run(
                session, tenant="acme", run_id="run-c", actor=OPS, reason="", registry=registry
            )
        return "stopped"

    outcomes = await asyncio.gather(*(one(i) for i in range(30)), stop())
    accepted = outcomes.count("accepted")
    assert accepted + outcomes.count("refused") == 30
    left = await statuses(sessions, "run-c")
    assert len(left) == accepted
    assert set(left.values()) <= {"cancelled"}


async def dispatch_slowly(
    sessions: Sessions,
    registry: CapabilityRegistry,
    http: Transport,
    sandbox_url: str,
    capability: str,
    key: str,
    run_id: str,
) -> tuple[str, asyncio.Task[S | None]]:
    """A call whose provider takes its time, caught while its request is held by the
    provider (so it is ``dispatching``, and stays so for a few seconds)."""
    await add_fault(
        sandbox_url,
        {"kind": "latency", "latencyMs": 3000, "idempotencyKey": at_provider(key), "times": 1},
    )
    call = await submit_call(sessions, registry, capability, {"n": 1}, key=key, run_id=run_id)
    executor = Executor(
        sessions,
        registry,
        ProviderClient(http),
        worker_id="w",
        topics=DEFAULT_TOPICS,
    )
    running = asyncio.create_task(executor.execute(call, "acme"))

    async def received() -> bool:
        if running.done():
            outcome = running.exception() or running.result()
            raise AssertionError(f"{call} ended before the stop: {outcome!r}")
        return bool((await books(sandbox_url))["received"].get(at_provider(key)) == 1)

    await eventually(received, what=f"the sandbox to receive {call}'s request")
    assert (await call_row(sessions, call))["status"] == "dispatching"
    return call, running


async def test_an_in_flight_call_finishes_and_is_recorded_after_the_stop(
    sessions: Sessions,
    registry: CapabilityRegistry,
    sandbox: SandboxServer,
    http: Transport,
) -> None:
    call, running = await dispatch_slowly(
        sessions, registry, http, sandbox.url, "send", "slow", "run-f"
    )
    async with sessions() as session, session.begin():
        outcome = await stop_run(
            session, tenant="acme", run_id="run-f", actor=OPS, reason="", registry=registry
        )
    assert outcome.cancelled == [] and outcome.in_flight == [call]
    assert outcome.compensation_requested == []  # "send" keeps its effect
    assert await running is S.COMPLETED
    assert (await call_row(sessions, call))["status"] == "completed"


async def test_stop_asks_to_compensate_unknown_calls_whose_capability_says_so(
    sessions: Sessions,
    registry: CapabilityRegistry,
    sandbox: SandboxServer,
    http: Transport,
) -> None:
    undo = await unknown_call(
        sessions, registry, http, sandbox.url, "refund-undo", "k-undo",
        {"kind": "drop_after_apply"}, call_input={"n": 1},
    )  # fmt: skip
    keep = await unknown_call(
        sessions, registry, http, sandbox.url, "refund-keep", "k-keep",
        {"kind": "drop_after_apply"}, call_input={"n": 2},
    )  # fmt: skip
    async with sessions() as session, session.begin():
        outcome = await stop_run(
            session, tenant="acme", run_id="run-1", actor=OPS, reason="wrong customer",
            registry=registry,
        )  # fmt: skip
    assert outcome.compensation_requested == [undo]
    assert sorted(outcome.in_flight) == sorted([undo, keep])
    assert (await call_row(sessions, undo))["compensation_requested_at"] is not None
    assert (await call_row(sessions, keep))["compensation_requested_at"] is None
    assert "tool.call.compensation_requested" in await event_types(sessions, undo)

    await until_settled(new_reconciler(sessions, registry, http))
    assert (await call_row(sessions, undo))["status"] == "compensated"
    kept = await call_row(sessions, keep)
    assert (kept["status"], kept["verification_status"]) == ("confirmed", "confirmed_success")


async def test_retry_from_failed_and_escalated_only(
    sessions: Sessions, api: httpx.AsyncClient
) -> None:
    failed = await insert_call(sessions, "failed", last_error="HTTP 400")
    escalated = await insert_call(
        sessions, "escalated", verification_status="inconclusive", reconciliation_status="escalated"
    )
    unknown = await insert_call(sessions, "result_unknown", reconciliation_status="pending")
    completed = await insert_call(sessions, "completed")
    ask = {"reason": "provider fixed the bug"}

    def retry(call: str, key: str = OPERATOR, body: dict[str, Any] = ask) -> Any:
        return api.post(f"/v1/tool-calls/{call}/retry", json=body, headers=bearer(key))

    assert (await retry(failed, ALICE)).status_code == 403
    refused = await retry(unknown)
    assert refused.status_code == 409 and refused.json()["code"] == "retry_not_allowed"
    assert "reconciler" in refused.json()["detail"]
    assert refused.json()["currentStatus"] == "result_unknown"
    assert (await retry(completed)).json()["code"] == "retry_not_allowed"
    assert (await retry(failed, body={})).json()["code"] == "validation_failed"

    before = (await call_row(sessions, failed))["idempotency_key"]
    ok = await retry(failed)
    assert ok.status_code == 200, ok.text
    assert ok.json()["status"] == "authorized" and ok.json()["idempotencyKey"] == before
    retried = (await event_payloads(sessions, failed))[-1]
    assert retried["by"] == {"name": "oncall", "tenant": "acme", "via": "api"}
    assert retried["reason"] == ask["reason"] and retried["newIdempotencyKey"] is False
    assert await dispatch_commands(sessions, failed) == 1
    # Now authorized: a second retry is refused with the reason.
    assert (await retry(failed)).json()["code"] == "retry_not_allowed"

    fresh = await retry(escalated, body={**ask, "newIdempotencyKey": True})
    assert fresh.status_code == 200, fresh.text
    row = await call_row(sessions, escalated)
    assert row["status"] == "authorized" and row["reconciliation_status"] == "not_needed"
    assert row["idempotency_key"] != f"key-{escalated}"
    assert row["idempotency_key"].startswith(f"{escalated}:retry:")
    payload = (await event_payloads(sessions, escalated))[-1]
    assert payload["previousIdempotencyKey"] == f"key-{escalated}"
    assert payload["idempotencyKey"] == row["idempotency_key"]


async def test_retry_in_a_stopped_run_is_refused(
    sessions: Sessions, api: httpx.AsyncClient
) -> None:
    failed = await insert_call(sessions, "failed", run_id="run-s")
    await api.post("/v1/runs/run-s/stop", json={}, headers=bearer(OPERATOR))
    reply = await api.post(
        f"/v1/tool-calls/{failed}/retry", json={"reason": "x"}, headers=bearer(OPERATOR)
    )
    assert reply.status_code == 409 and reply.json()["code"] == "run_stopped"
    assert (await call_row(sessions, failed))["status"] == "failed"


async def test_an_in_flight_call_that_succeeds_after_the_stop_is_compensated(
    sessions: Sessions,
    registry: CapabilityRegistry,
    sandbox: SandboxServer,
    http: Transport,
) -> None:
    call, running = await dispatch_slowly(
        sessions, registry, http, sandbox.url, "refund-undo", "late", "run-late"
    )
    async with sessions() as session, session.begin():
        outcome = await stop_run(
            session, tenant="acme", run_id="run-late", actor=OPS, reason="", registry=registry
        )
    assert outcome.in_flight == [call] and outcome.compensation_requested == [call]

    # The provider's success arrives after the stop: the call waits for the reconciler
    # instead of ending as `completed`, and the reconciler undoes the effect.
    assert await running is S.ACCEPTED
    row = await call_row(sessions, call)
    assert (row["status"], row["reconciliation_status"]) == ("accepted", "pending")
    await make_due(sessions)
    await until_settled(new_reconciler(sessions, registry, http))
    assert (await call_row(sessions, call))["status"] == "compensated"
    counts = await books(sandbox.url)
    assert counts["effects"] == {at_provider("late"): 1}
    assert counts["reversals"] == {at_provider("late"): 1}
