"""``GET /v1/runs`` through the real HTTP API: the tenant's runs newest first, from
their summaries, walked by cursor, each run exactly once even while calls of the runs
move, runs are stopped and new runs begin; the busy filter splits them; another
tenant's runs never show."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.capabilities import CapabilityRegistry
from dispatcher.control import runs
from dispatcher.control.actor import Actor
from dispatcher.intake.service import submit_many
from dispatcher.schemas import SubmitRequest
from tests.fixtures.api import GLOBEX, READER, bearer
from tests.fixtures.capabilities import approval_capability, plain_capability

pytestmark = pytest.mark.postgres

Sessions = async_sessionmaker[AsyncSession]
LIST = "/v1/runs"


@pytest.fixture
def registry() -> CapabilityRegistry:
    caps = [approval_capability("refund-big"), plain_capability("send")]
    return CapabilityRegistry({c.id: c for c in caps})


async def seed(
    sessions: Sessions, registry: CapabilityRegistry, tenant: str, runs_: list[str], cap: str
) -> None:
    """A call in each of ``runs_``, all in one transaction (so under one created_at:
    the run id breaks the tie)."""
    async with sessions() as session, session.begin():
        outcomes = await submit_many(
            session,
            [
                (SubmitRequest(run_id=run, capability_id=cap, input={"orderId": run}), tenant)
                for run in runs_
            ],
            registry=registry,
        )
    assert all(not isinstance(o, Exception) for o in outcomes), outcomes


async def walk(api: httpx.AsyncClient, key: str, **params: Any) -> list[dict[str, Any]]:
    """Every page, following ``next`` until it is null."""
    listed: list[dict[str, Any]] = []
    after: str | None = None
    while True:
        query = {**params, **({"after": after} if after else {})}
        reply = await api.get(LIST, params=query, headers=bearer(key))
        assert reply.status_code == 200, reply.text
        body = reply.json()
        listed.extend(body["runs"])
        after = body["next"]
        if after is None:
            return listed


async def test_the_runs_are_walked_newest_first_each_exactly_once_while_they_move(
    api: httpx.AsyncClient, sessions: Sessions, registry: CapabilityRegistry
) -> None:
    older = [f"run-a{n:02d}" for n in range(23)]
    newer = [f"run-b{n:02d}" for n in range(14)]
    await seed(sessions, registry, "acme", older, "send")
    await seed(sessions, registry, "acme", newer, "refund-big")
    await seed(sessions, registry, "globex", ["run-a00", "run-g1"], "send")

    seen: list[dict[str, Any]] = []
    after: str | None = None
    for page in range(100):
        query: dict[str, Any] = {"limit": 5, **({"after": after} if after else {})}
        reply = await api.get(LIST, params=query, headers=bearer(READER))
        assert reply.status_code == 200, reply.text
        body = reply.json()
        seen.extend(body["runs"])
        after = body["next"]
        if after is None:
            break
        # Meanwhile: a listed run and one still to come get new calls, one is stopped,
        # and a new run begins (newer than every page: not on this walk).
        await seed(sessions, registry, "acme", [seen[0]["runId"], older[-1 - page]], "send")
        async with sessions() as session, session.begin():
            await runs.stop_run(
                session, tenant="acme", run_id=older[page], reason="enough",
                actor=Actor("ops", "acme", "test"), registry=registry,
            )  # fmt: skip
        await seed(sessions, registry, "acme", [f"run-new{page}"], "send")

    ids = [r["runId"] for r in seen]
    assert ids == sorted(newer, reverse=True) + sorted(older, reverse=True)
    stamps = [(r["createdAt"], r["runId"]) for r in seen]
    assert stamps == sorted(stamps, reverse=True)

    # Each item as its summary has it; isBusy as the run's own view says.
    now = {r["runId"]: r for r in await walk(api, READER)}
    assert len(now) == len(older) + len(newer) + page  # a new run after each page but the last
    approving = now[newer[0]]
    assert approving["callsByStatus"] == {"proposed": 1} and approving["calls"] == 1
    assert approving["isBusy"] is False and approving["stopped"] is False
    stopped = now[older[0]]
    assert stopped["stopped"] is True and stopped["stoppedAt"] is not None
    assert stopped["updatedAt"] >= stopped["createdAt"]
    for run_id in (older[0], older[-1], newer[0], "run-new0"):
        view = (await api.get(f"/v1/runs/{run_id}", headers=bearer(READER))).json()
        assert now[run_id]["isBusy"] == view["isBusy"], run_id
        assert now[run_id]["calls"] == len(view["toolCalls"]), run_id
        assert now[run_id]["stopped"] == view["stopped"], run_id

    # The other tenant sees its own two runs only.
    assert [r["runId"] for r in await walk(api, GLOBEX)] == ["run-g1", "run-a00"]


async def test_the_busy_filter_splits_the_runs(
    api: httpx.AsyncClient, sessions: Sessions, registry: CapabilityRegistry
) -> None:
    await seed(sessions, registry, "acme", [f"run-s{n}" for n in range(7)], "send")
    await seed(sessions, registry, "acme", [f"run-p{n}" for n in range(6)], "refund-big")
    busy = [r["runId"] for r in await walk(api, READER, busy="true", limit=2)]
    idle = [r["runId"] for r in await walk(api, READER, busy="false", limit=2)]
    every = [r["runId"] for r in await walk(api, READER, limit=200)]
    assert busy == [f"run-s{n}" for n in reversed(range(7))]
    assert idle == [f"run-p{n}" for n in reversed(range(6))]
    assert every == idle + busy


@pytest.mark.parametrize(
    "query",
    [
        {"after": "bm90IGEgY3Vyc29y"},
        {"after": "not a cursor!"},
        {"limit": "0"},
        {"limit": "201"},
        {"busy": "maybe"},
    ],
)
async def test_a_bad_page_request_is_a_400(api: httpx.AsyncClient, query: dict[str, str]) -> None:
    reply = await api.get(LIST, params=query, headers=bearer(READER))
    assert reply.status_code == 400, reply.text
    assert reply.json()["code"] == "validation_failed"
