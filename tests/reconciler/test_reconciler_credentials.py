"""The provider credential on the reconciler's failure paths: lookups that fail (HTTP
errors, timeouts), compensations that fail, re-sends whose answer is lost. Their
errors reach ``last_error``, events, the outbox and escalation evidence; the secret
must reach none of them, nor a log line."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from devtools.registries import registry_of
from devtools.sandbox import SandboxServer
from dispatcher.capabilities import CapabilityRegistry
from dispatcher.control.compensation import request_compensation
from dispatcher.provider.client import ProviderClient
from dispatcher.provider.transport import Transport
from dispatcher.settings import DEFAULT_TOPICS
from dispatcher.states import ExecutionStatus as S
from dispatcher.worker.executor import Executor
from tests.fixtures.calls import make_due, submit_call
from tests.fixtures.capabilities import reconcile_capability
from tests.fixtures.reconciling import new_reconciler, until_settled
from tests.fixtures.rows import assert_secret_nowhere, call_row, escalation_rows
from tests.fixtures.sandbox import add_fault, at_provider

pytestmark = pytest.mark.postgres

SECRET = "sk_live_do-not-leak-reconciler-77e0"
KEY = "refund:r-1"
SENT = at_provider(KEY)  # the key the sandbox receives for acme's call
SECRETS = {"refund": SECRET}


@pytest.fixture
def registry(sandbox: SandboxServer) -> CapabilityRegistry:
    return registry_of(
        reconcile_capability(
            "refund", sandbox.url, lookup_timeout=0.2, reconcile={"maxAttempts": 2}
        )
    )


def lookups(fault: dict[str, Any]) -> list[dict[str, Any]]:
    return [{**fault, "method": "GET", "idempotencyKey": SENT}]


# The faults after the lost first answer, whether compensation is requested, the
# status the call ends in and the error its escalation names (None: not escalated).
PATHS: dict[str, tuple[list[dict[str, Any]], bool, str, str | None]] = {
    "lookup answers 500": (
        lookups({"kind": "error", "status": 500}),
        False,
        "escalated",
        "lookup: HTTP 500",
    ),
    "lookup times out": (
        lookups({"kind": "latency", "latencyMs": 1000}),
        False,
        "escalated",
        "lookup: SocketTimeoutError",
    ),
    "compensation fails": (
        [
            {"kind": "error", "status": 500, "idempotencyKey": f"compensate:{SENT}", "times": 1},
            {"kind": "error", "status": 422, "idempotencyKey": f"compensate:{SENT}"},
        ],
        True,
        "escalated",
        "compensation: HTTP 422 rejected",
    ),
    "re-send's answer lost": (
        [{"kind": "drop_before_apply", "method": "POST", "idempotencyKey": SENT, "times": 1}],
        False,
        "confirmed",
        None,
    ),
}


@pytest.mark.parametrize("path", list(PATHS))
async def test_no_reconciler_failure_path_stores_or_logs_the_secret(
    sessions: async_sessionmaker[AsyncSession],
    registry: CapabilityRegistry,
    sandbox: SandboxServer,
    http: Transport,
    caplog: pytest.LogCaptureFixture,
    path: str,
) -> None:
    caplog.set_level(logging.DEBUG)
    faults, compensate, final, error = PATHS[path]
    # The first answer is lost: applied (a compensation has something to undo) unless
    # the re-send is the point.
    lost = "drop_after_apply" if error else "drop_before_apply"
    first = {"kind": lost, "method": "POST", "idempotencyKey": SENT, "times": 1}
    await add_fault(sandbox.url, first)
    call = await submit_call(sessions, registry, "refund", {"n": 1}, key=KEY)
    worker = Executor(
        sessions, registry, ProviderClient(http, SECRETS), worker_id="w", topics=DEFAULT_TOPICS
    )
    assert await worker.execute(call, "acme") is S.RESULT_UNKNOWN
    await make_due(sessions)
    if compensate:
        async with sessions() as session, session.begin():
            await request_compensation(
                session,
                call,
                tenant="acme",
                reason="run stopped",
                producer="tool-dispatcher.operator",
            )
    await add_fault(sandbox.url, faults)

    await until_settled(new_reconciler(sessions, registry, http, secrets=SECRETS))

    row = await call_row(sessions, call)
    assert row["status"] == final
    if error is None:
        assert row["dispatch_attempts"] == 3  # the first send, the lost re-send, one more
    else:
        [escalation] = await escalation_rows(sessions)
        assert error in escalation["reason"] or error == escalation["evidence"]["lastError"]
    await assert_secret_nowhere(sessions, caplog, SECRET)
