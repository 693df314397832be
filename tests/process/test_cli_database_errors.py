"""The operator commands tell an unreachable database (exit 1, one line) from a
database error that is a bug, which they do not disguise as an outage."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from devtools.embedded import free_port

REPO = Path(__file__).resolve().parents[2]


def run_cli(*args: str, database_url: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TOOL_DISPATCHER_")}
    return subprocess.run(
        [sys.executable, "-m", "tool_dispatcher", *args],
        env={**clean, "TOOL_DISPATCHER_DATABASE_URL": database_url},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


COMMANDS = [("approvals", "expire", "--once"), ("escalations", "list")]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_an_unreachable_database_exits_1_with_one_line(command: tuple[str, ...]) -> None:
    refused = f"postgresql://nobody@127.0.0.1:{free_port()}/none"

    result = run_cli(*command, database_url=refused)

    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "tool-dispatcher: error: cannot reach the database: OperationalError"
    ]


@pytest.mark.postgres
@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_a_database_bug_is_not_reported_as_an_outage(
    command: tuple[str, ...], empty_database_url: str
) -> None:
    # Reachable but unmigrated: UndefinedTable, which no retry fixes.
    result = run_cli(*command, database_url=empty_database_url)

    assert result.returncode == 1
    assert "cannot reach the database" not in result.stderr
    assert "UndefinedTable" in result.stderr
