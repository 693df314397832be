"""One call whose request cannot be built never aborts a reconcile pass: it gets its
own honest evidence, and the other calls of the pass settle (real PostgreSQL and the
real sandbox)."""

from __future__ import annotations

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from devtools.registries import registry_of
from devtools.sandbox import SandboxServer
from dispatcher.capabilities import CapabilityRegistry
from dispatcher.control.compensation import request_compensation
from dispatcher.provider.client import ProviderClient
from dispatcher.provider.transport import Transport
from dispatcher.settings import DEFAULT_TOPICS
from dispatcher.worker.executor import Executor
from tests.fixtures.calls import insert_unknown_calls, submit_call
from tests.fixtures.capabilities import reconcile_capability
from tests.fixtures.reconciling import new_reconciler, until_settled
from tests.fixtures.rows import call_row, escalation_rows, events_of

pytestmark = pytest.mark.postgres

Sessions = async_sessionmaker[AsyncSession]
# Header values are ASCII: a key like this cannot be sent as one.
UNSENDABLE_KEY = "ключ"


@pytest.fixture
def registry(sandbox: SandboxServer) -> CapabilityRegistry:
    return registry_of(
        reconcile_capability("refund", sandbox.url),
        reconcile_capability("refund-locked", sandbox.url),
    )


async def test_a_resend_that_cannot_be_built_fails_alone(
    sessions: Sessions, registry: CapabilityRegistry, http: Transport
) -> None:
    # Never arrived at the provider (lookup by key: 404), so each is sent again.
    good_a, good_b, bad = await insert_unknown_calls(
        sessions, ["k-iso-a", "k-iso-b", UNSENDABLE_KEY], "refund"
    )

    await until_settled(new_reconciler(sessions, registry, http))

    for call in (good_a, good_b):
        row = await call_row(sessions, call)
        assert (row["status"], row["verification_status"]) == ("confirmed", "confirmed_success")
    row = await call_row(sessions, bad)
    assert row["status"] == "failed"
    assert row["last_error"] == "request not sendable: UnicodeEncodeError; nothing was sent"
    assert row["lease_owner"] is None
    assert await escalation_rows(sessions) == []  # no "worker_lost" for a call never sent


async def test_a_compensation_that_cannot_be_built_is_escalated_with_that_evidence(
    sessions: Sessions, registry: CapabilityRegistry, http: Transport
) -> None:
    # An effect the provider really applied, to be undone: its request id is known.
    done = await submit_call(sessions, registry, "refund", {"n": 1}, key="k-iso-done")
    executor = Executor(
        sessions, registry, ProviderClient(http), worker_id="worker-a", topics=DEFAULT_TOPICS
    )
    await executor.execute(done, "acme")
    external_id = (await call_row(sessions, done))["external_request_id"]
    [bad] = await insert_unknown_calls(
        sessions, [UNSENDABLE_KEY], "refund", external_ids={UNSENDABLE_KEY: external_id}
    )
    [good] = await insert_unknown_calls(sessions, ["k-iso-resend"], "refund")
    async with sessions() as session, session.begin():
        assert await request_compensation(
            session, bad, tenant="acme", reason="run stopped", producer="tool-dispatcher.operator"
        )

    await until_settled(new_reconciler(sessions, registry, http))

    row = await call_row(sessions, good)
    assert (row["status"], row["verification_status"]) == ("confirmed", "confirmed_success")
    [escalation] = await escalation_rows(sessions)
    assert escalation["tool_call_id"] == bad
    why = "compensation: request could not be built (UnicodeEncodeError); nothing was sent"
    assert escalation["reason"] == f"the compensation failed: {why}"


async def test_a_lookup_that_cannot_be_built_leaves_its_call_due(
    sessions: Sessions, registry: CapabilityRegistry, http: Transport
) -> None:
    [good] = await insert_unknown_calls(sessions, ["k-iso-open"], "refund")
    [locked] = await insert_unknown_calls(sessions, ["k-iso-locked"], "refund-locked")
    # A credential no header can carry: every request of that capability
    # fails to build, the lookup included.
    reconciler = new_reconciler(sessions, registry, http, secrets={"refund-locked": "sécret"})

    tally = await reconciler.run_pass()

    assert tally.counts == {"redispatched": 1, "retry_later": 1}
    row = await call_row(sessions, good)
    assert (row["status"], row["verification_status"]) == ("confirmed", "confirmed_success")
    row = await call_row(sessions, locked)
    assert (row["status"], row["reconciliation_status"]) == ("result_unknown", "pending")
    assert row["next_reconcile_at"] is not None
    error = "lookup: request could not be built (UnicodeEncodeError); nothing was sent"
    assert row["last_error"] == error
    assert "sécret" not in str(await events_of(sessions, locked))
