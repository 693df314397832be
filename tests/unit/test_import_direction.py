"""Import direction: ``tool_dispatcher -> reconciler -> dispatcher -> outbox_relay -> kit``,
never backwards, and nothing of the product imports the dev tooling or the benchmarks.

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


# Outside the product: never imported by it, whatever the depth of the import.
_DEV = {"devtools", "bench", "tests"}


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [
        ("outbox_relay", {"dispatcher", "reconciler", "tool_dispatcher", *_DEV}),
        ("dispatcher", {"reconciler", "tool_dispatcher", *_DEV}),
        ("reconciler", {"tool_dispatcher", *_DEV}),
        ("tool_dispatcher", _DEV),
        ("kit", {"dispatcher", "reconciler", "outbox_relay", "tool_dispatcher", *_DEV}),
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


def test_a_production_command_does_not_load_dev_tooling() -> None:
    code = (
        "import sys\n"
        "from tool_dispatcher.main import build_parser\n"
        "build_parser().parse_args(['worker'])\n"
        "print(sorted(m for m in sys.modules if m.startswith('devtools')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]"
