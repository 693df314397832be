"""An operator's actions on runs and calls in the browser: stopping a run (through its
confirmation page) cancels the call it still had queued, and retrying a call the
provider refused sends it again."""

from __future__ import annotations

import pytest

from tests.console.support import (
    OPS_ALICE,
    REFUND,
    REFUND_APPROVED,
    Console,
    new_key,
    new_run,
    reload_shows_the_same,
    shows_after_reloads,
    text_of,
)
from tests.fixtures.browser import Pages, sign_in
from tests.fixtures.sandbox import add_fault, at_provider, books

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.postgres, pytest.mark.kafka]

# The status column of the run page's call rows (the last one is a ticking age).
CALL_STATUSES = "tr[data-testid=call-row] td:nth-child(3)"


async def test_stopping_a_run_cancels_its_queued_call(console: Console, pages: Pages) -> None:
    run_id = new_run()
    done = await console.submit(REFUND, run_id)
    queued = await console.submit(REFUND_APPROVED, run_id)
    await console.wait_for_status(done["toolCallId"], "completed")

    page, _ = await pages.new()
    await sign_in(page, OPS_ALICE)
    await page.goto(f"/console/runs/{run_id}")
    assert await text_of(page, "can-stop") == "true"
    assert await page.locator("tr[data-testid=call-row]").count() == 2
    await reload_shows_the_same(page, "run-busy", "can-stop", CALL_STATUSES)

    await page.get_by_role("button", name="Stop run").click()
    await page.wait_for_url(f"**/console/runs/{run_id}/stop*")
    await page.fill("textarea[name=reason]", "the customer withdrew the request")
    await page.get_by_role("button", name="Confirm stop").click()
    await page.wait_for_url(f"**/console/runs/{run_id}*")
    assert await page.locator("[data-testid=run-stopped]").count() == 1
    stopped_by = await text_of(page, "stopped-by")
    assert "ops-alice" in stopped_by and "the customer withdrew the request" in stopped_by
    assert await text_of(page, "can-stop") == "false"
    await reload_shows_the_same(page, "run-stopped", "can-stop", CALL_STATUSES)

    await page.goto(f"/console/calls/{queued['toolCallId']}")
    assert await text_of(page, "call-status") == "cancelled"
    await reload_shows_the_same(page, "call-status", "dispatch-attempts")
    assert (await console.call(queued["toolCallId"]))["status"] == "cancelled"
    assert (await console.call(done["toolCallId"]))["status"] == "completed"
    run = await console.get(f"/v1/runs/{run_id}")
    assert run["stopped"] is True
    sent = at_provider(queued["idempotencyKey"])
    assert sent not in (await books(console.sandbox_url))["received"]


async def test_retrying_a_refused_call_sends_it_again(console: Console, pages: Pages) -> None:
    key = new_key("refused")
    # The provider refuses the first request definitively, then takes the next.
    await add_fault(
        console.sandbox_url,
        {"kind": "error", "status": 422, "idempotencyKey": at_provider(key), "times": 1},
    )
    view = await console.submit(REFUND, new_run(), idempotency_key=key)
    call_id = view["toolCallId"]
    await console.wait_for_status(call_id, "failed")

    page, _ = await pages.new()
    await sign_in(page, OPS_ALICE)
    await page.goto(f"/console/calls/{call_id}")
    assert await text_of(page, "call-status") == "failed"
    attempts = int(await text_of(page, "dispatch-attempts"))
    await reload_shows_the_same(page, "call-status", "dispatch-attempts", "idempotency-key")

    await page.fill("textarea[name=reason]", "the provider fixed its validation bug")
    await page.get_by_role("button", name="Retry").click()
    await page.wait_for_url(f"**/console/calls/{call_id}*")
    await shows_after_reloads(page, "call-status", "completed")
    assert int(await text_of(page, "dispatch-attempts")) > attempts
    assert await text_of(page, "idempotency-key") == key
    await reload_shows_the_same(page, "call-status", "dispatch-attempts", "idempotency-key")

    assert (await console.call(call_id))["status"] == "completed"
    counts = await books(console.sandbox_url)
    sent = at_provider(key)
    assert (counts["received"][sent], counts["effects"][sent]) == (2, 1)
