"""Every page of the nav, reached by its link as an operator would, renders without a
console error, a failed request or an error status (the page guard's checks), and
keeps the nav with both counts."""

from __future__ import annotations

import pytest

from tests.console.support import OPS_ALICE, Console, text_of
from tests.fixtures.browser import Pages, sign_in

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.postgres, pytest.mark.kafka]

NAV = {
    "Escalations": "/console/",
    "Approvals": "/console/approvals",
    "Runs": "/console/runs",
    "Overview": "/console/overview",
    "Outbox": "/console/outbox",
    "Webhooks": "/console/webhooks",
}


async def test_every_page_of_the_nav_renders_cleanly(console: Console, pages: Pages) -> None:
    page, _ = await pages.new()
    await sign_in(page, OPS_ALICE)
    for label, path in NAV.items():
        link = page.locator(f'nav a[href="{path}"]')
        assert label in await link.inner_text()
        await link.click()
        await page.wait_for_url(f"{console.base_url}{path}")
        for count in ("nav-escalations-count", "nav-approvals-count"):
            assert (await text_of(page, count)).isdigit(), (path, count)
        assert await page.locator("[data-testid=problem]").count() == 0, path
