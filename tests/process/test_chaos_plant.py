"""The chaos checker catches a broken service: a short chaos run whose workers re-send
lost requests blindly under a fresh idempotency key must fail on invariant 3.

(The clean run is CI's: `tool-dispatcher chaos --duration 90 --seed 7`.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.postgres, pytest.mark.kafka, pytest.mark.slow]


def test_blind_retry_is_reported_as_duplicate_effects(
    tmp_path: Path, pg_server_url: str, kafka_bootstrap: str
) -> None:
    report = tmp_path / "report.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOL_DISPATCHER_")}
    env["TOOL_DISPATCHER_DATABASE_URL"] = pg_server_url
    env["TOOL_DISPATCHER_KAFKA_BOOTSTRAP"] = kafka_bootstrap
    env["TMPDIR"] = str(tmp_path)  # the failing run keeps its process logs there
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "dispatcher",
            "chaos",
            "--duration",
            "20",
            "--seed",
            "5",
            "--plant",
            "blind-retry",
            "--report",
            str(report),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 1, done.stdout + done.stderr[-3000:]
    found = json.loads(report.read_text())
    assert found["passed"] is False
    assert found["plant"] == "blind-retry"
    duplicates = found["violations"]["3"]
    assert duplicates["count"] > 0
    assert any("#blind-" in v for v in duplicates["samples"])
    assert "FAILED" in done.stdout
