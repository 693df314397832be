"""The demo tells the whole refund story and exits 0 only when every step behaved."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.postgres, pytest.mark.kafka, pytest.mark.slow]


def test_demo_runs_the_refund_story(
    database_url: str, kafka_bootstrap: str, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOL_DISPATCHER_")}
    env.update(
        {
            "TOOL_DISPATCHER_DATABASE_URL": database_url,
            "TOOL_DISPATCHER_KAFKA_BOOTSTRAP": kafka_bootstrap,
            "TOOL_DISPATCHER_KAFKA_ENABLE_IDEMPOTENCE": "false",
            "TOOL_DISPATCHER_STATE_DIR": str(tmp_path),
            # Topics of its own on the shared test broker.
            "TOOL_DISPATCHER_DISPATCH_TOPIC": f"demo-commands-{tmp_path.name}",
            "TOOL_DISPATCHER_EVENTS_TOPIC": f"demo-events-{tmp_path.name}",
            "TOOL_DISPATCHER_WORKER_GROUP_ID": f"demo-workers-{tmp_path.name}",
        }
    )
    done = subprocess.run(
        [sys.executable, "-m", "devtools", "demo"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    summary = re.search(r"^(\d+) of (\d+) steps behaved as expected$", out, re.MULTILINE)
    assert summary is not None and summary.group(1) == summary.group(2)
    assert "[FAIL]" not in out
    assert "result_unknown -> confirmed" in out  # the lost answer, settled by the reconciler
    assert "result_unknown -> escalated" in out  # the lookup that never answers
    assert "proposed -> authorized -> dispatching" in out  # approved once, then dispatched
    assert "proposed -> cancelled" in out  # the stopped run's queued call
    effects = out.split("never more than 1):")[1].split("\n\n")[0].split()
    assert effects and all(n == "1" for n in effects[1::2])
