"""The console over plain HTTP (no browser): the session cookie's attributes, the
security headers, CSRF and origin refusals, scopes, tenant isolation and escaping.
The browser flows are in the other modules of this folder."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import httpx
import orjson
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from dispatcher import SubmitRequest, submit
from dispatcher.bus.recorder import Recorder
from dispatcher.bus.records import At, read
from dispatcher.capabilities import CapabilityRegistry
from dispatcher.schemas import Submission
from dispatcher.settings import BusRoute, Settings
from tests.fixtures.api import ALICE, BOB, GLOBEX, OPERATOR, READER, bearer, control_keys


@pytest.fixture
def api_settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"api_keys": control_keys(), "console_secure_cookie": False})


async def signed_in(api_url: str, key: str) -> httpx.AsyncClient:
    client = httpx.AsyncClient(base_url=api_url)
    answer = await client.post(
        "/console/login", data={"key": key, "next": "/console/"}, follow_redirects=False
    )
    assert answer.status_code == 303, answer.text
    return client


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert found is not None
    return found.group(1)


@pytest.fixture
async def operator(api_url: str) -> AsyncIterator[httpx.AsyncClient]:
    client = await signed_in(api_url, OPERATOR)
    yield client
    await client.aclose()


async def test_sign_in_sets_a_signed_http_only_strict_cookie_holding_no_key(
    api: httpx.AsyncClient,
) -> None:
    answer = await api.post("/console/login", data={"key": OPERATOR, "next": "/console/"})
    assert answer.status_code == 303
    assert answer.headers["location"] == "/console/"
    cookie = answer.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Max-Age=" in cookie
    assert OPERATOR not in cookie


async def test_a_wrong_key_is_refused_with_the_form_again(api: httpx.AsyncClient) -> None:
    answer = await api.post("/console/login", data={"key": "nope"})
    assert answer.status_code == 401
    assert "set-cookie" not in answer.headers
    assert 'data-code="unauthenticated"' in answer.text


async def test_without_a_session_a_page_sends_to_the_sign_in_form(api: httpx.AsyncClient) -> None:
    answer = await api.get("/console/?status=open")
    assert answer.status_code == 303
    assert answer.headers["location"] == "/console/login?next=%2Fconsole%2F%3Fstatus%3Dopen"


async def test_pages_send_the_security_headers(operator: httpx.AsyncClient) -> None:
    answer = await operator.get("/console/")
    assert answer.status_code == 200
    csp = answer.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "default-src 'none'" in csp
    assert answer.headers["x-frame-options"] == "DENY"
    assert 'data-testid="nav-escalations-count">0<' in answer.text


async def test_a_form_without_its_token_or_from_another_site_is_refused(
    operator: httpx.AsyncClient,
) -> None:
    home = await operator.get("/console/")
    token = csrf_of(home.text)
    no_token = await operator.post("/console/logout", data={"note": "no token"})
    assert no_token.status_code == 403
    assert 'data-code="csrf_rejected"' in no_token.text
    elsewhere = await operator.post(
        "/console/logout", data={"csrf": token}, headers={"origin": "https://evil.example"}
    )
    assert elsewhere.status_code == 403
    # Still signed in: neither post did anything.
    assert (await operator.get("/console/")).status_code == 200
    out = await operator.post("/console/logout", data={"csrf": token})
    assert out.status_code == 303


async def test_an_open_redirect_after_sign_in_goes_home_instead(api: httpx.AsyncClient) -> None:
    answer = await api.post("/console/login", data={"key": BOB, "next": "//evil.example/x"})
    assert answer.headers["location"] == "/console/"


async def test_a_read_key_sees_no_action_and_tenant_b_sees_nothing_of_a(
    api_url: str, api: httpx.AsyncClient
) -> None:
    reader = await signed_in(api_url, READER)
    page = await reader.get("/console/")
    assert page.status_code == 200
    # The only form that posts is signing out.
    assert re.findall(r'<form method="post" action="([^"]+)"', page.text) == ["/console/logout"]
    await reader.aclose()
    other = await signed_in(api_url, GLOBEX)
    missing = await other.get("/console/escalations/esc-of-acme")
    assert missing.status_code == 404
    assert 'data-code="escalation_not_found"' in missing.text
    await other.aclose()


async def test_a_call_page_names_where_the_call_came_from(
    api: httpx.AsyncClient,
    operator: httpx.AsyncClient,
    engine: AsyncEngine,
    registry: CapabilityRegistry,
    settings: Settings,
) -> None:
    request = {"runId": "run-o", "capabilityId": "send-email", "input": {"to": "a@x.io"}}
    posted = await api.post("/v1/tool-calls", json=request, headers=bearer(ALICE))
    assert posted.status_code == 201, posted.text
    async with AsyncSession(engine) as session, session.begin():
        library = await submit(
            session, SubmitRequest.model_validate(request), tenant="acme", registry=registry
        )
    route = BusRoute("t.requests.acme", "acme")
    headers = [("ce_specversion", b"1.0"), ("ce_id", b"e-1"), ("ce_source", b"/t"),
               ("ce_type", b"tool.call.submit")]  # fmt: skip
    record = read(route, At(route.topic, 3, 41), None, orjson.dumps(request), headers, 65536)
    [outcome] = (await Recorder(engine, registry, settings.topics()).record([record])).outcomes
    assert isinstance(outcome.result, Submission)
    shown = {}
    for name, call in [
        ("http", posted.json()["toolCallId"]),
        ("library", library.view.tool_call_id),
        ("bus", outcome.result.view.tool_call_id),
    ]:
        page = await operator.get(f"/console/calls/{call}")
        found = re.search(r'data-testid="origin">([^<]*)<', page.text)
        assert found is not None, page.text
        shown[name] = found.group(1)
    assert shown == {
        "http": "HTTP API",
        "library": "library call (in the caller&#39;s transaction)",
        "bus": "bus: t.requests.acme partition 3 offset 41",
    }
