"""The identifier contract and storable input, over the real API: ids in bodies, paths
and the event cursor are printable ASCII without "/", input holds nothing PostgreSQL
cannot store, and a violation is a 400 ``validation_failed`` naming the field or JSON
path. A refused submission never reaches the group commit, so it fails no one else."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from dispatcher.db.tables import tool_calls
from tests.fixtures.api import ALICE, GLOBEX, OPERATOR, bearer

pytestmark = pytest.mark.postgres

SUBMIT = bearer(ALICE)
OTHER_TENANT = bearer(GLOBEX)
OPERATE = bearer(OPERATOR)
JSON = {"content-type": "application/json"}


def email(**fields: Any) -> dict[str, Any]:
    return {"runId": "run-1", "capabilityId": "send-email", "input": {"to": "a@b.c"}, **fields}


def assert_invalid(response: httpx.Response, field: str) -> dict[str, Any]:
    assert response.status_code == 400, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    problem: dict[str, Any] = response.json()
    assert problem["code"] == "validation_failed"
    assert problem["field"] == field, problem
    return problem


async def calls_recorded(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        return int((await conn.scalar(select(func.count()).select_from(tool_calls))) or 0)


# Raw JSON: NaN, Infinity and 1e400 are what Python's and pydantic's parsers accept, and
# what no JSON encoder on the way to PostgreSQL or a provider may write.
UNSTORABLE = [
    pytest.param(b'{"a": {"b": [1, 2, "x\\u0000y"]}}', "input.a.b[2]", id="nul-in-a-string"),
    pytest.param(b'{"x\\u0000": 1}', 'input["x\\u0000"]', id="nul-in-a-key"),
    pytest.param(b'{"amount": NaN}', "input.amount", id="nan"),
    pytest.param(b'{"amount": -Infinity}', "input.amount", id="infinity"),
    pytest.param(b'{"amount": [1e400]}', "input.amount[0]", id="1e400-overflows-to-inf"),
    pytest.param(b'{"a": ' * 33 + b"1" + b"}" * 33, "input" + ".a" * 33, id="depth-33"),
]


@pytest.mark.parametrize(("raw_input", "path"), UNSTORABLE)
async def test_unstorable_input_is_a_400_naming_its_json_path(
    api: httpx.AsyncClient, engine: AsyncEngine, raw_input: bytes, path: str
) -> None:
    body = b'{"runId": "run-1", "capabilityId": "send-email", "input": ' + raw_input + b"}"
    response = await api.post("/v1/tool-calls", content=body, headers={**SUBMIT, **JSON})
    assert_invalid(response, path)
    assert await calls_recorded(engine) == 0


async def test_input_nested_32_deep_is_accepted(api: httpx.AsyncClient) -> None:
    body = email(input=json.loads('{"a": ' * 32 + "1" + "}" * 32), idempotencyKey="deep")
    response = await api.post("/v1/tool-calls", json=body, headers=SUBMIT)
    assert response.status_code == 201, response.text


async def test_unstorable_submissions_fail_no_other_tenants_submission(
    api: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    bad = json.dumps(email(input={"a": "x\u0000y"}, runId="p")).encode()

    async def offender() -> httpx.Response:
        return await api.post("/v1/tool-calls", content=bad, headers={**SUBMIT, **JSON})

    async def valid(n: int) -> httpx.Response:
        body = email(idempotencyKey=f"globex-{n}", runId="run-b")
        return await api.post("/v1/tool-calls", json=body, headers=OTHER_TENANT)

    answers = await asyncio.gather(*(offender() for _ in range(6)), *(valid(n) for n in range(60)))

    for response in answers[:6]:
        assert_invalid(response, "input.a")
    assert [r.status_code for r in answers[6:]] == [201] * 60
    assert await calls_recorded(engine) == 60


BAD_IDS = [
    pytest.param("toolCallId", "tc-日本-1", id="non-ascii-tool-call-id"),
    pytest.param("toolCallId", "tc-\x01-1", id="control-char-in-tool-call-id"),
    pytest.param("toolCallId", "tc\r\nSet-Cookie: x=1", id="crlf-in-tool-call-id"),
    pytest.param("toolCallId", "a/b", id="slash-in-tool-call-id"),
    pytest.param("toolCallId", "..", id="dot-dot-tool-call-id"),
    pytest.param("toolCallId", "tc 1", id="space-in-tool-call-id"),
    pytest.param("runId", "r/1", id="slash-in-run-id"),
    pytest.param("runId", "run\x00", id="nul-in-run-id"),
    pytest.param("turnId", "t\x00", id="nul-in-turn-id"),
    pytest.param("correlationId", "c\u00e9", id="non-ascii-correlation-id"),
    pytest.param("causationId", "c\n", id="lf-in-causation-id"),
    pytest.param("reasoningObjectId", "r\x7f", id="del-in-reasoning-object-id"),
    pytest.param("idempotencyKey", "ключ", id="non-ascii-key"),
    pytest.param("idempotencyKey", "k\r\nX: y", id="crlf-in-key"),
    pytest.param("idempotencyKey", "k\x00", id="nul-in-key"),
    pytest.param("idempotencyKey", "k/1", id="slash-in-key"),
]


@pytest.mark.parametrize(("field", "value"), BAD_IDS)
async def test_an_id_outside_the_contract_is_refused_at_intake(
    api: httpx.AsyncClient, engine: AsyncEngine, field: str, value: str
) -> None:
    body = email(**{"idempotencyKey": "k-1", field: value})
    # ensure_ascii=False: the bytes on the wire are the id's own, as a producer sends them.
    raw = json.dumps(body, ensure_ascii=False).encode()
    response = await api.post("/v1/tool-calls", content=raw, headers={**SUBMIT, **JSON})
    assert_invalid(response, field)
    assert await calls_recorded(engine) == 0


async def test_every_printable_ascii_id_is_accepted_and_reachable(api: httpx.AsyncClient) -> None:
    # "?", "#" and "%" are legal in an id and mean something else in a URL: the
    # Location is encoded, and reading it finds the call.
    tool_call_id = "tc?#%1:!~"
    body = email(toolCallId=tool_call_id, idempotencyKey="k-" + tool_call_id)
    created = await api.post("/v1/tool-calls", json=body, headers=SUBMIT)
    assert created.status_code == 201, created.text
    assert created.headers["location"] == "/v1/tool-calls/tc%3F%23%251%3A%21~"
    found = await api.get(created.headers["location"], headers=SUBMIT)
    assert found.status_code == 200, found.text
    assert found.json()["toolCallId"] == tool_call_id


PATH_IDS = [
    pytest.param("GET", "/v1/tool-calls/abc%00def", "toolCallId", id="tool-call"),
    pytest.param("POST", "/v1/tool-calls/abc%01def/retry", "toolCallId", id="retry"),
    pytest.param("GET", "/v1/runs/r%00un", "runId", id="run-view"),
    pytest.param("GET", "/v1/runs/r%0Aun/events", "runId", id="run-events"),
    pytest.param("GET", "/v1/runs/run-1/events?after=x%00y", "after", id="event-cursor"),
    pytest.param("POST", "/v1/runs/r%E6%97%A5/stop", "runId", id="stop"),
    pytest.param("POST", "/v1/approvals/apr%00/decision", "approvalId", id="decision"),
    pytest.param("POST", "/v1/escalations/esc%00/acknowledge", "escalationId", id="ack"),
    pytest.param("POST", "/v1/escalations/esc%20x/resolve", "escalationId", id="resolve"),
    pytest.param("GET", f"/v1/tool-calls/{'x' * 201}", "toolCallId", id="too-long"),
]


@pytest.mark.parametrize(("method", "path", "field"), PATH_IDS)
async def test_a_malformed_path_id_is_a_400_naming_the_parameter(
    api: httpx.AsyncClient, method: str, path: str, field: str
) -> None:
    # Every key is allowed every route here, so the answer is about the id alone.
    headers = {**bearer(GLOBEX), **JSON}
    response = await api.request(method, path, headers=headers, content=b"{}")
    assert_invalid(response, field)


async def test_a_well_formed_unknown_id_is_still_a_404(api: httpx.AsyncClient) -> None:
    response = await api.get("/v1/tool-calls/no-such-call", headers=SUBMIT)
    assert response.status_code == 404
    assert response.json()["code"] == "tool_call_not_found"


async def test_a_nul_in_a_reason_is_a_400(api: httpx.AsyncClient) -> None:
    proposed = email(capabilityId="refund-order-approved", idempotencyKey="needs-approval")
    proposed["input"] = {"orderId": "o-1", "amountCents": 100}
    created = await api.post("/v1/tool-calls", json=proposed, headers=SUBMIT)
    assert created.status_code == 201, created.text
    listed = await api.get("/v1/approvals", headers=SUBMIT)
    [approval] = listed.json()["approvals"]
    decision = {"decision": "reject", "reason": "no\u0000"}

    decided = await api.post(
        f"/v1/approvals/{approval['approvalId']}/decision", json=decision, headers=SUBMIT
    )
    stopped = await api.post("/v1/runs/run-1/stop", json={"reason": "x\u0000"}, headers=OPERATE)
    retried = await api.post(
        f"/v1/tool-calls/{created.json()['toolCallId']}/retry",
        json={"reason": "x\u0000"},
        headers=OPERATE,
    )

    for response in (decided, stopped, retried):
        assert_invalid(response, "reason")
    # Nothing was decided or stopped.
    still = await api.get("/v1/approvals", headers=SUBMIT)
    assert [a["status"] for a in still.json()["approvals"]] == ["pending"]
    run = await api.get("/v1/runs/run-1", headers=SUBMIT)
    assert run.json()["stoppedAt"] is None
