"""The console's outbox and overview pages over plain HTTP against the real API and
database: a tenant sees and acts on its own dead letters only, an action needs the
form's token and the operate scope, retry and discard do what the relay's own
commands do, and the overview's figures are the rows'."""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from sqlalchemy import func, insert, select, text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

import outbox_relay
from dispatcher.db.tables import approvals, escalations, outbox
from dispatcher.settings import Settings
from dispatcher.states import IN_FLIGHT_STATES, TERMINAL_STATES
from tests.console.test_console_http import csrf_of, signed_in
from tests.fixtures.api import GLOBEX, OPERATOR, READER, control_keys
from tests.fixtures.calls import insert_call

Sessions = async_sessionmaker[AsyncSession]
ROW = 'data-testid="dead-letter-row" data-row-id="{}"'


@pytest.fixture
def api_settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"api_keys": control_keys(), "console_secure_cookie": False})


async def _signed(api_url: str, key: str) -> AsyncIterator[httpx.AsyncClient]:
    client = await signed_in(api_url, key)
    yield client
    await client.aclose()


@pytest.fixture
async def operator(api_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async for client in _signed(api_url, OPERATOR):
        yield client


@pytest.fixture
async def reader(api_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async for client in _signed(api_url, READER):
        yield client


@pytest.fixture
async def globex(api_url: str) -> AsyncIterator[httpx.AsyncClient]:
    """Every scope, operate included, of the other tenant."""
    async for client in _signed(api_url, GLOBEX):
        yield client


async def outbox_row(
    sessions: Sessions,
    tenant: str,
    *,
    key: str = "run-1",
    topic: str = "tool-dispatcher.events",
    dead: bool = False,
    **values: Any,
) -> int:
    """One outbox row naming ``tenant``, as the ledger writes them; ``dead``: as the
    relay leaves a row the broker refused for good."""
    row = outbox_relay.OutboxMessage(
        topic=topic, key=key, type="t", source="test", payload={"tenant": tenant}
    ).row()
    if dead:
        row.update(attempts=3, last_error="topic does not exist", dead_lettered_at=func.now())
    async with sessions() as session, session.begin():
        found = await session.scalar(
            insert(outbox).values({**row, **values}).returning(outbox.c.id)
        )
    assert found is not None
    return int(found)


async def row_state(sessions: Sessions, row_id: int) -> Any:
    async with sessions() as session:
        found = await session.execute(
            select(outbox.c.dead_lettered_at, outbox.c.attempts, outbox.c.last_error).where(
                outbox.c.id == row_id
            )
        )
        return found.one_or_none()


async def form_token(client: httpx.AsyncClient) -> str:
    return csrf_of((await client.get("/console/outbox")).text)


async def test_the_list_shows_the_tenants_dead_letters_and_what_waits_behind_them(
    sessions: Sessions, operator: httpx.AsyncClient, globex: httpx.AsyncClient
) -> None:
    mine = await outbox_row(sessions, "acme", key="run-1", dead=True)
    for _ in range(2):
        await outbox_row(sessions, "acme", key="run-1")
    # Another tenant's row of the same key waits too, but is not acme's to count.
    await outbox_row(sessions, "globex", key="run-1")
    await outbox_row(sessions, "acme", key="run-2")
    theirs = await outbox_row(sessions, "globex", key="run-9", dead=True)
    # What the broker said is shown as text, never as markup.
    escaped = await outbox_row(sessions, "acme", key="run-5", dead=True, last_error="<b>big</b>")

    page = await operator.get("/console/outbox")

    assert page.status_code == 200
    rows = re.findall(r'<tr data-testid="dead-letter-row".*?</tr>', page.text, re.S)
    assert len(rows) == 2 and ROW.format(mine) in rows[0]
    assert ROW.format(escaped) in rows[1] and "&lt;b&gt;big&lt;/b&gt;" in rows[1]
    async with sessions() as session:
        message_id = await session.scalar(
            select(outbox.c.headers["ce_id"].astext).where(outbox.c.id == mine)
        )
    assert message_id and message_id in rows[0]
    assert "topic does not exist" in rows[0] and "tool-dispatcher.events" in rows[0]
    assert re.search(r'data-testid="blocked-rows">2<', rows[0])
    assert "<time datetime=" in rows[0]
    theirs_page = (await globex.get("/console/outbox")).text
    assert ROW.format(theirs) in theirs_page and ROW.format(mine) not in theirs_page


async def test_a_read_key_sees_the_dead_letters_without_any_action(
    sessions: Sessions, reader: httpx.AsyncClient
) -> None:
    row_id = await outbox_row(sessions, "acme", dead=True)
    page = await reader.get("/console/outbox")
    assert ROW.format(row_id) in page.text
    assert re.findall(r'<form method="post" action="([^"]+)"', page.text) == ["/console/logout"]
    # Not hidden only: the post itself is refused for want of the scope.
    refused = await reader.post(
        f"/console/outbox/{row_id}/retry", data={"csrf": csrf_of(page.text)}
    )
    assert refused.status_code == 403 and 'data-code="forbidden"' in refused.text
    assert (await row_state(sessions, row_id)).dead_lettered_at is not None


async def test_an_operator_retries_a_dead_letter_back_into_line(
    sessions: Sessions, operator: httpx.AsyncClient
) -> None:
    row_id = await outbox_row(sessions, "acme", dead=True)
    page = (await operator.get("/console/outbox")).text
    assert f'action="/console/outbox/{row_id}/retry"' in page

    answer = await operator.post(f"/console/outbox/{row_id}/retry", data={"csrf": csrf_of(page)})

    assert answer.status_code == 303
    assert answer.headers["location"] == "/console/outbox?done=retried"
    state = await row_state(sessions, row_id)
    assert state.dead_lettered_at is None and state.attempts == 0
    after = await operator.get(answer.headers["location"])
    assert 'data-testid="notice"' in after.text and ROW.format(row_id) not in after.text


async def test_retry_leaves_the_row_as_the_relays_own_retry_does(
    sessions: Sessions, operator: httpx.AsyncClient, database_url: str
) -> None:
    by_relay = await outbox_row(sessions, "acme", dead=True)
    by_console = await outbox_row(sessions, "acme", dead=True)

    assert await outbox_relay.retry_dead_letter(database_url, by_relay)
    await operator.post(
        f"/console/outbox/{by_console}/retry", data={"csrf": await form_token(operator)}
    )

    assert await row_state(sessions, by_console) == await row_state(sessions, by_relay)


async def test_a_discard_needs_the_box_ticked_then_deletes_the_row(
    sessions: Sessions, operator: httpx.AsyncClient
) -> None:
    row_id = await outbox_row(sessions, "acme", dead=True)
    token = await form_token(operator)

    unconfirmed = await operator.post(f"/console/outbox/{row_id}/discard", data={"csrf": token})
    assert unconfirmed.status_code == 400 and 'data-code="validation_failed"' in unconfirmed.text
    assert await row_state(sessions, row_id) is not None

    answer = await operator.post(
        f"/console/outbox/{row_id}/discard", data={"csrf": token, "confirm": "yes"}
    )

    assert answer.status_code == 303
    assert answer.headers["location"] == "/console/outbox?done=discarded"
    assert await row_state(sessions, row_id) is None


async def test_another_tenant_cannot_retry_or_discard_a_dead_letter(
    sessions: Sessions, globex: httpx.AsyncClient
) -> None:
    row_id = await outbox_row(sessions, "acme", dead=True)
    before = await row_state(sessions, row_id)
    token = await form_token(globex)

    retried = await globex.post(f"/console/outbox/{row_id}/retry", data={"csrf": token})
    discarded = await globex.post(
        f"/console/outbox/{row_id}/discard", data={"csrf": token, "confirm": "yes"}
    )

    for answer in (retried, discarded):
        assert answer.status_code == 404
        assert 'data-code="dead_letter_not_found"' in answer.text
    assert await row_state(sessions, row_id) == before


async def test_a_post_without_the_form_token_changes_nothing(
    sessions: Sessions, operator: httpx.AsyncClient
) -> None:
    row_id = await outbox_row(sessions, "acme", dead=True)
    before = await row_state(sessions, row_id)

    retried = await operator.post(f"/console/outbox/{row_id}/retry", data={})
    discarded = await operator.post(f"/console/outbox/{row_id}/discard", data={"confirm": "yes"})
    # The token is checked before the path: a malformed id without one is refused too.
    malformed = await operator.post("/console/outbox/x%C2%B2/retry", data={})

    for answer in (retried, discarded, malformed):
        assert answer.status_code == 403
        assert 'data-code="csrf_rejected"' in answer.text
    assert await row_state(sessions, row_id) == before
    bad_id = await operator.post(
        "/console/outbox/%C2%B2/retry", data={"csrf": await form_token(operator)}
    )
    assert bad_id.status_code == 400


async def test_the_outbox_pages_by_fifty_after_the_last_id_and_keeps_the_filter(
    sessions: Sessions, operator: httpx.AsyncClient
) -> None:
    topic = f"t-{uuid.uuid4().hex[:6]}"
    ids = [
        await outbox_row(sessions, "acme", topic=topic, key=f"k{i}", dead=True) for i in range(53)
    ]
    elsewhere = await outbox_row(sessions, "acme", topic="other", dead=True)

    first = await operator.get("/console/outbox", params={"topic": topic})

    shown = [int(i) for i in re.findall(r'data-row-id="(\d+)"', first.text)]
    assert shown == ids[:50]  # oldest first
    assert 'rel="prev"' not in first.text
    found = re.search(r'<a href="([^"]+)" rel="next">', first.text)
    assert found is not None
    assert found.group(1) == f"/console/outbox?topic={topic}&amp;after={ids[49]}"
    # Keyset, not OFFSET: a row retried off the first page moves no row of the second.
    retried = await operator.post(
        f"/console/outbox/{ids[0]}/retry", data={"csrf": csrf_of(first.text)}
    )
    assert retried.status_code == 303
    second = await operator.get(found.group(1).replace("&amp;", "&"))
    assert [int(i) for i in re.findall(r'data-row-id="(\d+)"', second.text)] == ids[50:]
    assert f'href="/console/outbox?topic={topic}" rel="prev"' in second.text
    assert 'rel="next"' not in second.text
    assert ROW.format(elsewhere) not in first.text + second.text
    other = (await operator.get("/console/outbox", params={"topic": "other"})).text
    assert re.findall(r'data-row-id="(\d+)"', other) == [str(elsewhere)]
    for bad in ("%C2%B2", "-1", "x", "9" * 20):
        assert (await operator.get(f"/console/outbox?after={bad}")).status_code == 400, bad


async def test_the_overview_counts_the_tenants_rows_and_reloads_itself(
    sessions: Sessions, operator: httpx.AsyncClient
) -> None:
    for status, n in (("completed", 2), ("failed", 1), ("authorized", 3)):
        for _ in range(n):
            await insert_call(sessions, status)
    await insert_call(sessions, "completed", tenant="globex")
    # Unknown for an hour, though the reconciler's last lookup (updated_at) was just now.
    await insert_call(
        sessions, "result_unknown", dispatched_at=text("now() - interval '61 minutes'")
    )
    await insert_call(sessions, "result_unknown", dispatched_at=func.now())
    call = await insert_call(sessions, "escalated")
    await add_escalation(sessions, call, "acme", "open")
    await add_escalation(sessions, call, "acme", "resolved", episode=2)
    await add_escalation(sessions, call, "globex", "open")
    await add_approval(sessions, "acme", "pending")
    await add_approval(sessions, "acme", "approved")
    await add_approval(sessions, "globex", "pending")
    await outbox_row(sessions, "acme", created_at=text("now() - interval '10 minutes'"))
    await outbox_row(sessions, "acme", key="run-2")
    await outbox_row(sessions, "acme", key="run-3", published_at=func.now())
    await outbox_row(sessions, "globex")
    await outbox_row(sessions, "acme", key="run-4", dead=True)
    await outbox_row(sessions, "globex", key="run-4", dead=True)

    page = await operator.get("/console/overview")

    assert page.status_code == 200
    assert re.search(r'<body[^>]* data-refresh="5"', page.text)
    # The calls in flight only: the finished ones (completed, failed) are history, and
    # the page, reloaded every 5 s, does not read it.
    expected = {s.value: 0 for s in IN_FLIGHT_STATES}
    expected.update(authorized=3, result_unknown=2, escalated=1)
    for status, n in expected.items():
        assert tile(page.text, f"status-{status}") == str(n), status
    for status in TERMINAL_STATES:
        assert f'data-testid="overview-status-{status}"' not in page.text, status
    assert tile(page.text, "open-escalations") == "1"
    assert tile(page.text, "pending-approvals") == "1"
    assert tile(page.text, "unpublished") == "2"
    assert tile(page.text, "dead-letters") == "1"
    assert tile(page.text, "oldest-unknown").startswith("1h 1m")
    unpublished = r'data-testid="overview-unpublished">(?:(?!class="tile").)*?\b10m( \d+s)? ago'
    assert re.search(unpublished, page.text, re.S)


def tile(html: str, name: str) -> str:
    found = re.search(
        rf'data-testid="overview-{name}">\s*<span class="n">(?:<a [^>]+>)?([^<]+)<', html
    )
    assert found is not None, name
    return found.group(1).strip()


async def add_escalation(
    sessions: Sessions, call: str, tenant: str, status: str, *, episode: int = 1
) -> None:
    row = {
        "escalation_id": f"esc-{uuid.uuid4().hex[:8]}",
        "tool_call_id": call,
        "tenant": tenant,
        "episode": episode,
        "status": status,
        "reason": "no lookup",
        "evidence": {},
    }
    if status == "resolved":
        row.update(resolved_at=func.now(), resolved_by="x", finding="compensated")
    async with sessions() as session, session.begin():
        await session.execute(insert(escalations).values(row))


async def add_approval(sessions: Sessions, tenant: str, status: str) -> None:
    row: dict[str, Any] = {
        "approval_id": f"apr-{uuid.uuid4().hex[:8]}",
        "tool_call_id": f"tc-{uuid.uuid4().hex[:8]}",
        "tenant": tenant,
        "run_id": "run-1",
        "capability_id": "send",
        "risk": "high",
        "input_hash": "h",
        "policy_version": 1,
        "expires_at": text("now() + interval '1 hour'"),
        "status": status,
    }
    if status != "pending":
        row.update(closed_at=func.now(), decision="approve", decided_by="bob")
    async with sessions() as session, session.begin():
        await session.execute(insert(approvals).values(row))
