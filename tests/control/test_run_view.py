"""The run view over the real HTTP API: what a screen needs, and exactly the fold of
the run's event log that anyone can fetch."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from dispatcher.capabilities import CapabilityRegistry
from dispatcher.schemas import EventView
from dispatcher.views.run_view import fold_run
from tests.fixtures.api import ALICE, BOB, GLOBEX, OPERATOR, bearer
from tests.fixtures.capabilities import approval_capability, plain_capability

pytestmark = pytest.mark.postgres


@pytest.fixture
def registry() -> CapabilityRegistry:
    caps = [approval_capability("refund-big", risk="high"), plain_capability("send")]
    return CapabilityRegistry({c.id: c for c in caps})


async def view_and_fold(api: httpx.AsyncClient, run_id: str) -> dict[str, Any]:
    """The endpoint's view, checked against a fold of the events endpoint's log."""
    view = await api.get(f"/v1/runs/{run_id}", headers=bearer(BOB))
    assert view.status_code == 200, view.text
    log = await api.get(f"/v1/runs/{run_id}/events", headers=bearer(BOB))
    events = [EventView.model_validate(e) for e in log.json()["events"]]
    rebuilt = fold_run(run_id, events).model_dump(by_alias=True, mode="json")
    body: dict[str, Any] = view.json()
    assert body == rebuilt
    assert body["lastEventId"] == events[-1].event_id
    return body


async def test_run_view_is_the_fold_of_its_event_log(api: httpx.AsyncClient) -> None:
    async def post(body: dict[str, Any]) -> str:
        reply = await api.post("/v1/tool-calls", json=body, headers=bearer(ALICE))
        assert reply.status_code == 201, reply.text
        return str(reply.json()["toolCallId"])

    first = await post({"runId": "run-v", "capabilityId": "refund-big", "input": {"o": 1}})
    second = await post({"runId": "run-v", "capabilityId": "refund-big", "input": {"o": 2}})
    queued = await post({"runId": "run-v", "capabilityId": "send", "input": {"to": "x"}})

    view = await view_and_fold(api, "run-v")
    assert view["isBusy"] is True and view["canStop"] is True and view["stopped"] is False
    assert [a["toolCallId"] for a in view["pendingApprovals"]] == [first, second]
    banner = view["approvalBanner"]
    assert banner["toolCallId"] == first and banner["pendingCount"] == 2
    assert banner["risk"] == "high"
    calls = {c["toolCallId"]: c for c in view["toolCalls"]}
    assert calls[first]["status"] == "proposed" and calls[queued]["status"] == "authorized"
    assert calls[queued]["verificationStatus"] == "not_observed"

    approval = banner["approvalId"]
    decided = await api.post(
        f"/v1/approvals/{approval}/decision",
        json={"decision": "reject", "reason": "no"},
        headers=bearer(BOB),
    )
    assert decided.status_code == 200, decided.text
    view = await view_and_fold(api, "run-v")
    assert [a["toolCallId"] for a in view["pendingApprovals"]] == [second]
    assert view["approvalBanner"]["pendingCount"] == 1

    stop = await api.post("/v1/runs/run-v/stop", json={"reason": "done"}, headers=bearer(OPERATOR))
    assert stop.status_code == 200
    view = await view_and_fold(api, "run-v")
    assert view["stopped"] is True and view["canStop"] is False and view["isBusy"] is False
    assert view["pendingApprovals"] == [] and view["approvalBanner"] is None
    assert view["stopReason"] == "done" and view["stoppedBy"]["name"] == "oncall"
    assert {c["status"] for c in view["toolCalls"]} == {"rejected", "cancelled"}


async def test_unknown_or_foreign_run_is_404(api: httpx.AsyncClient) -> None:
    await api.post(
        "/v1/tool-calls",
        json={"runId": "run-x", "capabilityId": "send", "input": {}},
        headers=bearer(ALICE),
    )
    for key, run in ((BOB, "run-nope"), (GLOBEX, "run-x")):
        reply = await api.get(f"/v1/runs/{run}", headers=bearer(key))
        assert reply.status_code == 404
        assert reply.json()["code"] == "run_not_found"
