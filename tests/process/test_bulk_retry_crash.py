"""A bulk retry of 5,000 failed calls on the real API and worker processes: the dry run
counts what the operation then touches; the worker working it is killed with SIGKILL
halfway through and another worker resumes it once its lease lapses; in the end every
call was retried exactly once (one ``tool.call.retried`` event each, caused by the
operation, and one touched-call row each), and the progress the API showed along the
way never went back and ended at the total."""

from __future__ import annotations

import asyncio
import collections
import json
import signal
import time

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from devtools.embedded import free_port
from devtools.sandbox import SandboxServer
from dispatcher.settings import hash_api_key
from tests.fixtures.operations import failed_calls, retried_events, statuses, touched_rows
from tests.fixtures.stack import MakeStack, ProcessStack
from tests.fixtures.waiting import eventually

pytestmark = [pytest.mark.postgres, pytest.mark.kafka, pytest.mark.slow, pytest.mark.process]

Sessions = async_sessionmaker[AsyncSession]
KEY = "tdk_bulk_oncall"
CALLS = 5_000


@pytest.fixture
def stack(make_stack: MakeStack, sandbox: SandboxServer) -> ProcessStack:
    keys = [{"sha256": hash_api_key(KEY), "tenant": "acme", "scopes": ["read", "operate"]}]
    return make_stack(
        sandbox_url=sandbox.url,
        http_port=free_port(),
        api_keys=json.dumps(keys),
        # Small batches, so the kill lands mid-operation; a short lease, so the
        # resuming worker need not wait long for the dead one's to lapse.
        operation_batch_size=100,
        operation_lease_seconds=2,
        operation_interval_seconds=0.2,
    )


async def test_a_bulk_retry_killed_halfway_resumes_and_retries_each_call_once(
    stack: ProcessStack, sessions: Sessions
) -> None:
    ids = [f"bulk-{i:05d}" for i in range(CALLS)]
    await failed_calls(sessions, ids)
    api = stack.start("serve")
    base = f"http://127.0.0.1:{stack.env['TOOL_DISPATCHER_HTTP_PORT']}"
    async with httpx.AsyncClient(
        base_url=base, headers={"Authorization": f"Bearer {KEY}"}, timeout=30
    ) as client:

        async def up() -> bool:
            assert api.poll() is None, stack.log_of(api)
            try:
                return (await client.get("/readyz")).status_code == 200
            except httpx.TransportError:
                return False

        await eventually(up, what="the API to be ready")
        body = {"kind": "retry", "reason": "provider fixed", "filter": {"status": ["failed"]}}
        dry = (await client.post("/v1/operations?dryRun=true", json=body)).json()
        assert dry["count"] == CALLS
        made = await client.post("/v1/operations", json=body)
        assert made.status_code == 201, made.text
        op_id = made.json()["operationId"]
        assert made.json()["total"] == CALLS
        seen: list[int] = []

        async def progress() -> dict[str, int | str]:
            view = (await client.get(f"/v1/operations/{op_id}")).json()
            seen.append(view["done"] + view["failed"])
            return dict(view)

        started = time.monotonic()
        first = stack.start("worker", name="worker-0")

        async def halfway() -> bool:
            assert first.poll() is None, stack.log_of(first)
            return int((await progress())["done"]) >= CALLS * 3 // 10

        await eventually(halfway, every=0.05, what="the operation to be under way")
        first.send_signal(signal.SIGKILL)
        first.wait()
        stopped_at = (await progress())["done"]
        assert isinstance(stopped_at, int) and stopped_at < CALLS, "killed too late"
        # Nothing moves while nobody holds it: the dead worker's lease must lapse.
        stack.start("worker", name="worker-1")

        async def finished() -> bool:
            return (await progress())["state"] == "completed"

        await eventually(finished, every=0.1, within=240, what="the operation to complete")
        took = time.monotonic() - started
        final = await progress()
    assert seen == sorted(seen), "progress went back"
    assert seen[-1] == CALLS
    assert (final["done"], final["failed"], final["total"]) == (CALLS, 0, CALLS)
    events = await retried_events(sessions, "acme")
    per_call = collections.Counter(e["tool_call_id"] for e in events)
    assert set(per_call) == set(ids)
    assert set(per_call.values()) == {1}, [c for c, n in per_call.items() if n > 1][:5]
    assert {e["causation_id"] for e in events} == {op_id}
    touched = await touched_rows(sessions, op_id)
    assert len(touched) == CALLS
    assert {t["outcome"] for t in touched} == {"done"}
    assert set((await statuses(sessions, "acme")).values()) == {"authorized"}
    print(f"5,000 calls retried in {took:.1f}s, killed at {stopped_at}")
    await asyncio.sleep(0)
