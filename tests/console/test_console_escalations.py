"""The escalation pages over plain HTTP: the queue, the evidence, acknowledging and
resolving through the control functions, a second resolution shown as its 409, the
scopes that hide and refuse actions, tenants, and escaping of user data."""

from __future__ import annotations

import re

import pytest
from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.control.escalations import escalate
from dispatcher.db.tables import escalations, execution_events, tool_calls
from dispatcher.ledger.messages import Producer
from dispatcher.settings import Settings
from dispatcher.states import ExecutionStatus as S
from tests.console.test_console_http import csrf_of, signed_in
from tests.fixtures.api import GLOBEX, OPERATOR, READER, control_keys
from tests.fixtures.calls import insert_unknown_calls

pytestmark = pytest.mark.postgres
HOSTILE = "<script>alert('x')</script>"

Sessions = async_sessionmaker[AsyncSession]


@pytest.fixture
def api_settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"api_keys": control_keys(), "console_secure_cookie": False})


async def escalated(sessions: Sessions) -> tuple[str, str]:
    [call] = await insert_unknown_calls(sessions, ["k-console"], "refund-order-v2")
    async with sessions() as session, session.begin():
        await session.execute(
            update(tool_calls)
            .where(tool_calls.c.tool_call_id == call)
            .values(input={"orderId": HOSTILE})
        )
        view = await escalate(
            session,
            call,
            tenant="acme",
            expected=S.RESULT_UNKNOWN,
            reason=f"lookups kept timing out {HOSTILE}",
            evidence={"lookups": [{"url": "http://p/lookup", "answer": "timeout"}]},
            producer=Producer.RECONCILER,
        )
    return call, view.escalation_id


async def test_the_queue_shows_the_escalation_escaped_and_counted(
    api_url: str, sessions: Sessions
) -> None:
    _, esc = await escalated(sessions)
    client = await signed_in(api_url, OPERATOR)
    home = await client.get("/console/")
    assert 'data-testid="nav-escalations-count">1<' in home.text
    assert home.text.count('data-testid="escalation-row"') == 1
    assert f"/console/escalations/{esc}" in home.text
    assert HOSTILE not in home.text and "&lt;script&gt;" in home.text
    page = await client.get(f"/console/escalations/{esc}")
    assert page.status_code == 200
    assert HOSTILE not in page.text
    assert 'data-testid="evidence-lookups"' in page.text and "http://p/lookup" in page.text
    assert "k-console" in page.text  # the idempotency key
    await client.aclose()


async def test_acknowledge_then_resolve_then_a_second_resolve_is_a_409_page(
    api_url: str, sessions: Sessions
) -> None:
    call, esc = await escalated(sessions)
    client = await signed_in(api_url, OPERATOR)
    page = await client.get(f"/console/escalations/{esc}")
    token = csrf_of(page.text)
    acked = await client.post(f"/console/escalations/{esc}/acknowledge", data={"csrf": token})
    assert acked.status_code == 303
    assert acked.headers["location"] == f"/console/escalations/{esc}?done=acknowledged"
    again = await client.get(f"/console/escalations/{esc}")
    assert re.search(r'data-testid="acknowledged-by">oncall@acme \(console\),', again.text)
    no_note = await client.post(
        f"/console/escalations/{esc}/resolve",
        data={"csrf": token, "finding": "confirmed_success", "reason": " "},
    )
    assert no_note.status_code == 400
    form = {"csrf": token, "finding": "confirmed_success", "reason": "provider console shows it"}
    resolved = await client.post(f"/console/escalations/{esc}/resolve", data=form)
    assert resolved.status_code == 303
    twice = await client.post(f"/console/escalations/{esc}/resolve", data=form)
    assert twice.status_code == 409
    assert 'data-code="escalation_already_resolved"' in twice.text
    async with sessions() as session:
        status = await session.scalar(
            select(tool_calls.c.status).where(tool_calls.c.tool_call_id == call)
        )
        payloads = (
            await session.scalars(
                select(execution_events.c.payload).where(
                    execution_events.c.tool_call_id == call,
                    execution_events.c.event_type == "tool.call.confirmed",
                )
            )
        ).all()
    assert status == "confirmed"
    [payload] = payloads
    assert payload["reason"] == "provider console shows it"
    assert payload["by"] == {"name": "oncall", "tenant": "acme", "via": "console"}
    home = await client.get("/console/")
    assert 'data-testid="nav-escalations-count">0<' in home.text
    await client.aclose()


async def test_a_read_key_sees_no_action_and_its_forged_post_is_refused(
    api_url: str, sessions: Sessions
) -> None:
    _, esc = await escalated(sessions)
    reader = await signed_in(api_url, READER)
    page = await reader.get(f"/console/escalations/{esc}")
    assert re.findall(r'<form method="post" action="([^"]+)"', page.text) == ["/console/logout"]
    forged = await reader.post(
        f"/console/escalations/{esc}/acknowledge", data={"csrf": csrf_of(page.text)}
    )
    assert forged.status_code == 403
    assert 'data-code="forbidden"' in forged.text
    async with sessions() as session:
        status = await session.scalar(
            select(escalations.c.status).where(escalations.c.escalation_id == esc)
        )
    assert status == "open"
    await reader.aclose()


async def test_a_post_without_the_token_changes_nothing(api_url: str, sessions: Sessions) -> None:
    _, esc = await escalated(sessions)
    client = await signed_in(api_url, OPERATOR)
    answer = await client.post(f"/console/escalations/{esc}/acknowledge", data={"note": "no token"})
    assert answer.status_code == 403
    async with sessions() as session:
        status = await session.scalar(
            select(escalations.c.status).where(escalations.c.escalation_id == esc)
        )
    assert status == "open"
    await client.aclose()


async def test_another_tenant_sees_neither_the_escalation_nor_the_call(
    api_url: str, sessions: Sessions
) -> None:
    call, esc = await escalated(sessions)
    other = await signed_in(api_url, GLOBEX)
    assert 'data-testid="nav-escalations-count">0<' in (await other.get("/console/")).text
    page = await other.get(f"/console/escalations/{esc}")
    assert page.status_code == 404 and 'data-code="escalation_not_found"' in page.text
    page = await other.get(f"/console/calls/{call}")
    assert page.status_code == 404 and 'data-code="tool_call_not_found"' in page.text
    await other.aclose()


async def test_the_call_page_shows_both_statuses_and_escapes_the_input(
    api_url: str, sessions: Sessions
) -> None:
    call, esc = await escalated(sessions)
    client = await signed_in(api_url, OPERATOR)
    page = await client.get(f"/console/calls/{call}")
    assert page.status_code == 200
    assert re.search(r'data-testid="call-status">escalated<', page.text)
    assert re.search(r'data-testid="verification-status">inconclusive<', page.text)
    assert HOSTILE not in page.text and "&lt;script&gt;" in page.text
    assert f"/console/escalations/{esc}" in page.text
    # An escalated call may be retried by an operator: the form is there.
    assert f'action="/console/calls/{call}/retry"' in page.text
    bad = await client.get("/console/calls/a%20b")
    assert bad.status_code == 400 and 'data-code="validation_failed"' in bad.text
    await client.aclose()
