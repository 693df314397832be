"""deploy/Dockerfile: hadolint finds nothing, and checkov fails none of its checks
(the skipped ones are in deploy/checkov-skips.txt, each with its reason)."""

from __future__ import annotations

import subprocess

from tests.deploy.checkov import run_checkov
from tests.deploy.manifests import DEPLOY, REPO, tool

DOCKERFILE = DEPLOY / "Dockerfile"


def test_hadolint_finds_nothing() -> None:
    result = subprocess.run(
        [tool("hadolint"), "--no-color", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert result.returncode == 0 and result.stdout == "", result.stdout + result.stderr


def test_checkov_fails_no_check_of_the_dockerfile() -> None:
    failed = run_checkov(DOCKERFILE, "dockerfile")

    assert failed == []


def test_the_image_is_what_the_manifests_expect() -> None:
    # The pods run as 10001 (runAsNonRoot checks a numeric USER) and pass only args.
    text = DOCKERFILE.read_text()
    assert "\nUSER 10001:10001\n" in text
    assert '\nENTRYPOINT ["tool-dispatcher"]\n' in text
    assert (REPO / ".dockerignore").is_file()
