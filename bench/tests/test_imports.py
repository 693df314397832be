"""The benchmarks run as ``python -m bench.<name>`` on the installed packages alone: no
module of ``bench/`` imports the test suite or edits ``sys.path`` to reach it, and
each one imports."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from tests.fixtures.paths import REPO

MODULES = sorted((REPO / "bench").glob("*.py"))


def offences(path: Path) -> list[str]:
    """Each import of ``tests`` and each use of ``sys.path`` in ``path``, by line."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""] if node.level == 0 else []
        else:
            names = []
        found += [(node.lineno, f"imports {n}") for n in names if n.split(".")[0] == "tests"]
        if (
            isinstance(node, ast.Attribute)
            and node.attr == "path"
            and isinstance(node.value, ast.Name)
            and node.value.id == "sys"
        ):
            found.append((node.lineno, "touches sys.path"))
    return [f"line {line}: {what}" for line, what in sorted(found)]


def test_there_are_benchmarks() -> None:
    assert {"intake.py", "dispatch.py", "relay.py", "reconcile.py"} <= {p.name for p in MODULES}


@pytest.mark.parametrize("path", MODULES, ids=[p.stem for p in MODULES])
def test_bench_module_stands_on_the_installed_packages(path: Path) -> None:
    assert offences(path) == []
    importlib.import_module(f"bench.{path.stem}")


def test_offences_are_seen(tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text(
        "import sys\nsys.path.insert(0, '.')\nfrom tests.fixtures.api import bearer\n"
        "import tests.fixtures.rows\nfrom . import harness\n"
    )
    assert offences(planted) == [
        "line 2: touches sys.path",
        "line 3: imports tests.fixtures.api",
        "line 4: imports tests.fixtures.rows",
    ]
