"""`tool-dispatcher operations` as a real subprocess: a dry run counts and changes
nothing; `run --yes --foreground` records the operation, works it through in its own
process with the live bar (on stderr) and ends with the finished operation; `show`
and `cancel` read and refuse it as the API does; bad input exits 2 with one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from devtools.registries import sandbox_registry
from tests.fixtures.capabilities import registry_file
from tests.fixtures.cli import run_cli
from tests.fixtures.operations import failed_calls, retried_events, statuses

pytestmark = [pytest.mark.postgres, pytest.mark.process]

Sessions = async_sessionmaker[AsyncSession]


def env(database_url: str, tmp_path: Path) -> dict[str, str]:
    return {
        "TOOL_DISPATCHER_DATABASE_URL": database_url,
        "TOOL_DISPATCHER_CAPABILITIES_FILE": str(registry_file(tmp_path, sandbox_registry())),
        "TOOL_DISPATCHER_OPERATION_BATCH_SIZE": "7",
    }


async def test_the_cli_counts_runs_follows_and_refuses_a_second_cancel(
    database_url: str, sessions: Sessions, tmp_path: Path
) -> None:
    ids = [f"cli-{i}" for i in range(30)]
    await failed_calls(sessions, ids)
    await failed_calls(sessions, ["other"], tenant="globex")
    settings = env(database_url, tmp_path)
    base = ("operations", "run", "retry", "--tenant", "acme", "--reason", "fixed")

    dry = run_cli(*base, "--dry-run", **settings)
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.splitlines()[0] == "30 calls match"
    assert set((await statuses(sessions, "acme")).values()) == {"failed"}

    ran = run_cli(*base, "--yes", "--foreground", "--by", "night-shift", **settings)
    assert ran.returncode == 0, ran.stderr
    last = ran.stdout.splitlines()[-1].split()
    op_id = last[0]
    assert last[1:] == ["retry", "completed", "done=30", "refused=0", "total=30"]
    assert "30/30" in ran.stderr  # the bar's last state
    assert set((await statuses(sessions, "acme")).values()) == {"authorized"}
    assert (await statuses(sessions, "globex")) == {"other": "failed"}
    assert {e["causation_id"] for e in await retried_events(sessions, "acme")} == {op_id}

    shown = run_cli("operations", "show", op_id, "--json", **settings)
    assert json.loads(shown.stdout)["done"] == 30
    again = run_cli("operations", "cancel", op_id, **settings)
    assert again.returncode == 1
    assert "already completed" in again.stderr

    bad = run_cli(*base, "--status", "completed", "--dry-run", **settings)
    assert bad.returncode == 2
    assert bad.stderr.count("\n") == 1 and "bad operation" in bad.stderr
    await failed_calls(sessions, ["late"])
    not_tty = run_cli(*base, **settings)
    assert not_tty.returncode == 2 and "--yes" in not_tty.stderr
