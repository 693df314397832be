"""`tool-dispatcher reconcile --once` as the cron job runs it: a real subprocess, a
capabilities file pointing at the in-test sandbox, overlapping runs."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from devtools.registries import SANDBOX_REGISTRY, registry_of
from devtools.sandbox import SandboxServer
from dispatcher.db.tables import escalations, tool_calls
from tests.fixtures.calls import insert_unknown_calls
from tests.fixtures.capabilities import cron_capability, registry_file
from tests.fixtures.cli import run_cli
from tests.fixtures.paths import REPO
from tests.fixtures.sandbox import add_fault, books, create_at_sandbox

pytestmark = pytest.mark.postgres


async def cli(env: dict[str, str], *args: str) -> tuple[int, str, str]:
    """``python -m tool_dispatcher`` without blocking the loop the sandbox runs on."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TOOL_DISPATCHER_")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tool_dispatcher",
        *args,
        env={**clean, **env},
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_cron_runs_settle_what_is_due_and_escalate_exactly_once(
    sessions: async_sessionmaker[AsyncSession],
    sandbox: SandboxServer,
    database_url: str,
    tmp_path: Path,
) -> None:
    found = ["k-ok-1", "k-ok-2"]
    await create_at_sandbox(sandbox.url, found)
    ok = await insert_unknown_calls(sessions, found, "refund")
    [stuck] = await insert_unknown_calls(sessions, ["k-stuck"], "refund")
    await add_fault(sandbox.url, {"kind": "timeout", "idempotencyKey": "k-stuck"})
    env = {
        "TOOL_DISPATCHER_DATABASE_URL": database_url,
        "TOOL_DISPATCHER_CAPABILITIES_FILE": str(
            registry_file(tmp_path, registry_of(cron_capability(sandbox.url)))
        ),
    }

    # Five overlapping cron runs.
    results = await asyncio.gather(*(cli(env, "reconcile", "--once") for _ in range(5)))

    assert [code for code, _, _ in results] == [0] * 5, results
    totals: dict[str, int] = {}
    for _, out, _ in results:
        lines = out.splitlines()
        assert [line.split(":")[0] for line in lines] == [
            "confirmed_success",
            "confirmed_failure",
            "compensated",
            "redispatched",
            "retry_later",
            "escalated",
            "taken_over",
        ]
        for line in lines:
            name, _, n = line.partition(": ")
            totals[name] = totals.get(name, 0) + int(n)
    assert totals["confirmed_success"] == 2
    assert totals["escalated"] == 1
    assert sum(totals.values()) == 3
    async with sessions() as session:
        statuses = {
            r.tool_call_id: r.status
            for r in await session.execute(select(tool_calls.c.tool_call_id, tool_calls.c.status))
        }
        records = (await session.execute(select(escalations.c.tool_call_id))).all()
    assert statuses == {ok[0]: "confirmed", ok[1]: "confirmed", stuck: "escalated"}
    assert [r.tool_call_id for r in records] == [stuck]
    assert (await books(sandbox.url))["effects"] == {"k-ok-1": 1, "k-ok-2": 1}

    # Nothing is due any more: a later run does nothing and still exits 0.
    code, out, _ = await cli(env, "reconcile", "--once")
    assert code == 0 and "escalated: 0" in out


def test_an_unreachable_database_exits_1() -> None:
    result = run_cli(
        "reconcile",
        "--once",
        TOOL_DISPATCHER_DATABASE_URL="postgresql://nobody@127.0.0.1:1/none",
        TOOL_DISPATCHER_CAPABILITIES_FILE=str(SANDBOX_REGISTRY),
    )
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "tool-dispatcher: error: cannot reach the database: OperationalError"
    ]


def test_without_a_database_setting_exits_2() -> None:
    result = run_cli("reconcile", "--once")
    assert result.returncode == 2
    assert "TOOL_DISPATCHER_DATABASE_URL" in result.stderr
