"""The escalation queue through the real HTTP API (uvicorn on loopback) and the real
CLI (a subprocess): list, acknowledge, resolve, and resolving twice."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from sqlalchemy import insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.control.escalations import escalate
from dispatcher.db.errors import DbErrorClass, classify
from dispatcher.db.tables import escalations
from dispatcher.settings import ApiKey, Settings, hash_api_key
from dispatcher.states import ExecutionStatus as S
from tests.fixtures.api import bearer
from tests.fixtures.calls import insert_unknown_calls
from tests.fixtures.cli import run_cli
from tests.fixtures.rows import (
    call_row,
    escalation_messages,
    escalation_rows,
    event_payloads,
    outbox_rows,
)

pytestmark = pytest.mark.postgres

OPERATOR = "tdk_test_acme_operator"
READER = "tdk_test_acme_reader"
OTHER = "tdk_test_globex_operator"


@pytest.fixture
def api_settings(settings: Settings) -> Settings:
    keys = [
        ApiKey(
            sha256=hash_api_key(OPERATOR), tenant="acme", scopes=["read", "operate"], name="oncall"
        ),
        ApiKey(sha256=hash_api_key(READER), tenant="acme", scopes=["read"], name="dash"),
        ApiKey(sha256=hash_api_key(OTHER), tenant="globex", scopes=["read", "operate"]),
    ]
    return settings.model_copy(update={"api_keys": keys})


async def escalated_call(sessions: async_sessionmaker[AsyncSession], key: str) -> tuple[str, str]:
    """A call in ``escalated`` with its open escalation; returns (call, escalation)."""
    [call] = await insert_unknown_calls(sessions, [key], "refund-order-v2")
    async with sessions() as session, session.begin():
        view = await escalate(
            session,
            call,
            tenant="acme",
            expected=S.RESULT_UNKNOWN,
            reason="lookups kept timing out",
            evidence={"lastAnswer": {"observation": "lookup_failed"}},
            producer="tool-dispatcher.reconciler",
        )
    return call, view.escalation_id


async def test_a_second_open_of_the_same_episode_is_refused(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    """The UNIQUE (tenant, tool_call_id, episode) backstop: a second opener that got
    past the state machine (which today lets only one opener move the call) while the
    first one's open is in flight is refused by the database, and one escalation and
    one announcement remain."""
    [call] = await insert_unknown_calls(sessions, ["k-twice"], "refund-order-v2")

    async def second_open(episode: int) -> None:
        async with sessions() as session, session.begin():
            await session.execute(
                insert(escalations).values(
                    escalation_id="esc_second",
                    tool_call_id=call,
                    tenant="acme",
                    episode=episode,
                    status="open",
                    reason="a racing reconciler",
                    evidence={},
                )
            )

    async with sessions() as session, session.begin():
        first = await escalate(
            session,
            call,
            tenant="acme",
            expected=S.RESULT_UNKNOWN,
            reason="lookups kept timing out",
            evidence={},
            producer="tool-dispatcher.reconciler",
        )
        racing = asyncio.create_task(second_open(first.episode))
        await asyncio.sleep(0.2)  # the second insert reaches the index and waits on ours

    with pytest.raises(IntegrityError) as refused:
        await racing
    assert classify(refused.value) is DbErrorClass.CONSTRAINT
    assert "uq_escalations_call_episode" in str(refused.value.orig)
    assert [r["escalation_id"] for r in await escalation_rows(sessions)] == [first.escalation_id]
    assert len(await escalation_messages(sessions)) == 1


async def test_resolve_over_http_settles_the_call_and_twice_is_409(
    sessions: async_sessionmaker[AsyncSession], api: httpx.AsyncClient
) -> None:
    call, esc = await escalated_call(sessions, "k-http")
    body = {"finding": "confirmed_success", "reason": "the PSP dashboard shows the refund"}

    ack = await api.post(f"/v1/escalations/{esc}/acknowledge", headers=bearer(OPERATOR))
    assert ack.status_code == 200, ack.text
    assert ack.json()["status"] == "acknowledged"
    assert ack.json()["acknowledgedBy"] == "oncall@acme (api)"

    first = await api.post(f"/v1/escalations/{esc}/resolve", json=body, headers=bearer(OPERATOR))
    assert first.status_code == 200, first.text
    assert first.json()["finding"] == "confirmed_success"

    row = await call_row(sessions, call)
    assert (row["status"], row["verification_status"]) == ("confirmed", "confirmed_success")
    assert row["reconciliation_status"] == "settled"
    last = (await event_payloads(sessions, call))[-1]
    assert last["reason"] == body["reason"]
    assert last["by"] == {"name": "oncall", "tenant": "acme", "via": "api"}

    again = await api.post(f"/v1/escalations/{esc}/resolve", json=body, headers=bearer(OPERATOR))
    assert again.status_code == 409
    assert again.headers["content-type"] == "application/problem+json"
    assert again.json()["code"] == "escalation_already_resolved"
    kinds = [
        r["headers"]["ce_type"] for r in await outbox_rows(sessions, "tool-dispatcher.escalations")
    ]
    assert kinds == ["tool.call.escalation.opened", "tool.call.escalation.resolved"]


async def test_list_is_tenant_scoped_and_open_first(
    sessions: async_sessionmaker[AsyncSession], api: httpx.AsyncClient
) -> None:
    _, done = await escalated_call(sessions, "k-a")
    await api.post(
        f"/v1/escalations/{done}/resolve",
        json={"finding": "compensated", "reason": "reversed by hand"},
        headers=bearer(OPERATOR),
    )
    call, open_one = await escalated_call(sessions, "k-b")

    listed = await api.get("/v1/escalations", headers=bearer(READER))
    assert listed.status_code == 200
    items: list[dict[str, Any]] = listed.json()["escalations"]
    assert [e["escalationId"] for e in items] == [open_one, done]
    assert items[0]["evidence"]["call"]["toolCallId"] == call
    assert (
        items[0]["evidence"]["commands"]["http"][0]
        == f"POST /v1/escalations/{open_one}/acknowledge"
    )
    only_open = await api.get("/v1/escalations?status=open", headers=bearer(READER))
    assert [e["escalationId"] for e in only_open.json()["escalations"]] == [open_one]

    others = (await api.get("/v1/escalations", headers=bearer(OTHER))).json()
    assert others == {"escalations": [], "next": None}
    foreign = await api.post(
        f"/v1/escalations/{open_one}/resolve",
        json={"finding": "confirmed_failure", "reason": "x"},
        headers=bearer(OTHER),
    )
    assert (foreign.status_code, foreign.json()["code"]) == (404, "escalation_not_found")


async def test_resolving_needs_the_operate_scope_and_a_valid_finding(
    sessions: async_sessionmaker[AsyncSession], api: httpx.AsyncClient
) -> None:
    _, esc = await escalated_call(sessions, "k-c")
    denied = await api.post(
        f"/v1/escalations/{esc}/resolve",
        json={"finding": "confirmed_success", "reason": "x"},
        headers=bearer(READER),
    )
    assert (denied.status_code, denied.json()["code"]) == (403, "forbidden")
    bad = await api.post(
        f"/v1/escalations/{esc}/resolve",
        json={"finding": "probably_fine", "reason": "x"},
        headers=bearer(OPERATOR),
    )
    assert (bad.status_code, bad.json()["code"]) == (400, "validation_failed")
    assert (await api.get("/v1/escalations")).status_code == 401


async def test_resolve_with_the_cli_and_twice_exits_1(
    sessions: async_sessionmaker[AsyncSession], database_url: str
) -> None:
    call, esc = await escalated_call(sessions, "k-cli")
    env = {"TOOL_DISPATCHER_DATABASE_URL": database_url}

    listed = run_cli("escalations", "list", **env)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.startswith(f"{esc} open call={call}")

    ack = run_cli("escalations", "ack", esc, "--by", "alice", **env)
    assert ack.returncode == 0, ack.stderr
    assert " acknowledged " in ack.stdout

    args = (
        "escalations",
        "resolve",
        esc,
        "--finding",
        "confirmed_failure",
        "--reason",
        "no refund",
    )
    done = run_cli(*args, "--by", "alice", **env)
    assert done.returncode == 0, done.stderr
    assert "finding=confirmed_failure" in done.stdout
    row = await call_row(sessions, call)
    assert (row["status"], row["verification_status"]) == ("confirmed", "confirmed_failure")
    assert (await event_payloads(sessions, call))[-1]["by"] == {
        "name": "alice",
        "tenant": None,
        "via": "cli",
    }

    twice = run_cli(*args, **env)
    assert twice.returncode == 1
    assert twice.stderr.count("\n") == 1 and "already resolved" in twice.stderr

    unknown = run_cli("escalations", "ack", "esc_nope", **env)
    assert unknown.returncode == 2
    assert unknown.stderr.strip() == "tool-dispatcher: error: no escalation 'esc_nope'"
    bad = run_cli("escalations", "resolve", esc, "--finding", "maybe", "--reason", "x", **env)
    assert bad.returncode == 2 and len(bad.stderr.splitlines()) == 1
