"""A toolCallId is scoped per tenant: another tenant's ids are invisible in every
answer, 409 included, over HTTP."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from sqlalchemy import select

from dispatcher.db.tables import approvals
from dispatcher.intake.service import submit_many
from dispatcher.schemas import Submission, SubmitRequest
from dispatcher.settings import Settings, load_settings
from tests.fixtures.api import ACME_KEY, GLOBEX_KEY, api_keys, bearer

pytestmark = pytest.mark.postgres

ACME = bearer(ACME_KEY)
GLOBEX = bearer(GLOBEX_KEY)


@pytest.fixture
def api_settings(database_url: str) -> Settings:
    return load_settings({"database_url": database_url, "api_keys": api_keys()})


def email(call: str, to: str, **fields: Any) -> dict[str, Any]:
    return {
        "runId": "run-1",
        "capabilityId": "send-email",
        "toolCallId": call,
        "input": {"to": to},
        **fields,
    }


async def test_two_tenants_each_own_one_tool_call_id(api: httpx.AsyncClient) -> None:
    # Globex takes the id first: acme is not refused, and each sees only its own call.
    theirs = await api.post("/v1/tool-calls", json=email("x", "b@globex.example"), headers=GLOBEX)
    ours = await api.post(
        "/v1/tool-calls", json=email("x", "a@acme.example", idempotencyKey="k-a"), headers=ACME
    )
    assert (theirs.status_code, ours.status_code) == (201, 201), (theirs.text, ours.text)

    for headers, to in ((ACME, "a@acme.example"), (GLOBEX, "b@globex.example")):
        seen = await api.get("/v1/tool-calls/x", headers=headers)
        assert seen.status_code == 200 and seen.json()["input"] == {"to": to}

    # Acme's replay with its key is a replay of acme's call, not a conflict.
    replay = await api.post(
        "/v1/tool-calls", json=email("x", "a@acme.example", idempotencyKey="k-a"), headers=ACME
    )
    assert replay.status_code == 200 and replay.json() == ours.json()
    # Named no key: its default key is qualified by its tenant, as the provider sees
    # every tenant's keys.
    assert theirs.json()["idempotencyKey"] == "globex:x"


async def test_no_answer_tells_whether_another_tenant_has_an_id(api: httpx.AsyncClient) -> None:
    taken = await api.post(
        "/v1/tool-calls", json=email("only-acme", "a@acme.example"), headers=ACME
    )
    assert taken.status_code == 201
    # A probe for acme's id from globex reads exactly like a fresh id: 201, its own call.
    probe = await api.post(
        "/v1/tool-calls", json=email("only-acme", "b@globex.example"), headers=GLOBEX
    )
    fresh = await api.post(
        "/v1/tool-calls", json=email("never-used", "b@globex.example"), headers=GLOBEX
    )
    assert (probe.status_code, fresh.status_code) == (201, 201), probe.text
    assert probe.json()["input"] == {"to": "b@globex.example"}
    # Within one tenant an id is still one call: a second use under another input is 409.
    clash = await api.post(
        "/v1/tool-calls",
        json=email("only-acme", "c@acme.example", idempotencyKey="k-c"),
        headers=ACME,
    )
    assert clash.status_code == 409 and clash.json()["code"] == "tool_call_id_conflict"
    assert (await api.get("/v1/tool-calls/only-acme", headers=ACME)).json()["input"] == {
        "to": "a@acme.example"
    }


async def test_a_call_keyed_by_its_bare_id_before_0007_is_still_replayed(
    api: httpx.AsyncClient,
) -> None:
    # Before migration 0007 the default key was the bare toolCallId: such a stored call
    # (written here with that key given) is found again by a replay that names no key.
    stored = await api.post(
        "/v1/tool-calls",
        json=email("legacy-1", "a@acme.example", idempotencyKey="legacy-1"),
        headers=ACME,
    )
    assert stored.status_code == 201
    replay = await api.post(
        "/v1/tool-calls", json=email("legacy-1", "a@acme.example"), headers=ACME
    )
    assert replay.status_code == 200, replay.text
    assert replay.json() == stored.json()


async def test_one_batch_gives_each_tenant_its_own_approval(sessions: Any, registry: Any) -> None:
    # Two tenants' calls with one toolCallId in one group commit, both needing approval:
    # each view carries its own tenant's approval, never the other's.
    request = SubmitRequest(
        run_id="run-1",
        capability_id="refund-order-approved",
        tool_call_id="same",
        input={"orderId": "o-1", "amount": 5},
    )
    async with sessions() as session, session.begin():
        outcomes = await submit_many(
            session, [(request, "acme"), (request, "globex")], registry=registry
        )
        rows = (await session.execute(select(approvals.c.tenant, approvals.c.approval_id))).all()
    recorded = {r.tenant: r.approval_id for r in rows}
    assert len(set(recorded.values())) == 2
    shown = {}
    for tenant, outcome in zip(("acme", "globex"), outcomes, strict=True):
        assert isinstance(outcome, Submission) and outcome.view.approval is not None
        shown[tenant] = outcome.view.approval.approval_id
    assert shown == recorded
