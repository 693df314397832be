"""Tenants that share a provider account never share an idempotency key there: three
tenants refunding the same order under the same correlation id get three effects (or
a refusal where a tenant's own key was reused with another body), and each reads its
own result. A call recorded before keys named the tenant keeps the key the provider
already knows it by."""

from __future__ import annotations

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from devtools.registries import capability, registry_of
from devtools.sandbox import SandboxServer
from dispatcher.capabilities import CapabilityRegistry
from dispatcher.intake.service import submit
from dispatcher.provider.client import ProviderClient
from dispatcher.provider.contract import Credentials
from dispatcher.provider.transport import Transport
from dispatcher.schemas import SubmitRequest
from dispatcher.settings import DEFAULT_TOPICS
from dispatcher.states import ExecutionStatus as S
from dispatcher.tenancy import provider_key
from dispatcher.worker.executor import Executor
from tests.fixtures.calls import insert_unknown_calls
from tests.fixtures.capabilities import reconcile_capability
from tests.fixtures.reconciling import new_reconciler, until_settled
from tests.fixtures.rows import call_row
from tests.fixtures.sandbox import books, create_at_sandbox

pytestmark = pytest.mark.postgres

Sessions = async_sessionmaker[AsyncSession]
TEMPLATE = "refund:{input.orderId}:{correlationId}"


@pytest.fixture
def registry(sandbox: SandboxServer) -> CapabilityRegistry:
    return registry_of(
        capability("refund-order", sandbox.url, idempotencyKeyTemplate=TEMPLATE),
        # An account of each tenant's own: keys go as the tenant wrote them.
        capability(
            "refund-own-account",
            sandbox.url,
            idempotencyKeyTemplate=TEMPLATE,
            providerAccount="per_tenant",
            providerKeys="as_written",
        ),
        reconcile_capability("refund", sandbox.url),
    )


async def refund(
    sessions: Sessions, registry: CapabilityRegistry, tenant: str, cap: str, amount: int
) -> str:
    request = SubmitRequest(
        run_id="run-1",
        tool_call_id="tc-shared",
        capability_id=cap,
        correlation_id="intent-9",
        input={"orderId": "o-1", "amount": amount},
    )
    async with sessions() as session, session.begin():
        submitted = await submit(session, request, tenant=tenant, registry=registry)
    return submitted.view.tool_call_id


def executor(sessions: Sessions, registry: CapabilityRegistry, http: Transport) -> Executor:
    credentials = Credentials(
        tenants={t: {"refund-own-account": f"secret-{t}"} for t in ("acme", "globex")}
    )
    return Executor(
        sessions,
        registry,
        ProviderClient(http, credentials),
        worker_id="worker-a",
        topics=DEFAULT_TOPICS,
    )


async def test_three_tenants_refunding_one_order_get_their_own_effects_and_results(
    sessions: Sessions, registry: CapabilityRegistry, sandbox: SandboxServer, http: Transport
) -> None:
    worker = executor(sessions, registry, http)
    amounts = {"acme": 10, "globex": 10, "initech": 25}
    for tenant, amount in amounts.items():
        call = await refund(sessions, registry, tenant, "refund-order", amount)
        assert await worker.execute(call, tenant) is S.COMPLETED

    key = "refund:o-1:intent-9"
    assert (await books(sandbox.url))["effects"] == {provider_key(t, key): 1 for t in amounts}
    rows = {t: await call_row(sessions, "tc-shared", tenant=t) for t in amounts}
    for tenant, row in rows.items():
        assert row["idempotency_key"] == key
        # Not stored twice: NULL is the namespaced form, which the provider received.
        assert row["provider_key"] is None
        assert row["result"] == {"echo": {"orderId": "o-1", "amount": amounts[tenant]}}
    assert len({row["external_request_id"] for row in rows.values()}) == len(amounts)


async def test_an_own_account_sends_the_key_as_written_under_the_tenants_credential(
    sessions: Sessions, registry: CapabilityRegistry, sandbox: SandboxServer, http: Transport
) -> None:
    worker = executor(sessions, registry, http)
    call = await refund(sessions, registry, "acme", "refund-own-account", 10)
    assert await worker.execute(call, "acme") is S.COMPLETED
    assert (await books(sandbox.url))["effects"] == {"refund:o-1:intent-9": 1}

    # A tenant without a credential of its own is never sent under another account.
    other = await refund(sessions, registry, "hooli", "refund-own-account", 10)
    assert await worker.execute(other, "hooli") is S.FAILED
    row = await call_row(sessions, other, tenant="hooli")
    assert row["last_error"] == "request not sendable: NoTenantCredential; nothing was sent"
    assert (await books(sandbox.url))["received"] == {"refund:o-1:intent-9": 1}


async def test_a_call_recorded_before_keys_named_the_tenant_keeps_its_key(
    sessions: Sessions, registry: CapabilityRegistry, sandbox: SandboxServer, http: Transport
) -> None:
    # As migration 0009 leaves them: the provider key is the bare key each was sent with.
    landed, lost = "refund:o-7:intent-1", "refund:o-8:intent-1"
    external = await create_at_sandbox(sandbox.url, [landed])
    calls = await insert_unknown_calls(sessions, [landed, lost], "refund")

    await until_settled(new_reconciler(sessions, registry, http))

    found, resent = [await call_row(sessions, call) for call in calls]
    # Looked up by its old key, and found; the other sent again with its old key.
    assert (found["status"], found["external_request_id"]) == ("confirmed", external[landed])
    assert resent["status"] == "confirmed"
    counts = await books(sandbox.url)
    assert counts["effects"] == {landed: 1, lost: 1}
    assert set(counts["received"]) == {landed, lost}
