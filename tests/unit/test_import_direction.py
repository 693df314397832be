"""Import direction: ``reconciler -> dispatcher -> outbox_relay``, never backwards.

Read from the source with :mod:`ast`, so an import inside a function or behind
``TYPE_CHECKING`` counts just the same.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.paths import REPO


def imported_modules(source: str, package: str) -> set[str]:
    """Absolute names of every module ``source`` imports; ``package`` is the package the
    file belongs to, used to resolve relative imports."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = parts[: len(parts) - (node.level - 1)]
                found.add(".".join([*base, *([node.module] if node.module else [])]))
            else:
                found.add(node.module or "")
    return found


def _package_of(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1])


def top_level_imports(package: str) -> dict[str, set[str]]:
    """``{file: {top-level packages it imports}}`` for every .py file of ``package``."""
    return {
        str(path.relative_to(REPO)): {
            name.partition(".")[0] for name in imported_modules(path.read_text(), _package_of(path))
        }
        for path in sorted((REPO / package).rglob("*.py"))
    }


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [
        ("outbox_relay", {"dispatcher", "reconciler"}),
        ("dispatcher", {"reconciler"}),
        ("telemetry", {"dispatcher", "reconciler", "outbox_relay"}),
    ],
)
def test_package_does_not_import_upstream(package: str, forbidden: set[str]) -> None:
    files = top_level_imports(package)
    assert files, f"no source files found for {package}"
    offenders = {
        path: sorted(names & forbidden) for path, names in files.items() if names & forbidden
    }
    assert offenders == {}


def test_dispatcher_is_seen_importing_outbox_relay() -> None:
    # The allowed direction is detected, so the test above is not passing vacuously.
    assert any("outbox_relay" in names for names in top_level_imports("dispatcher").values())


def test_every_import_form_is_seen() -> None:
    source = (
        "import dispatcher.intake.service\n"
        "import json as j, os\n"
        "from reconciler import x\n"
        "from . import sibling\n"
        "from ..other import y\n"
        "def f():\n"
        "    from dispatcher.states import S\n"
        "if TYPE_CHECKING:\n"
        "    from outbox_relay.table import T\n"
    )
    assert imported_modules(source, "pkg.sub") == {
        "dispatcher.intake.service",
        "json",
        "os",
        "reconciler",
        "pkg.sub",
        "pkg.other",
        "dispatcher.states",
        "outbox_relay.table",
    }


def _module_level_imports(source: str, package: str) -> set[str]:
    """Modules imported at module level (not inside a function), TYPE_CHECKING included."""
    tree = ast.parse(source)
    inner = {
        id(node)
        for fn in ast.walk(tree)
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef)
        for node in ast.walk(fn)
    }
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in inner or not isinstance(node, ast.Import | ast.ImportFrom):
            continue
        found |= imported_modules(ast.unparse(node), package)
    return found


def test_the_cli_reaches_dev_tooling_only_inside_its_handlers() -> None:
    # A production `serve` or `worker` must not load the sandbox or the chaos harness:
    # import-linter allows dispatcher.cli.dev -> dispatcher.testing; this keeps it lazy.
    offenders = {
        str(path.relative_to(REPO)): sorted(
            name
            for name in _module_level_imports(path.read_text(), "dispatcher.cli")
            if name.startswith("dispatcher.testing")
        )
        for path in sorted((REPO / "dispatcher" / "cli").glob("*.py"))
    }
    assert {path: names for path, names in offenders.items() if names} == {}
    lazy = imported_modules((REPO / "dispatcher" / "cli" / "dev.py").read_text(), "dispatcher.cli")
    assert any(name.startswith("dispatcher.testing") for name in lazy)


def test_a_production_command_does_not_load_dev_tooling() -> None:
    code = (
        "import sys\n"
        "from dispatcher.cli.main import build_parser\n"
        "build_parser().parse_args(['worker'])\n"
        "print(sorted(m for m in sys.modules if m.startswith('dispatcher.testing')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]"
