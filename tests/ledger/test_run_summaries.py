"""Each run's summary counts exactly its calls by status, after every kind of move: the
summary is held against a fresh ``GROUP BY`` over ``tool_calls`` after each step of a
workload that drives every writer for real (intake, approvals granted, rejected and
expired, the executor against the sandbox provider, an operator's retry, crash
recovery, the reconciler's confirmations, escalations and compensations, a stop, an
escalation resolved), then after a seeded random mix of the same."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from devtools.sandbox import SandboxServer
from dispatcher.capabilities import CapabilityRegistry
from dispatcher.control import approvals, escalations, runs
from dispatcher.control import retry as control
from dispatcher.control.actor import Actor
from dispatcher.db.tables import approvals as approvals_table
from dispatcher.db.tables import run_summaries, tool_calls
from dispatcher.errors import DispatcherError, RunStopped
from dispatcher.intake.service import submit_many
from dispatcher.ledger import summaries
from dispatcher.provider.client import ProviderClient
from dispatcher.provider.transport import Transport
from dispatcher.schemas import DecisionRequest, Finding, RetryRequest, SubmitRequest
from dispatcher.settings import DEFAULT_TOPICS
from dispatcher.states import EscalationStatus
from dispatcher.states import ExecutionStatus as S
from dispatcher.views import queues
from dispatcher.worker.executor import Executor
from dispatcher.worker.recovery import recover_expired
from tests.fixtures.calls import expire_leases, make_due
from tests.fixtures.capabilities import every_kind
from tests.fixtures.reconciling import new_reconciler, until_settled
from tests.fixtures.sandbox import add_fault, at_provider
from tests.fixtures.summaries import assert_summaries_exact

pytestmark = pytest.mark.postgres

Sessions = async_sessionmaker[AsyncSession]
BOB = Actor("bob", "acme", "test")


@pytest.fixture
def registry(sandbox: SandboxServer) -> CapabilityRegistry:
    return every_kind(sandbox.url)


class Workload:
    """The writers of a workload, each called as the service calls it."""

    def __init__(
        self, sessions: Sessions, registry: CapabilityRegistry, http: Transport, sandbox_url: str
    ) -> None:
        self.sessions, self.registry, self.http = sessions, registry, http
        self.sandbox_url = sandbox_url
        self.executor = Executor(
            sessions, registry, ProviderClient(http), worker_id="w", topics=DEFAULT_TOPICS
        )

    async def submit(
        self,
        *items: tuple[str, str, str, dict[str, object]],
        key: str | None = None,
        refused: type[DispatcherError] | None = None,
    ) -> list[str]:
        """``(tenant, run, capability, input)`` each, in ONE intake statement; the
        created calls' ids (an item refused with ``refused`` is left out)."""
        async with self.sessions() as session, session.begin():
            outcomes = await submit_many(
                session,
                [
                    (
                        SubmitRequest(
                            run_id=run, capability_id=cap, input=data, idempotency_key=key
                        ),
                        tenant,
                    )
                    for tenant, run, cap, data in items
                ],
                registry=self.registry,
            )
        ids = []
        for outcome in outcomes:
            if refused is not None and isinstance(outcome, refused):
                continue
            assert not isinstance(outcome, DispatcherError), outcome
            ids.append(outcome.view.tool_call_id)
        return ids

    async def decide(self, tenant: str, call: str, verdict: str) -> None:
        async with self.sessions() as session, session.begin():
            approval_id = await session.scalar(
                select(approvals_table.c.approval_id).where(
                    approvals_table.c.tenant == tenant, approvals_table.c.tool_call_id == call
                )
            )
            assert approval_id is not None
            await approvals.decide(
                session, approval_id, DecisionRequest(decision=verdict, reason="checked"),
                actor=Actor("bob", tenant, "test"), scopes={"approve"}, tenant=tenant,
                registry=self.registry,
            )  # fmt: skip

    async def authorized(self) -> list[tuple[str, str]]:
        async with self.sessions() as session:
            rows = await session.execute(
                select(tool_calls.c.tenant, tool_calls.c.tool_call_id).where(
                    tool_calls.c.status == S.AUTHORIZED.value
                )
            )
            return [(t, c) for t, c in rows]

    async def run_all(self) -> None:
        """Every authorized call, a batch at a time: one claim and one record
        statement per batch, over many runs and tenants at once."""
        while pending := await self.authorized():
            await self.executor.execute_many(pending)

    async def unknown(self, run: str, key: str) -> str:
        """A refund whose answer the provider drops: left ``result_unknown``."""
        await add_fault(
            self.sandbox_url,
            {
                "kind": "drop_after_apply",
                "idempotencyKey": at_provider(key),
                "method": "POST",
                "times": 1,
            },
        )
        [call] = await self.submit(("acme", run, "refund", {"n": key}), key=key)
        assert await self.executor.execute(call, "acme") is S.RESULT_UNKNOWN
        return call

    async def stop(self, tenant: str, run: str) -> None:
        async with self.sessions() as session, session.begin():
            await runs.stop_run(
                session, tenant=tenant, run_id=run, actor=Actor("bob", tenant, "test"),
                reason="abort", registry=self.registry,
            )  # fmt: skip

    async def reconcile(self) -> None:
        await make_due(self.sessions)
        await until_settled(new_reconciler(self.sessions, self.registry, self.http))


async def test_every_kind_of_move_keeps_each_summary_exact(
    sessions: Sessions, registry: CapabilityRegistry, http: Transport, sandbox: SandboxServer
) -> None:
    w = Workload(sessions, registry, http, sandbox.url)

    async def step(name: str, action: Callable[[], Awaitable[object]]) -> None:
        await action()
        await assert_summaries_exact(sessions, when=f"after {name}")

    # Intake: one statement over two tenants that share a run id, several runs.
    granted, rejected, lapsing, failing, ro, se, pending, queued, theirs = await w.submit(
        ("acme", "run-a", "approve-me", {"n": 1}),
        ("acme", "run-a", "approve-me", {"n": 2}),
        ("acme", "run-a", "approve-fast", {"n": 3}),
        ("acme", "run-b", "send", {"simulate": "fail"}),
        ("acme", "run-c", "lookup", {"n": 5}),
        ("acme", "run-c", "send", {"n": 6}),
        ("acme", "run-b", "refund", {"simulate": "pending", "pendingLookups": 1}),
        ("acme", "run-d", "approve-me", {"n": 8}),
        ("globex", "run-a", "send", {"n": 9}),
    )
    await assert_summaries_exact(sessions, when="after intake")

    # Approvals: granted, rejected, expired.
    await step("an approval", lambda: w.decide("acme", granted, "approve"))
    await step("a rejection", lambda: w.decide("acme", rejected, "reject"))
    await asyncio.sleep(0.1)

    async def expire() -> None:
        async with sessions() as session, session.begin():
            assert len(await approvals.expire_due(session)) == 1

    await step("an expiry", expire)

    # Claims (point A) by the executor, then crash recovery of a dead worker's two.
    async def claim_and_die() -> None:
        assert await w.executor.claim(ro, "acme") is not None
        assert await w.executor.claim(se, "acme") is not None

    await step("claims", claim_and_die)
    await expire_leases(sessions)
    await step("recovery", lambda: recover_expired(sessions, registry, topics=DEFAULT_TOPICS))

    # Outcomes: completed, failed, accepted, in batches over runs and tenants.
    await step("outcomes", w.run_all)

    async def retry(call: str) -> None:
        async with sessions() as session, session.begin():
            await control.retry_call(
                session, call, RetryRequest(reason="transient", new_idempotency_key=True),
                tenant="acme", actor=BOB, registry=registry,
            )  # fmt: skip

    await step("an operator's retry", lambda: retry(failing))
    await step("the retried call's outcome", w.run_all)

    # The reconciler: a confirmation (by key), an escalation (no lookup possible), the
    # accepted call settled, and a stopped run's call compensated.
    await w.unknown("run-e", "k-ok")
    blind_key = "k-blind"
    await add_fault(
        sandbox.url,
        {
            "kind": "drop_after_apply",
            "idempotencyKey": at_provider(blind_key),
            "method": "POST",
            "times": 1,
        },
    )
    [blind] = await w.submit(("acme", "run-e", "refund-blind", {"n": 11}), key=blind_key)
    assert await w.executor.execute(blind, "acme") is S.RESULT_UNKNOWN
    undo = await w.unknown("run-d", "k-undo")
    await assert_summaries_exact(sessions, when="after result_unknown outcomes")
    await step("a stop", lambda: w.stop("acme", "run-d"))
    await step("a stop of a run nobody has heard of", lambda: w.stop("acme", "run-nobody"))
    await step("reconciler passes", w.reconcile)

    async with sessions() as session:
        opened = await queues.list_escalations(session, status=EscalationStatus.OPEN)
        states = dict(
            (await session.execute(select(tool_calls.c.tool_call_id, tool_calls.c.status))).all()
        )
    assert states[undo] == S.COMPENSATED and states[queued] == S.CANCELLED
    assert states[lapsing] == S.CANCELLED and states[ro] == S.COMPLETED
    assert states[pending] == S.CONFIRMED and states[theirs] == S.COMPLETED
    [escalation] = [e for e in opened if e.tool_call_id == blind]

    async def resolve() -> None:
        async with sessions() as session, session.begin():
            await escalations.resolve(
                session, escalation.escalation_id, finding=Finding.CONFIRMED_FAILURE,
                reason="provider says no", actor=BOB,
            )  # fmt: skip

    await step("an escalation resolved", resolve)
    async with sessions() as session:
        stopped = await session.scalar(
            select(run_summaries.c.stopped_at).where(
                run_summaries.c.tenant == "acme", run_summaries.c.run_id == "run-nobody"
            )
        )
    assert stopped is not None


async def test_a_random_mix_of_moves_keeps_each_summary_exact(
    sessions: Sessions, registry: CapabilityRegistry, http: Transport, sandbox: SandboxServer
) -> None:
    w = Workload(sessions, registry, http, sandbox.url)
    rng = random.Random(20261204)
    kinds: list[tuple[str, dict[str, object]]] = [
        ("send", {}),
        ("send", {"simulate": "fail"}),
        ("lookup", {}),
        ("approve-me", {}),
        ("refund", {"simulate": "pending", "pendingLookups": 1}),
    ]
    for round_ in range(3):
        batch = []
        for n in range(rng.randint(5, 15)):
            cap, data = rng.choice(kinds)
            tenant = rng.choice(["acme", "globex"])
            batch.append((tenant, f"run-{rng.randint(1, 6)}", cap, {**data, "n": f"{round_}.{n}"}))
        # Several intake statements at once, some over the same runs.
        half = len(batch) // 2
        await asyncio.gather(
            w.submit(*batch[:half], refused=RunStopped), w.submit(*batch[half:], refused=RunStopped)
        )
        await assert_summaries_exact(sessions, when=f"after intake, round {round_}")
        async with sessions() as session:
            proposed = (
                await session.execute(
                    select(tool_calls.c.tenant, tool_calls.c.tool_call_id).where(
                        tool_calls.c.status == S.PROPOSED.value
                    )
                )
            ).all()
        for tenant, call in proposed:
            await w.decide(tenant, call, rng.choice(["approve", "reject"]))
        if round_ == 1:
            await w.stop(rng.choice(["acme", "globex"]), f"run-{rng.randint(1, 6)}")
        await assert_summaries_exact(sessions, when=f"after decisions, round {round_}")
        await w.run_all()
        await assert_summaries_exact(sessions, when=f"after outcomes, round {round_}")
        await w.reconcile()
        await assert_summaries_exact(sessions, when=f"after the reconciler, round {round_}")


async def test_retention_forgets_deleted_calls_and_a_run_left_with_none(
    sessions: Sessions, registry: CapabilityRegistry, http: Transport, sandbox: SandboxServer
) -> None:
    w = Workload(sessions, registry, http, sandbox.url)
    await w.submit(
        ("acme", "run-old", "send", {"n": 1}),
        ("acme", "run-old", "send", {"n": 2}),
        ("acme", "run-kept", "send", {"n": 3}),
        ("acme", "run-kept", "lookup", {"n": 4}),
    )
    await w.run_all()
    async with sessions() as session:
        before = await session.scalar(
            select(run_summaries.c.updated_at).where(run_summaries.c.run_id == "run-kept")
        )
    async with sessions() as session, session.begin():
        gone = (
            await session.execute(
                tool_calls.delete()
                .where(
                    tool_calls.c.run_id.in_(["run-old", "run-kept"]),
                    tool_calls.c.capability_id == "send",
                )
                .returning(tool_calls.c.run_id, tool_calls.c.status)
            )
        ).all()
        await summaries.forget_calls(session, "acme", [(r.run_id, r.status) for r in gone])
    counts = await assert_summaries_exact(sessions, when="after retention removed calls")
    assert counts == {("acme", "run-kept"): {"completed": 1}}
    async with sessions() as session:
        after = await session.scalar(
            select(run_summaries.c.updated_at).where(run_summaries.c.run_id == "run-kept")
        )
    assert after == before  # removing old calls is no change of the run


async def test_a_recount_repairs_what_a_writer_that_does_not_count_left(
    sessions: Sessions, registry: CapabilityRegistry, http: Transport, sandbox: SandboxServer
) -> None:
    w = Workload(sessions, registry, http, sandbox.url)
    await w.submit(*(("acme", f"run-{n % 3}", "send", {"n": n}) for n in range(9)))
    await w.stop("acme", "run-stopped-early")
    async with sessions() as session:
        created = dict(
            (
                await session.execute(select(run_summaries.c.run_id, run_summaries.c.created_at))
            ).all()
        )
    # As a process of the release before run_summaries would: moves nobody counts, and a
    # run that appears without a summary.
    async with sessions() as session, session.begin():
        await session.execute(
            tool_calls.update().where(tool_calls.c.run_id == "run-0").values(status="completed")
        )
        await session.execute(run_summaries.delete().where(run_summaries.c.run_id == "run-1"))
    with pytest.raises(AssertionError):
        await assert_summaries_exact(sessions)
    async with sessions() as session, session.begin():
        assert await summaries.recount(session) == 3
    await assert_summaries_exact(sessions, when="after a recount")
    async with sessions() as session:
        kept = dict(
            (
                await session.execute(select(run_summaries.c.run_id, run_summaries.c.created_at))
            ).all()
        )
    assert kept["run-0"] == created["run-0"] and "run-stopped-early" in kept
