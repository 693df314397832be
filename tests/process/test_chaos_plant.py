"""The chaos checker catches a broken service: a short chaos run with a defence switched
off on purpose must fail on the invariant that guards it.

- ``blind-retry``: workers re-send lost requests blindly under a fresh idempotency key;
  invariant 3 (one effect per key, as the status says).
- ``stale-fence``: workers fence their outcomes by the status alone, so a zombie woken up
  while another worker holds its read-only call records over that claim; invariant 7
  (every move out of a claim made by its holder at its version).
- ``shared-keys``: every process of the service keys the outbox and the provider by the
  names alone, without their tenant, so the two tenants' calls of one idempotency key
  are one request to the provider, and a tenant's call waits behind the other tenant's
  dead letter of the same toolCallId; invariant 8 (no tenant's call affected by
  another tenant's).
- ``eager-retention``: the retention job archives and removes calls that can still move
  (escalated, with their escalations open); invariant 9 (retention archives a call
  once, only when it is finished, and nothing moves after).
- ``early-commit``: bus intake commits each fetched batch's offsets to Kafka before it
  records the batch, so a process killed mid-batch leaves records no one fetches again;
  invariant 10 (every request record the broker kept is answered once).

(The clean run is CI's: `python -m devtools chaos --duration 90 --seed 7`.)"""

from __future__ import annotations

import json
import os
import re
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
            sys.executable, "-m", "devtools", "chaos", "--duration", str(duration),
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


def test_shared_keys_are_reported_as_calls_affected_by_another_tenants(
    tmp_path: Path, pg_server_url: str, kafka_bootstrap: str
) -> None:
    # The tenants' ids meet from the first submissions, and the twin tenant's first
    # oversized call (the 3rd submission) is followed 6 s later by the first tenant's
    # call of the same toolCallId (devtools.chaos.load).
    found, printed = planted_run(tmp_path, pg_server_url, kafka_bootstrap, "shared-keys", 20)
    foreign = found["violations"]["8"]
    assert foreign["count"] > 0, printed
    shared = r"provider key \S+ is the key of calls of 2 tenants \(chaos: .+; chaos/twin: .+\)"
    assert any(re.fullmatch(shared + r", \d+ effect\(s\) applied under it", v)
               for v in foreign["samples"]), printed  # fmt: skip
    # Every row that waited behind a dead letter was another tenant's: the dead letters
    # are the twin tenant's escalations, and nothing of its own follows one.
    held = [v for v in foreign["samples"] if "waited behind dead letter" in v]
    assert held, printed
    assert len(held) == found["tenancy"]["rowsThatWaitedBehindThem"], printed
    assert all(v.startswith("row ") and "of tenant chaos waited" in v for v in held)


def test_eager_retention_is_reported_as_calls_archived_before_they_finished(
    tmp_path: Path, pg_server_url: str, kafka_bootstrap: str
) -> None:
    # Escalated calls (the documents the provider never finishes) sit for longer than
    # the run's retention age (15 s): the planted job takes them with their open
    # escalations, where the real one leaves them.
    found, printed = planted_run(tmp_path, pg_server_url, kafka_bootstrap, "eager-retention", 20)
    eager = found["violations"]["9"]
    assert eager["count"] > 0, printed
    assert any("archived while escalated" in v for v in eager["samples"]), eager
    assert found["retention"]["archivedCalls"] > 0


def test_early_commit_is_reported_as_records_never_answered(
    tmp_path: Path, pg_server_url: str, kafka_bootstrap: str
) -> None:
    # The run leads with a bus intake process killed while a batch it fetched (and,
    # planted, committed) waits at its first statement on a locked bus_offsets.
    found, printed = planted_run(tmp_path, pg_server_url, kafka_bootstrap, "early-commit", 20)
    assert found["faults"].get("kill_bus_intake", 0) >= 1
    assert any("(mid-batch)" in f["target"] for f in found["fault_log"]), printed
    lost = found["violations"]["10"]
    assert lost["count"] > 0, printed
    assert all(v.endswith("a record never answered") for v in lost["samples"]), lost
