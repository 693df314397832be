"""`tool-dispatcher reconcile` as a long-running service: (re)started while the database
is away, it waits for it instead of exiting, then settles what is due. A real
subprocess, pointed at a database that does not exist until the test creates it (a
refused connection, as while a server restarts)."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest
from sqlalchemy import select

from devtools.databases import create_database, drop_database, unique_name, with_database
from devtools.registries import registry_of
from devtools.sandbox import SandboxServer
from dispatcher.db.engine import engine_for, session_factory
from dispatcher.db.tables import tool_calls
from tests.fixtures.calls import insert_unknown_calls
from tests.fixtures.capabilities import cron_capability, registry_file
from tests.fixtures.paths import REPO
from tests.fixtures.sandbox import create_at_sandbox
from tests.fixtures.waiting import eventually

pytestmark = pytest.mark.postgres


async def test_a_reconciler_started_while_the_database_is_down_waits_for_it(
    tmp_path: Path, pg_server_url: str, template_database: str, sandbox: SandboxServer
) -> None:
    name = unique_name("td_late")
    late_url = with_database(pg_server_url, name)
    log_path = tmp_path / "reconciler.log"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TOOL_DISPATCHER_")}
    env = {
        **clean,
        "TOOL_DISPATCHER_DATABASE_URL": late_url,
        "TOOL_DISPATCHER_CAPABILITIES_FILE": str(
            registry_file(tmp_path, registry_of(cron_capability(sandbox.url)))
        ),
        "TOOL_DISPATCHER_RECONCILE_INTERVAL_SECONDS": "0.2",
    }
    # Lazy: nothing connects before the database exists.
    engine = engine_for(late_url)
    sessions = session_factory(engine)
    with log_path.open("wb") as log:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tool_dispatcher", "reconcile",
            env=env, cwd=REPO, stdout=log, stderr=log,
        )  # fmt: skip
    try:

        async def failed_twice() -> bool:
            text = log_path.read_text(errors="replace")
            return proc.returncode is not None or text.count("reconcile: step failed") >= 2

        await eventually(failed_twice, what="two passes to fail on the missing database")
        assert proc.returncode is None, log_path.read_text(errors="replace")

        # The database comes back, with calls waiting for the reconciler.
        create_database(pg_server_url, name, template=template_database)
        keys = ["k-back-1", "k-back-2"]
        ids = await insert_unknown_calls(
            sessions, keys, "refund", external_ids=await create_at_sandbox(sandbox.url, keys)
        )

        async def settled() -> bool:
            async with sessions() as session:
                statuses = (
                    await session.execute(
                        select(tool_calls.c.status).where(tool_calls.c.tool_call_id.in_(ids))
                    )
                ).scalars()
                return proc.returncode is not None or set(statuses) == {"confirmed"}

        await eventually(
            settled, what="the reconciler to settle the calls once the database is back"
        )
        assert proc.returncode is None, log_path.read_text(errors="replace")
    finally:
        if proc.returncode is None:
            proc.terminate()
        code = await asyncio.wait_for(proc.wait(), 30)
        await engine.dispose()
        drop_database(pg_server_url, name)
    assert code == 0
