"""The page guard itself, on the stack's API: what it must catch it catches, and what a
test declares it lets through. Without this a guard that recorded nothing would let
every console test pass."""

from __future__ import annotations

import pytest

from tests.fixtures.browser import Pages
from tests.fixtures.waiting import eventually

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.postgres, pytest.mark.kafka]


async def test_an_undeclared_error_status_is_recorded_and_a_declared_one_is_not(
    pages: Pages,
) -> None:
    page, guard = await pages.new()
    await page.goto("/v1/no-such-route")
    assert any("unexpected 404" in p for p in guard.problems), guard.problems
    guard.problems.clear()

    async with guard.expect(404):
        await page.goto("/v1/no-such-route")
    assert guard.problems == []

    with pytest.raises(AssertionError, match="no 409 response arrived"):
        async with guard.expect(409, within=0.5):
            await page.goto("/openapi.json")


async def test_console_errors_page_errors_and_dialogs_are_recorded(pages: Pages) -> None:
    page, guard = await pages.new()
    await page.goto("/openapi.json")
    await page.evaluate("console.error('boom')")
    await page.evaluate("setTimeout(() => { throw new Error('uncaught') }, 0)")
    await page.evaluate("alert('hi')")

    async def three_recorded() -> bool:
        return len(guard.problems) >= 3

    await eventually(three_recorded, within=10, what="the guard to record all three")
    found = "\n".join(guard.problems)
    assert "console error: boom" in found
    assert "page error: " in found and "uncaught" in found
    assert "dialog opened: alert 'hi'" in found
    assert guard.dialogs == ["hi"]
    guard.problems.clear()
