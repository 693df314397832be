"""What the reconciler does with a compensation, against the real sandbox and real
PostgreSQL: what a refused, unanswered or failed reversal leaves for a person, the
backoff and error it is retried with, what a done one records, and a reversal with no
known request id escalated without being sent."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from devtools.registries import registry_of
from devtools.sandbox import SandboxServer
from dispatcher.capabilities import CapabilityRegistry
from dispatcher.control.compensation import request_compensation
from dispatcher.provider.transport import Transport
from reconciler.due import claim_due
from reconciler.lookup import Answer, Observation
from reconciler.rulings import Escalation
from tests.fixtures.calls import insert_unknown_calls, unknown_call
from tests.fixtures.capabilities import reconcile_capability
from tests.fixtures.reconciling import new_reconciler, until_settled
from tests.fixtures.rows import call_row, escalation_rows, events_of
from tests.fixtures.sandbox import add_fault, at_provider, books

pytestmark = pytest.mark.postgres
REVERSAL = {"pathPrefix": "/v1/requests/", "method": "POST"}


@pytest.fixture
def registry(sandbox: SandboxServer) -> CapabilityRegistry:
    return registry_of(reconcile_capability("refund", sandbox.url, reconcile={"maxAttempts": 3}))


async def to_compensate(
    sessions: async_sessionmaker[AsyncSession],
    registry: CapabilityRegistry,
    http: Transport,
    sandbox: SandboxServer,
    key: str,
) -> str:
    """A call whose effect happened (its answer lost), whose compensation is requested."""
    call = await unknown_call(
        sessions, registry, http, sandbox.url, "refund", key, {"kind": "drop_after_apply"}
    )
    async with sessions() as session, session.begin():
        assert await request_compensation(
            session, call, tenant="acme", reason="run stopped", producer="tool-dispatcher.operator"
        )
    return call


def assert_dossier(evidence: dict[str, Any], status: int) -> None:
    """What the on-call engineer gets: the lookup, how to look again, the policy, and
    the reversal's own answer."""
    assert evidence["lastAnswer"]["via"] == "idempotencyKey"
    (url,) = [u for u in evidence["providerLookup"] if "/v1/requests/req_" in u]
    assert url.startswith("GET ")
    assert evidence["policy"]["maxAttempts"] == 3
    assert evidence["compensation"]["decision"] == "compensate"
    assert evidence["compensation"]["compensation"]["httpStatus"] == status


async def test_a_refused_reversal_is_escalated_with_its_answer(
    sessions: async_sessionmaker[AsyncSession],
    registry: CapabilityRegistry,
    sandbox: SandboxServer,
    http: Transport,
) -> None:
    call = await to_compensate(sessions, registry, http, sandbox, "k-refused")
    await add_fault(sandbox.url, {**REVERSAL, "kind": "error", "status": 409})

    tally = await new_reconciler(sessions, registry, http).run_pass()

    assert tally.counts == {"escalated": 1}
    assert (await call_row(sessions, call))["status"] == "escalated"
    (escalation,) = await escalation_rows(sessions)
    assert escalation["reason"].startswith("the compensation failed: compensation: HTTP 409")
    assert_dossier(escalation["evidence"], 409)


async def test_an_unanswered_reversal_is_retried_with_backoff_then_escalated(
    sessions: async_sessionmaker[AsyncSession],
    registry: CapabilityRegistry,
    sandbox: SandboxServer,
    http: Transport,
) -> None:
    call = await to_compensate(sessions, registry, http, sandbox, "k-unanswered")
    await add_fault(sandbox.url, {**REVERSAL, "kind": "error", "status": 503})

    tally = await until_settled(new_reconciler(sessions, registry, http))

    assert tally.counts == {"retry_later": 2, "escalated": 1}
    attempts = [
        e["payload"]
        for e in await events_of(sessions, call)
        if e["event_type"] == "tool.call.reconcile_attempted"
    ]
    assert [a["nextInSeconds"] for a in attempts] == [0.01, 0.02]
    assert all(a["compensation"]["compensation"] == "unknown" for a in attempts)
    assert (await call_row(sessions, call))["last_error"].startswith("compensation: HTTP 503")
    (escalation,) = await escalation_rows(sessions)
    assert escalation["reason"] == (
        "the compensation got no definitive answer; gave up after 3 attempt(s)"
    )
    assert_dossier(escalation["evidence"], 503)


async def test_a_reversal_that_raises_is_retried_as_unanswered(
    sessions: async_sessionmaker[AsyncSession],
    registry: CapabilityRegistry,
    sandbox: SandboxServer,
    http: Transport,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Something other than the transport failing mid-reversal (the lookup's own
    classification catches those): it may have been sent, so it is asked again."""
    call = await to_compensate(sessions, registry, http, sandbox, "k-raises")
    reconciler = new_reconciler(sessions, registry, http)

    async def broken(*_: Any, **__: Any) -> Any:
        raise RuntimeError("boom")

    monkeypatch.setattr(reconciler._lookup, "compensate", broken)
    tally = await reconciler.run_pass()

    assert tally.counts == {"retry_later": 1}
    row = await call_row(sessions, call)
    assert (row["status"], row["last_error"]) == ("result_unknown", "compensation: RuntimeError")
    (attempt,) = [
        e["payload"]
        for e in await events_of(sessions, call)
        if e["event_type"] == "tool.call.reconcile_attempted"
    ]
    assert attempt["compensation"] == {
        "compensation": "unknown",
        "httpStatus": None,
        "error": "compensation: RuntimeError",
    }
    assert attempt["nextInSeconds"] == 0.01


async def test_a_done_reversal_records_the_effect_the_reversal_and_its_evidence(
    sessions: async_sessionmaker[AsyncSession],
    registry: CapabilityRegistry,
    sandbox: SandboxServer,
    http: Transport,
) -> None:
    call = await to_compensate(sessions, registry, http, sandbox, "k-done")

    tally = await new_reconciler(sessions, registry, http).run_pass()

    assert tally.counts == {"compensated": 1}
    row = await call_row(sessions, call)
    assert row["result"]["effect"] == {"echo": {"n": 1}}
    assert row["result"]["reversal"]["reversalKey"] == f"compensate:{at_provider('k-done')}"
    assert row["external_request_id"].startswith("req_")  # found by key
    (done,) = [
        e["payload"]
        for e in await events_of(sessions, call)
        if e["event_type"] == "tool.call.compensated"
    ]
    assert done["compensation"]["compensation"] == "done"


async def test_a_reversal_with_no_known_request_id_is_escalated_unsent(
    sessions: async_sessionmaker[AsyncSession],
    registry: CapabilityRegistry,
    sandbox: SandboxServer,
    http: Transport,
) -> None:
    """The lookup said "done" but named no request: nothing to address a reversal to."""
    (call_id,) = await insert_unknown_calls(sessions, ["k-anon"], "refund")
    reconciler = new_reconciler(sessions, registry, http)
    async with sessions() as session, session.begin():
        (call,) = await claim_due(session, owner=reconciler.owner, limit=1, lease_seconds=60)
    answer = Answer(Observation.SUCCEEDED, "idempotencyKey", 200, result={"n": 1})
    before = await books(sandbox.url)

    escalation = await reconciler._compensate(
        call, registry.get("refund"), answer, {"decision": "compensate"}
    )

    assert isinstance(escalation, Escalation)
    assert escalation.call.tool_call_id == call_id
    assert escalation.reason == "compensation needed, but the provider's request id is unknown"
    assert escalation.dossier["lastAnswer"]["observation"] == "succeeded"
    assert escalation.dossier["policy"]["maxAttempts"] == 3
    assert [u for u in escalation.dossier["providerLookup"] if "k-anon" in u]
    assert await books(sandbox.url) == before  # no reversal was sent
