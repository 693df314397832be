"""Approvals, runs and retries through the console over plain HTTP: what the pages show
is what the API says, and each action is the API's own command (its events, its
refusals), shown as a page."""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest
from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.capabilities import CapabilityRegistry
from dispatcher.db.tables import tool_calls
from dispatcher.settings import Settings
from tests.console.test_console_http import csrf_of, signed_in
from tests.fixtures.api import ALICE, BOB, OPERATOR, READER, bearer, control_keys
from tests.fixtures.capabilities import approval_capability, plain_capability
from tests.fixtures.rows import event_payloads

pytestmark = pytest.mark.postgres
Sessions = async_sessionmaker[AsyncSession]


@pytest.fixture
def api_settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"api_keys": control_keys(), "console_secure_cookie": False})


@pytest.fixture
def registry() -> CapabilityRegistry:
    caps = [
        approval_capability("refund-big"),
        approval_capability("refund-four-eyes", forbidSelfApproval=True),
        plain_capability("send"),
    ]
    return CapabilityRegistry({c.id: c for c in caps})


async def submit(api: httpx.AsyncClient, cap: str, run: str = "run-c") -> dict[str, Any]:
    body = {"runId": run, "capabilityId": cap, "input": {"orderId": "<b>o-1</b>"}}
    reply = await api.post("/v1/tool-calls", json=body, headers=bearer(ALICE))
    assert reply.status_code == 201, reply.text
    view: dict[str, Any] = reply.json()
    return view


def shown(html: str, name: str) -> str:
    found = re.search(rf'data-testid="{name}"[^>]*>([^<]*)<', html)
    assert found is not None, name
    return found.group(1)


async def test_the_approval_page_binds_the_hash_and_the_first_decision_wins(
    api_url: str, api: httpx.AsyncClient
) -> None:
    call = await submit(api, "refund-big")
    approval = call["approval"]["approvalId"]
    [listed] = (await api.get("/v1/approvals", headers=bearer(BOB))).json()["approvals"]
    bob = await signed_in(api_url, BOB)
    inbox = await bob.get("/console/approvals")
    assert inbox.text.count('data-testid="approval-row"') == 1
    assert shown(inbox.text, "nav-approvals-count") == "1"
    page = await bob.get(f"/console/approvals/{approval}")
    assert shown(page.text, "input-hash") == listed["inputHash"]
    assert shown(page.text, "policy-version") == str(listed["policyVersion"])
    assert "&lt;b&gt;o-1&lt;/b&gt;" in page.text
    form = {"csrf": csrf_of(page.text), "decision": "approve", "reason": "ok"}
    first = await bob.post(f"/console/approvals/{approval}/decision", data=form)
    assert first.status_code == 303
    again = await bob.post(f"/console/approvals/{approval}/decision", data=form)
    assert again.status_code == 409
    assert 'data-code="approval_already_decided"' in again.text
    decided = await bob.get(f"/console/approvals/{approval}")
    assert shown(decided.text, "decided-by").startswith("approve by bob")
    assert "Approve</button>" not in decided.text
    view = (await api.get(f"/v1/tool-calls/{call['toolCallId']}", headers=bearer(BOB))).json()
    assert view["status"] == "authorized"
    await bob.aclose()


async def test_the_submitter_is_not_offered_the_decision_and_cannot_force_it(
    api_url: str, api: httpx.AsyncClient
) -> None:
    # Where the capability allows self-approval, the submitter is offered it.
    allowed = await submit(api, "refund-big")
    alice = await signed_in(api_url, ALICE)
    page = await alice.get(f"/console/approvals/{allowed['approval']['approvalId']}")
    assert "Approve</button>" in page.text
    await alice.aclose()
    call = await submit(api, "refund-four-eyes")
    approval = call["approval"]["approvalId"]
    alice = await signed_in(api_url, ALICE)
    page = await alice.get(f"/console/approvals/{approval}")
    assert "cannot approve it" in page.text and "Approve</button>" not in page.text
    form = {"csrf": csrf_of(page.text), "decision": "approve", "reason": "mine"}
    forced = await alice.post(f"/console/approvals/{approval}/decision", data=form)
    assert forced.status_code == 403
    assert 'data-code="self_approval_forbidden"' in forced.text
    await alice.aclose()


async def test_stopping_a_run_asks_first_then_cancels_its_queued_call(
    api_url: str, api: httpx.AsyncClient, sessions: Sessions
) -> None:
    call = await submit(api, "refund-big", run="run-stop")
    operator = await signed_in(api_url, OPERATOR)
    run = await operator.get("/console/runs/run-stop")
    assert shown(run.text, "can-stop") == "true"
    assert 'data-testid="approval-banner"' in run.text
    confirm = await operator.get("/console/runs/run-stop/stop")
    assert "1 queued call(s) will be cancelled" in confirm.text
    token = csrf_of(confirm.text)
    no_reason = await operator.post("/console/runs/run-stop/stop", data={"csrf": token})
    assert no_reason.status_code == 400
    stopped = await operator.post(
        "/console/runs/run-stop/stop", data={"csrf": token, "reason": "runaway agent"}
    )
    assert stopped.status_code == 303
    after = await operator.get("/console/runs/run-stop")
    assert shown(after.text, "can-stop") == "false"
    assert 'data-testid="run-stopped"' in after.text
    page = await operator.get(f"/console/calls/{call['toolCallId']}")
    assert shown(page.text, "call-status") == "cancelled"
    payloads = await event_payloads(sessions, call["toolCallId"])
    assert any(p.get("reason") == "runaway agent" for p in payloads)
    await operator.aclose()


async def test_a_failed_call_is_retried_from_its_page_and_a_read_key_cannot(
    api_url: str, api: httpx.AsyncClient, sessions: Sessions
) -> None:
    call = await submit(api, "send", run="run-retry")
    async with sessions() as session, session.begin():
        await session.execute(
            update(tool_calls)
            .where(tool_calls.c.tool_call_id == call["toolCallId"])
            .values(status="failed", verification_status="confirmed_failure", last_error="422")
        )
    reader = await signed_in(api_url, READER)
    page = await reader.get(f"/console/calls/{call['toolCallId']}")
    assert "Retry</button>" not in page.text
    forged = await reader.post(
        f"/console/calls/{call['toolCallId']}/retry",
        data={"csrf": csrf_of(page.text), "reason": "x"},
    )
    assert forged.status_code == 403
    operator = await signed_in(api_url, OPERATOR)
    page = await operator.get(f"/console/calls/{call['toolCallId']}")
    assert "Retry</button>" in page.text
    retried = await operator.post(
        f"/console/calls/{call['toolCallId']}/retry",
        data={"csrf": csrf_of(page.text), "reason": "provider fixed", "new_idempotency_key": "on"},
    )
    assert retried.status_code == 303
    async with sessions() as session:
        row = (
            await session.execute(
                select(tool_calls.c.status, tool_calls.c.idempotency_key).where(
                    tool_calls.c.tool_call_id == call["toolCallId"]
                )
            )
        ).one()
    assert row.status == "authorized"
    assert row.idempotency_key != call["idempotencyKey"]
    twice = await operator.post(
        f"/console/calls/{call['toolCallId']}/retry",
        data={"csrf": csrf_of(page.text), "reason": "again"},
    )
    assert twice.status_code == 409 and 'data-code="retry_not_allowed"' in twice.text
    await reader.aclose()
    await operator.aclose()


async def test_runs_are_found_by_id_and_listed_most_recent_first(
    api_url: str, api: httpx.AsyncClient
) -> None:
    await submit(api, "send", run="run-old")
    await submit(api, "send", run="run-new")
    reader = await signed_in(api_url, READER)
    listed = await reader.get("/console/runs")
    assert listed.text.index("run-new") < listed.text.index("run-old")
    found = await reader.get("/console/runs", params={"run": "run-old"})
    assert found.status_code == 303 and found.headers["location"] == "/console/runs/run-old"
    missing = await reader.get("/console/runs/run-nobody")
    assert missing.status_code == 404 and 'data-code="run_not_found"' in missing.text
    await reader.aclose()
