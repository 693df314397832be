"""The product wheel (what the image installs) holds the product only: its five
packages, and no dev tooling (sandbox, chaos, demo, local stack, embedded servers),
benchmark or test; and its one command lists production subcommands only."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.fixtures.paths import REPO

PRODUCT = {"dispatcher", "outbox_relay", "reconciler", "kit", "tool_dispatcher"}
DEV_WORDS = ("sandbox", "chaos", "demo", "embedded", "hostile", "devtools", "mutation")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(REPO), "--no-deps",
         "--quiet", "--wheel-dir", str(out)],
        check=True,
        timeout=300,
        cwd=out,
    )  # fmt: skip
    [built] = out.glob("tool_dispatcher-*.whl")
    return zipfile.ZipFile(built)


def _packages(names: list[str]) -> set[str]:
    return {n.split("/")[0] for n in names if n.endswith(".py")}


def test_the_wheel_holds_the_product_packages_and_nothing_else(wheel: zipfile.ZipFile) -> None:
    names = wheel.namelist()
    assert _packages(names) == PRODUCT
    modules = [Path(n) for n in names if n.endswith(".py")]
    dev = sorted(str(m) for m in modules if any(w in m.as_posix() for w in DEV_WORDS))
    assert dev == []


def test_the_wheel_has_one_command_and_no_plugin_groups(wheel: zipfile.ZipFile) -> None:
    [points] = [n for n in wheel.namelist() if n.endswith("entry_points.txt")]
    text = wheel.read(points).decode()
    assert "[console_scripts]\ntool-dispatcher = tool_dispatcher.main:main" in text
    assert text.count("[") == 1, text


def test_the_help_lists_production_commands_only() -> None:
    found = subprocess.run(
        [sys.executable, "-m", "tool_dispatcher", "--help"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    commands = found.split("{", 1)[1].split("}", 1)[0].split(",")
    assert set(commands) == {
        "migrate", "serve", "worker", "bus-intake", "relay", "outbox", "recover",
        "api-key", "reconcile", "escalations", "approvals", "retention", "archive", "runs",
        "capabilities", "operations", "webhooks",
    }  # fmt: skip
