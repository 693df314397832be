"""A bulk retry from the console: the filter's count is shown before anything is
confirmed, and once confirmed the operation's progress bar follows the stack's worker
to 100% without a reload; every call of the filter is retried."""

from __future__ import annotations

import uuid

import pytest

from dispatcher.db.engine import engine_for, session_factory
from tests.console.support import OPS_ALICE, REFUND, Console, new_run, screenshot
from tests.fixtures.browser import Pages, sign_in
from tests.fixtures.operations import failed_calls, retried_events
from tests.fixtures.waiting import eventually

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.postgres, pytest.mark.kafka]

CALLS = 120


async def test_a_bulk_retry_from_the_console_reaches_100_percent(
    console: Console, pages: Pages
) -> None:
    run_id = new_run()
    engine = engine_for(console.stack.env["TOOL_DISPATCHER_DATABASE_URL"], pool_size=1)
    sessions = session_factory(engine)
    try:
        ids = [f"bulk-{uuid.uuid4().hex[:10]}" for _ in range(CALLS)]
        await failed_calls(sessions, ids, capability_id=REFUND, run_id=run_id)
        page, _ = await pages.new()
        await sign_in(page, OPS_ALICE)
        await page.goto("/console/operations")
        await page.get_by_label("Reason").fill("provider fixed the bad gateway")
        await page.get_by_label("Capability").fill(REFUND)
        await page.get_by_label("Run").fill(run_id)
        await page.get_by_test_id("count-calls").click()
        await page.wait_for_url("**/console/operations?*preview=1*")
        assert await page.get_by_test_id("preview-count").inner_text() == str(CALLS)
        confirm = page.get_by_test_id("confirm-operation")
        assert await confirm.inner_text() == f"Retry {CALLS} calls"
        await confirm.click()
        await page.wait_for_url("**/console/operations/op_*")
        url = page.url
        # The script updates the bar in place; the page is never reloaded.
        bar = page.get_by_test_id("operation-progress")
        seen: list[str | None] = []

        async def full() -> bool:
            seen.append(await bar.get_attribute("value"))
            return seen[-1] == "100"

        await eventually(full, within=60, every=0.2, what="the progress bar to reach 100%")
        assert page.url == url
        assert await page.get_by_test_id("operation-state").inner_text() == "completed"
        assert await page.get_by_test_id("operation-percent").inner_text() == "100%"
        assert (
            await page.get_by_test_id("operation-counts").inner_text()
            == f"{CALLS} done, 0 refused of {CALLS}"
        )
        await screenshot(page, "bulk-retry")
        operation_id = url.rsplit("/", 1)[-1].split("?")[0]
        events = [e for e in await retried_events(sessions, "acme") if e["tool_call_id"] in ids]
        assert sorted(e["tool_call_id"] for e in events) == sorted(ids)
        assert {e["causation_id"] for e in events} == {operation_id}
    finally:
        await engine.dispose()
