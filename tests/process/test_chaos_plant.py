"""The chaos checker catches a broken service: a short chaos run with a defence switched
off on purpose must fail on the invariant that guards it.

- ``blind-retry``: workers re-send lost requests blindly under a fresh idempotency key;
  invariant 3 (one effect per key, as the status says).
- ``stale-fence``: workers fence their outcomes by the status alone, so a zombie woken up
  while another worker holds its read-only call records over that claim; invariant 7
  (every move out of a claim made by its holder at its version).

(The clean run is CI's: `tool-dispatcher chaos --duration 90 --seed 7`.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.postgres, pytest.mark.kafka, pytest.mark.slow]


def planted_run(
    tmp_path: Path, pg_server_url: str, kafka_bootstrap: str, plant: str, duration: int
) -> tuple[dict[str, Any], str]:
    """A failing chaos run's report, and its summary and fault log (as printed)."""
    report = tmp_path / "report.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOL_DISPATCHER_")}
    env["TOOL_DISPATCHER_DATABASE_URL"] = pg_server_url
    env["TOOL_DISPATCHER_KAFKA_BOOTSTRAP"] = kafka_bootstrap
    env["TMPDIR"] = str(tmp_path)  # the failing run keeps its process logs there
    done = subprocess.run(
        [
            sys.executable, "-m", "dispatcher", "chaos", "--duration", str(duration),
            "--seed", "5", "--plant", plant, "--report", str(report),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr[-3000:]
    found: dict[str, Any] = json.loads(report.read_text())
    assert found["passed"] is False
    assert found["plant"] == plant
    assert "FAILED" in done.stdout
    return found, done.stdout + done.stderr[-3000:]


def test_blind_retry_is_reported_as_duplicate_effects(
    tmp_path: Path, pg_server_url: str, kafka_bootstrap: str
) -> None:
    found, _ = planted_run(tmp_path, pg_server_url, kafka_bootstrap, "blind-retry", 20)
    duplicates = found["violations"]["3"]
    assert duplicates["count"] > 0
    assert any("#blind-" in v for v in duplicates["samples"])


def test_stale_fence_is_reported_as_a_write_over_another_claim(
    tmp_path: Path, pg_server_url: str, kafka_bootstrap: str
) -> None:
    # The run leads with a zombie holding read-only calls (run.PLANTS): stopped at 4 s,
    # woken about 10 s later as another worker claims one of them again.
    found, printed = planted_run(tmp_path, pg_server_url, kafka_bootstrap, "stale-fence", 20)
    assert found["faults"].get("zombie_read_only", 0) >= 1
    stale = found["violations"]["7"]
    assert stale["count"] > 0, printed
    assert any("while the call was held by" in v for v in stale["samples"])
