"""The console's runs page over plain HTTP: the tenant's runs newest first, a keyset page
at a time (``after``, from the runs' summaries), walked by its "older" links with each
run shown exactly once while calls move; the busy filter carried from page to page."""

from __future__ import annotations

import html
import re

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.capabilities import CapabilityRegistry
from dispatcher.console import paging
from dispatcher.intake.service import submit_many
from dispatcher.schemas import SubmitRequest
from dispatcher.settings import Settings
from tests.console.test_console_http import signed_in
from tests.fixtures.api import READER, control_keys
from tests.fixtures.capabilities import approval_capability, plain_capability

pytestmark = pytest.mark.postgres
Sessions = async_sessionmaker[AsyncSession]
_ROW = re.compile(
    r'data-testid="run-row">\s*<td><a href="/console/runs/[^"]+"><code>([^<]+)</code>'
)
_NEXT = re.compile(r'<a href="([^"]+)" rel="next">')


@pytest.fixture
def api_settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"api_keys": control_keys(), "console_secure_cookie": False})


@pytest.fixture
def registry() -> CapabilityRegistry:
    caps = [approval_capability("refund-big"), plain_capability("send")]
    return CapabilityRegistry({c.id: c for c in caps})


async def seed(sessions: Sessions, registry: CapabilityRegistry, runs: list[str], cap: str) -> None:
    async with sessions() as session, session.begin():
        await submit_many(
            session,
            [
                (SubmitRequest(run_id=r, capability_id=cap, input={"orderId": r}), "acme")
                for r in runs
            ],
            registry=registry,
        )


async def test_the_runs_page_walks_every_run_once_by_its_older_links(
    api_url: str, sessions: Sessions, registry: CapabilityRegistry
) -> None:
    idle = [f"run-p{n:03d}" for n in range(40)]
    busy = [f"run-s{n:03d}" for n in range(paging.PAGE_SIZE + 30)]
    await seed(sessions, registry, idle, "refund-big")
    await seed(sessions, registry, busy, "send")
    reader = await signed_in(api_url, READER)

    async def walk(url: str) -> list[str]:
        shown: list[str] = []
        pages = 0
        while url:
            page = await reader.get(url)
            assert page.status_code == 200, page.text
            shown += _ROW.findall(page.text)
            pages += 1
            following = _NEXT.search(page.text)
            url = html.unescape(following.group(1)) if following else ""
            # A call of a run on a later page moves meanwhile: it keeps its place.
            await seed(sessions, registry, [busy[pages]], "send")
        return shown

    shown = await walk("/console/runs")
    assert shown == sorted(busy, reverse=True) + sorted(idle, reverse=True)
    assert await walk("/console/runs?show=busy") == sorted(busy, reverse=True)
    assert await walk("/console/runs?show=idle") == sorted(idle, reverse=True)

    refused = await reader.get("/console/runs", params={"after": "bm90IGEgY3Vyc29y"})
    assert refused.status_code == 400 and 'data-code="validation_failed"' in refused.text
    unknown = await reader.get("/console/runs", params={"show": "everything"})
    assert unknown.status_code == 400
    await reader.aclose()
