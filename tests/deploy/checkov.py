"""checkov, offline, with the repository's list of skipped checks."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from tests.deploy.manifests import DEPLOY, tool

SKIPS = DEPLOY / "checkov-skips.txt"
SKIP_LINE = re.compile(r"^(CKV2?_[A-Z0-9]+_\d+): (\S.{20,})$")


def skipped_checks() -> dict[str, str]:
    """Each skipped check and its reason (a line ``ID: reason``; # starts a comment)."""
    skips: dict[str, str] = {}
    for line in SKIPS.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        match = SKIP_LINE.match(line)
        assert match, f"not 'CHECK_ID: a written reason': {line!r}"
        skips[match[1]] = match[2]
    return skips


def run_checkov(path: Path, framework: str) -> list[str]:
    """The failed checks of one file, as ``ID resource`` lines."""
    result = subprocess.run(
        [
            tool("checkov"),
            "--file",
            str(path),
            "--framework",
            framework,
            "--output",
            "json",
            "--quiet",
            # No guideline download from the vendor's API: the tests run offline.
            "--skip-download",
            "--skip-check",
            ",".join(skipped_checks()),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.stdout.strip(), result.stderr
    report = json.loads(result.stdout)
    reports = report if isinstance(report, list) else [report]
    return [
        f"{check['check_id']} {check['resource']}"
        for one in reports
        for check in one.get("results", {}).get("failed_checks", [])
    ]
