"""`tool-dispatcher retention --once` killed with SIGKILL at each of its crash points,
then run again: every call ends exactly once, in the archive or still live, and the
archive holds no row twice (read back with pyarrow and counted).

The history: 7 old finished calls through the real intake and worker (batches of 3:
three calls batches, so ``:N`` picks the batch), and a stopped run 40 days old whose
events are in a day of their own (the fourth batch is that day)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from dispatcher.provider.transport import Transport
from dispatcher.retention.archive import Archive
from tests.fixtures.capabilities import registry_file
from tests.fixtures.cli import run_cli
from tests.retention.history import (
    Sessions,
    age,
    assert_each_call_once,
    completed_calls,
    live_ids,
    partition_names,
    past_run,
    retention_registry,
)

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

POINTS = [
    "after-plan:1",
    "after-write:1",
    "after-verify:1",
    "mid-delete:1",
    "after-write:2",
    "mid-delete:3",
    "after-plan:4",
    "after-write:4",
    "after-verify:4",
]


def settings_env(
    database_url: str, tmp_path: Path, registry_path: Path, archive_url: str, **more: str
) -> dict[str, str]:
    return {
        "TOOL_DISPATCHER_DATABASE_URL": database_url,
        "TOOL_DISPATCHER_CAPABILITIES_FILE": str(registry_path),
        "TOOL_DISPATCHER_ARCHIVE_URL": archive_url,
        "TOOL_DISPATCHER_RETENTION_BATCH_SIZE": "3",
        "TOOL_DISPATCHER_STATE_DIR": str(tmp_path / "state"),
        **more,
    }


async def killed_then_rerun(
    sessions: Sessions,
    http: Transport,
    sandbox_url: str,
    database_url: str,
    tmp_path: Path,
    archive: Archive,
    point: str,
    **more: str,
) -> None:
    """The whole story at one crash point, against ``archive``."""
    registry = retention_registry(sandbox_url)
    await completed_calls(sessions, registry, http, run_id="run-old", count=7)
    await age(sessions, 40)
    await past_run(sessions)
    everything = await live_ids(sessions)
    env = settings_env(
        database_url, tmp_path, registry_file(tmp_path, registry), archive.url, **more
    )

    crashed = run_cli("retention", "--once", **env, TOOL_DISPATCHER_CRASH_AT=point)
    assert crashed.returncode == -signal.SIGKILL, (crashed.stdout, crashed.stderr)
    # Killed mid-batch, a call may be both archived and live until the next pass.
    await assert_each_call_once(sessions, archive, everything, settled=False)

    rerun = run_cli("retention", "--once", **env)
    assert rerun.returncode == 0, rerun.stderr
    assert "still due" in rerun.stdout and rerun.stdout.count("\n") == 1, rerun.stdout
    assert await live_ids(sessions) == set()
    await assert_each_call_once(sessions, archive, everything)
    assert "execution_events_p" + _forty_days_ago() not in await partition_names(sessions)


def _forty_days_ago() -> str:
    from datetime import UTC, datetime, timedelta

    return f"{datetime.now(UTC) - timedelta(days=40):%Y%m%d}"


@pytest.mark.parametrize("point", POINTS)
async def test_a_pass_killed_anywhere_loses_nothing_and_copies_nothing(
    sessions: Sessions,
    http: Transport,
    sandbox: object,
    database_url: str,
    tmp_path: Path,
    point: str,
) -> None:
    archive = Archive(f"file://{tmp_path / 'archive'}")
    url = sandbox.url  # type: ignore[attr-defined]
    await killed_then_rerun(sessions, http, url, database_url, tmp_path, archive, point)


async def test_a_verified_file_gone_missing_is_written_again_before_any_removal(
    sessions: Sessions,
    http: Transport,
    sandbox: object,
    database_url: str,
    tmp_path: Path,
) -> None:
    """Killed after the first batch was verified; its files then vanish from the store.
    The next pass verifies again, finds them gone, and writes them anew before it
    removes a single call."""
    archive = Archive(f"file://{tmp_path / 'archive'}")
    registry = retention_registry(sandbox.url)  # type: ignore[attr-defined]
    await completed_calls(sessions, registry, http, run_id="run-old", count=3)
    await age(sessions, 40)
    everything = await live_ids(sessions)
    env = settings_env(database_url, tmp_path, registry_file(tmp_path, registry), archive.url)

    crashed = run_cli("retention", "--once", **env, TOOL_DISPATCHER_CRASH_AT="after-verify:1")
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    lost = archive.fs.glob(f"{archive.root}/**/calls-*.parquet")
    assert lost
    for path in lost:
        archive.fs.rm_file(path)

    rerun = run_cli("retention", "--once", **env)
    assert rerun.returncode == 0, rerun.stderr
    assert await live_ids(sessions) == set()
    await assert_each_call_once(sessions, archive, everything)
