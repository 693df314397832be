"""An escalation worked end to end in the browser: a call whose lookups never answer
is escalated by the reconciler, shows on the home page, is acknowledged and resolved
as confirmed by ops-alice, and the ledger (over HTTP) holds her resolution. A stale tab
that resolves again is told it is already resolved."""

from __future__ import annotations

import json

import pytest

from tests.console.support import (
    OPS_ALICE,
    REFUND,
    Console,
    new_key,
    new_run,
    reload_shows_the_same,
    screenshot,
    shows_after_reloads,
    text_of,
)
from tests.fixtures.browser import Pages, sign_in
from tests.fixtures.sandbox import add_fault, at_provider, books
from tests.fixtures.waiting import eventually

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.postgres, pytest.mark.kafka]

NOTE = "provider support confirmed refund r-778 by phone"


async def escalated_call(console: Console) -> tuple[dict[str, str], str]:
    """A refund whose answer is lost after it applied, and whose every lookup hangs
    until the reconciler gives up: (its view, its escalation id)."""
    key = new_key("escalated")
    await add_fault(
        console.sandbox_url,
        [
            {"kind": "drop_after_apply", "idempotencyKey": at_provider(key)},
            {"kind": "timeout", "method": "GET", "idempotencyKey": at_provider(key)},
        ],
    )
    view = await console.submit(REFUND, new_run(), idempotency_key=key)
    found: list[str] = []

    async def escalated() -> bool:
        queue = (await console.get("/v1/escalations", status="open"))["escalations"]
        found[:] = [e["escalationId"] for e in queue if e["toolCallId"] == view["toolCallId"]]
        return bool(found)

    await eventually(escalated, within=45, what="the reconciler to escalate the call")
    return view, found[0]


async def test_an_escalation_is_acknowledged_and_resolved_as_confirmed(
    console: Console, pages: Pages
) -> None:
    view, escalation_id = await escalated_call(console)
    call_id, run_id = view["toolCallId"], view["runId"]
    page, _ = await pages.new()
    await sign_in(page, OPS_ALICE)

    rows = page.locator("tr[data-testid=escalation-row]")
    assert await rows.count() == 1
    assert await text_of(page, "nav-escalations-count") == "1"
    row = rows.filter(has=page.locator(f'a[href*="/console/escalations/{escalation_id}"]'))
    assert await row.count() == 1
    await screenshot(page, "console-escalations.png")
    await reload_shows_the_same(page, "nav-escalations-count", "tr[data-testid=escalation-row] a")

    await row.locator("a").first.click()
    await page.wait_for_url(f"**/console/escalations/{escalation_id}")
    # A second tab of the same operator, left on the open escalation.
    stale, stale_guard = await pages.new(page.context)
    await stale.goto(f"/console/escalations/{escalation_id}")

    await page.get_by_role("button", name="Acknowledge").click()
    await page.wait_for_url(f"**/console/escalations/{escalation_id}?done=acknowledged")
    assert "ops-alice" in await text_of(page, "acknowledged-by")
    await page.select_option("select[name=finding]", "confirmed_success")
    await page.fill("textarea[name=reason]", NOTE)
    await page.get_by_role("button", name="Resolve").click()
    await page.wait_for_url(f"**/console/escalations/{escalation_id}?done=resolved")

    await page.goto(f"/console/calls/{call_id}")
    await shows_after_reloads(page, "call-status", "confirmed")
    assert await text_of(page, "verification-status") == "confirmed_success"
    await reload_shows_the_same(page, "call-status", "verification-status")
    await page.goto("/console/")
    assert await text_of(page, "nav-escalations-count") == "0"
    assert await page.locator("tr[data-testid=escalation-row]").count() == 0
    await reload_shows_the_same(page, "nav-escalations-count", "empty")

    assert (await console.call(call_id))["status"] == "confirmed"
    events = (await console.get(f"/v1/runs/{run_id}/events"))["events"]
    resolutions = [
        e
        for e in events
        if e["toolCallId"] == call_id
        and "ops-alice" in json.dumps(e["payload"])
        and NOTE in json.dumps(e["payload"])
    ]
    assert len(resolutions) == 1, [e["eventType"] for e in events]
    assert (await books(console.sandbox_url))["effects"][at_provider(view["idempotencyKey"])] == 1

    await stale.select_option("select[name=finding]", "confirmed_failure")
    await stale.fill("textarea[name=reason]", "a second opinion, too late")
    async with stale_guard.expect(409):
        await stale.get_by_role("button", name="Resolve").click()
        problem = stale.locator("[data-testid=problem]")
        await problem.wait_for()
    assert await problem.get_attribute("data-code") == "escalation_already_resolved"
    assert (await console.call(call_id))["verificationStatus"] == "confirmed_success"
