"""The full-length outage, with the real process: a receiver down for 30 s while the
`tool-dispatcher webhooks` process keeps retrying (and is killed with SIGKILL halfway
and started again) still gets every notification, each under the ``webhook-id`` it had
before, and the process stops cleanly on SIGTERM. tests/webhooks/test_delivery.py holds
the same property in-process with the outage scaled down to a few seconds."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import Awaitable

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.db.tables import webhook_deliveries
from dispatcher.webhooks import notify
from tests.fixtures.paths import REPO
from tests.fixtures.waiting import eventually
from tests.webhooks.receiver import Receiver, new_secret

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

OUTAGE_SECONDS = 30
NOTIFICATIONS = 20


async def _sender(env: dict[str, str]) -> asyncio.subprocess.Process:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TOOL_DISPATCHER_")}
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tool_dispatcher",
        "webhooks",
        env={**clean, **env},
        cwd=REPO,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )


async def _ids(sessions: async_sessionmaker[AsyncSession]) -> set[str]:
    async with sessions() as session:
        return set(await session.scalars(select(webhook_deliveries.c.delivery_id)))


async def test_a_receiver_down_30_s_gets_everything_through_a_killed_sender(
    database_url: str, sessions: async_sessionmaker[AsyncSession]
) -> None:
    async with Receiver(new_secret()) as receiver:
        await receiver.down()
        sub = {"id": "ops", "tenant": "acme", "url": receiver.url, "events": ["breaker.opened"]}
        env = {
            "TOOL_DISPATCHER_DATABASE_URL": database_url,
            "TOOL_DISPATCHER_OPS_PORT": "0",
            "TOOL_DISPATCHER_WEBHOOKS__SUBSCRIPTIONS": json.dumps([sub]),
            "TOOL_DISPATCHER_WEBHOOKS__SECRETS": json.dumps({"ops": receiver.secret}),
            "TOOL_DISPATCHER_WEBHOOKS__BACKOFF_INITIAL_SECONDS": "0.5",
            "TOOL_DISPATCHER_WEBHOOKS__BACKOFF_MAX_SECONDS": "4",
            "TOOL_DISPATCHER_WEBHOOKS__MAX_ATTEMPTS": "1000",
            "TOOL_DISPATCHER_WEBHOOKS__LEASE_SECONDS": "5",
            "TOOL_DISPATCHER_WEBHOOKS__TIMEOUT_SECONDS": "2",
            "TOOL_DISPATCHER_WEBHOOKS__INTERVAL_SECONDS": "0.2",
        }
        for n in range(NOTIFICATIONS):
            async with sessions() as session, session.begin():
                await notify(session, event_type="breaker.opened", tenant=None, data={"n": n})
        first = await _sender(env)
        second: asyncio.subprocess.Process | None = None
        try:
            await eventually(lambda: _has(_ids(sessions), NOTIFICATIONS), what="the fan-out")
            ids = await _ids(sessions)
            # The outage is the scenario's length, not a bound on anything measured.
            await asyncio.sleep(OUTAGE_SECONDS / 2)
            first.send_signal(signal.SIGKILL)
            await first.wait()
            second = await _sender(env)
            await asyncio.sleep(OUTAGE_SECONDS / 2)
            await receiver.up()
            await eventually(lambda: _true(receiver.ids() == ids), within=120, what="all")
            second.send_signal(signal.SIGTERM)
            assert await second.wait() == 0
        finally:
            for process in (first, second):
                if process is not None and process.returncode is None:
                    process.kill()
                    await process.wait()
    # At least once: every notification, each under its one id (a copy would share it).
    assert {r.payload["data"]["n"] for r in receiver.accepted} == set(range(NOTIFICATIONS))
    assert await _ids(sessions) == set()


async def _has(found: Awaitable[set[str]], count: int) -> bool:
    return len(await found) == count


async def _true(value: object) -> bool:
    return bool(value)
