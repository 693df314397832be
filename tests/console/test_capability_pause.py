"""Pausing a capability from the console while its provider is down: every page shows
the banner, the capabilities page shows the call that waits, and on resume the call
goes with its same key and its effect happens once."""

from __future__ import annotations

import pytest

from tests.console.support import (
    OPS_ALICE,
    REFUND,
    Console,
    new_key,
    new_run,
    shows_after_reloads,
    text_of,
)
from tests.fixtures.browser import Pages, sign_in
from tests.fixtures.sandbox import at_provider, books

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.postgres, pytest.mark.kafka]

ROW = f"tr[data-testid=capability-row][data-capability={REFUND}]"


async def test_a_paused_capability_holds_its_calls_until_resumed(
    console: Console, pages: Pages
) -> None:
    page, _ = await pages.new()
    await sign_in(page, OPS_ALICE)
    await page.goto("/console/capabilities")
    assert await page.locator("[data-testid=paused-banner]").count() == 0
    row = page.locator(ROW)
    await row.get_by_label(f"reason to pause {REFUND}").fill("provider down since 09:12")
    await row.get_by_role("button", name="Pause").click()
    await page.wait_for_url("**/console/capabilities?done=paused")
    try:
        assert REFUND in await text_of(page, "paused-banner")
        assert await row.get_by_test_id("capability-status").inner_text() == "paused"
        assert "ops-alice" in await row.inner_text()

        key = new_key("paused")
        view = await console.submit(REFUND, new_run(), idempotency_key=key)
        await page.goto("/console/runs")
        assert REFUND in await text_of(page, "paused-banner")  # every page says so
        await page.goto("/console/capabilities")
        assert await row.get_by_test_id("capability-waiting").inner_text() == "1"
        assert (await console.call(view["toolCallId"]))["status"] == "authorized"
    finally:
        await row.get_by_label(f"reason to resume {REFUND}").fill("provider is back")
        await row.get_by_role("button", name="Resume").click()
        await page.wait_for_url("**/console/capabilities?done=resumed")
    assert await page.locator("[data-testid=paused-banner]").count() == 0
    await console.wait_for_status(view["toolCallId"], "completed")
    provider = await books(console.sandbox_url)
    # Nothing reached the provider while paused; one request, one effect after.
    assert provider["received"][at_provider(key)] == 1
    assert provider["effects"][at_provider(key)] == 1
    await shows_after_reloads(page, "capability-waiting", "0")
