"""An approval decided in the browser: the agent's call waits for a human; Bob sees the
input hash the API binds the decision to, approves with a reason, and the call executes
exactly once at the provider. A second tab still showing the form is told the approval
is already decided, and nothing executes twice."""

from __future__ import annotations

import pytest

from tests.console.support import (
    APPROVER_BOB,
    REFUND_APPROVED,
    Console,
    new_run,
    reload_shows_the_same,
    screenshot,
    shows_after_reloads,
    text_of,
)
from tests.fixtures.browser import Pages, sign_in
from tests.fixtures.sandbox import at_provider, books

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.postgres, pytest.mark.kafka]

REASON = "order o-17 was returned unopened"


async def test_an_approved_call_executes_once_and_a_stale_tab_is_refused(
    console: Console, pages: Pages
) -> None:
    view = await console.submit(REFUND_APPROVED, new_run(), orderId="o-17", amountCents=1250)
    call_id, key = view["toolCallId"], view["idempotencyKey"]
    assert view["status"] == "proposed"
    approval = await console.approval_of(call_id)
    approval_id = approval["approvalId"]

    page, _ = await pages.new()
    await sign_in(page, APPROVER_BOB)
    await page.goto("/console/approvals")
    row = page.locator("tr[data-testid=approval-row]").filter(
        has=page.locator(f'a[href*="/console/approvals/{approval_id}"]')
    )
    assert await row.count() == 1
    await reload_shows_the_same(page, "nav-approvals-count", "tr[data-testid=approval-row] a")
    await row.locator(f'a[href*="/console/approvals/{approval_id}"]').click()
    await page.wait_for_url(f"**/console/approvals/{approval_id}")

    assert await text_of(page, "input-hash") == approval["inputHash"]
    shown_input = await text_of(page, "input")
    assert '"orderId": "o-17"' in shown_input and "1250" in shown_input
    await reload_shows_the_same(page, "input-hash", "input", "approval-status")
    await screenshot(page, "console-approval.png")
    # The same operator's second tab, left on the undecided form.
    stale, stale_guard = await pages.new(page.context)
    await stale.goto(f"/console/approvals/{approval_id}")

    await page.fill("textarea[name=reason]", REASON)
    await page.get_by_role("button", name="Approve").click()
    await page.wait_for_url(f"**/console/approvals/{approval_id}*")
    assert await text_of(page, "approval-status") == "approved"
    assert "approver-bob" in await text_of(page, "decided-by")
    assert REASON in await text_of(page, "decided-by")

    await page.goto(f"/console/calls/{call_id}")
    await shows_after_reloads(page, "call-status", "completed")
    await reload_shows_the_same(page, "call-status", "dispatch-attempts", "idempotency-key")
    assert (await books(console.sandbox_url))["effects"][at_provider(key)] == 1

    await stale.fill("textarea[name=reason]", "approving again from an old tab")
    async with stale_guard.expect(409):
        await stale.get_by_role("button", name="Approve").click()
        problem = stale.locator("[data-testid=problem]")
        await problem.wait_for()
    assert await problem.get_attribute("data-code") == "approval_already_decided"
    decided = await console.approval_of(call_id)
    assert (decided["status"], decided["decidedBy"], decided["decisionReason"]) == (
        "approved",
        "approver-bob",
        REASON,
    )
    assert (await console.call(call_id))["status"] == "completed"
    assert (await books(console.sandbox_url))["effects"][at_provider(key)] == 1
