"""The escalation queue and the approval inbox in the console, fifty rows a page over
plain HTTP: the next page is the one after the cursor the page before ended with (kept
with the status filter in the URL), a row that moves on between pages moves no other,
and a cursor the list never made is a 400 page."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from sqlalchemy import insert, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.db.tables import approvals, escalations
from dispatcher.settings import Settings
from tests.console.test_console_http import signed_in
from tests.fixtures.api import OPERATOR, control_keys

pytestmark = pytest.mark.postgres

Sessions = async_sessionmaker[AsyncSession]
T0 = datetime(2026, 1, 1, tzinfo=UTC)
ROWS = 53


@pytest.fixture
def api_settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"api_keys": control_keys(), "console_secure_cookie": False})


def shown(html: str, kind: str) -> list[str]:
    return re.findall(rf'href="/console/{kind}/([^"?]+)"', html)


def next_link(html: str) -> str | None:
    found = re.search(r'<a href="([^"]+)" rel="next">', html)
    return None if found is None else found.group(1).replace("&amp;", "&")


async def test_the_queue_pages_after_its_cursor_and_keeps_the_filter(
    sessions: Sessions, api_url: str
) -> None:
    # Open ones, ten to a minute (ties broken by id), and as many resolved after them.
    ids = [f"esc-{n:03}" for n in range(ROWS)]
    async with sessions() as session, session.begin():
        await session.execute(
            insert(escalations),
            [
                {
                    "escalation_id": eid, "tool_call_id": f"tc-{eid}", "tenant": "acme",
                    "episode": 1, "status": status, "reason": "r", "evidence": {},
                    "created_at": T0 + timedelta(minutes=n // 10),
                }
                for n, eid in enumerate(ids)
                for status, eid in (("open", eid), ("resolved", f"{eid}-done"))
            ],
        )  # fmt: skip
    client = await signed_in(api_url, OPERATOR)
    first = await client.get("/console/", params={"status": "open"})
    assert shown(first.text, "escalations") == ids[:50]
    assert 'rel="prev"' not in first.text
    following = next_link(first.text)
    assert following is not None and following.startswith("/console/?status=open&after=")
    # Keyset, not OFFSET: a row of the first page resolved meanwhile moves no row of the
    # second (an OFFSET of 50 would now skip the first of them).
    async with sessions() as session, session.begin():
        await session.execute(
            update(escalations)
            .where(escalations.c.escalation_id == ids[0])
            .values(status="resolved")
        )
    second = await client.get(following)
    assert shown(second.text, "escalations") == ids[50:]
    assert 'href="/console/?status=open" rel="prev"' in second.text
    assert next_link(second.text) is None
    for bad in ("x", "%C2%B2", "WzEsMiwzXQ"):
        page = await client.get(f"/console/?after={bad}")
        assert page.status_code == 400, bad
    await client.aclose()


async def test_the_inbox_pages_after_its_cursor(sessions: Sessions, api_url: str) -> None:
    ids = [f"apr-{n:03}" for n in range(ROWS)]
    async with sessions() as session, session.begin():
        await session.execute(
            insert(approvals),
            [
                {
                    "approval_id": aid, "tool_call_id": f"tc-{aid}", "tenant": "acme",
                    "run_id": "run-1", "capability_id": "refund", "risk": "high",
                    "input_hash": "h", "policy_version": 1, "status": "pending",
                    "expires_at": T0 + timedelta(minutes=n // 10),
                }
                for n, aid in enumerate(ids)
            ],
        )  # fmt: skip
    client = await signed_in(api_url, OPERATOR)
    first = await client.get("/console/approvals")
    assert shown(first.text, "approvals") == ids[:50]
    following = next_link(first.text)
    assert following is not None and "after=" in following
    second = await client.get(following)
    assert shown(second.text, "approvals") == ids[50:]
    assert next_link(second.text) is None
    assert (await client.get("/console/approvals?after=nope")).status_code == 400
    await client.aclose()


async def test_a_page_of_a_cursor_is_what_the_api_pages_to(
    sessions: Sessions, api_url: str, api: httpx.AsyncClient
) -> None:
    """The console's cursor and the API's ``next`` are one token: either lists the same
    next page."""
    async with sessions() as session, session.begin():
        await session.execute(
            insert(escalations),
            [
                {
                    "escalation_id": f"esc-{n:03}", "tool_call_id": f"tc-{n}", "tenant": "acme",
                    "episode": 1, "status": "open", "reason": "r", "evidence": {},
                    "created_at": T0,
                }
                for n in range(ROWS)
            ],
        )  # fmt: skip
    client = await signed_in(api_url, OPERATOR)
    following = next_link((await client.get("/console/")).text)
    assert following is not None
    token = following.split("after=")[1]
    listed = await api.get(
        "/v1/escalations",
        params={"after": token},
        headers={"Authorization": f"Bearer {OPERATOR}"},
    )
    assert [e["escalationId"] for e in listed.json()["escalations"]] == [
        f"esc-{n:03}" for n in range(50, ROWS)
    ]
    await client.aclose()
