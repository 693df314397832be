"""Size limits: no module over 400 lines and no function over 80, in the packages and
the examples. A split is preferred to an exception; an exception names its reason, and
one that is no longer needed fails the test too, so the list only shrinks.

Read with :mod:`ast`: a function runs from its ``def`` line to its last line
(decorators not counted), nested functions and methods each counted on their own.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("dispatcher", "outbox_relay", "reconciler", "kit", "tool_dispatcher", "examples")
EXEMPT_DIRECTORIES = ("dispatcher/db/migrations/versions",)
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80

# "path" for a module, "path:qualified.name" for a function.
EXCEPTIONS: dict[str, str] = {}


def function_lengths(source: str) -> dict[str, int]:
    """``{qualified name: lines}`` of every function and method in ``source``."""
    found: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{child.name}"
                assert child.end_lineno is not None
                found[name] = child.end_lineno - child.lineno + 1
                visit(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return found


def measured_files() -> list[Path]:
    files = [
        path
        for package in PACKAGES
        for path in sorted((REPO / package).rglob("*.py"))
        if not str(path.relative_to(REPO)).startswith(EXEMPT_DIRECTORIES)
    ]
    assert files, "no source files found"
    return files


def oversized() -> dict[str, int]:
    """Every module and function over its limit, with its length."""
    found: dict[str, int] = {}
    for path in measured_files():
        name, source = str(path.relative_to(REPO)), path.read_text()
        lines = len(source.splitlines())
        if lines > MAX_MODULE_LINES:
            found[name] = lines
        for function, length in function_lengths(source).items():
            if length > MAX_FUNCTION_LINES:
                found[f"{name}:{function}"] = length
    return found


def test_no_module_or_function_is_over_its_limit() -> None:
    over = {name: length for name, length in oversized().items() if name not in EXCEPTIONS}
    assert over == {}, f"split these (modules {MAX_MODULE_LINES}, functions {MAX_FUNCTION_LINES})"


def test_every_exception_is_still_needed() -> None:
    over = oversized()
    stale = sorted(name for name in EXCEPTIONS if name not in over)
    assert stale == [], "within the limits now (or gone): drop them from EXCEPTIONS"


def test_every_exception_gives_a_reason() -> None:
    assert [name for name, reason in EXCEPTIONS.items() if not reason.strip()] == []


def test_functions_are_measured_from_def_to_last_line() -> None:
    source = (
        "import functools\n"
        "@functools.cache\n"
        "def top():\n"
        "    def inner():\n"
        "        return 1\n"
        "    return inner\n"
        "class K:\n"
        "    async def method(self):\n"
        "        if True:\n"
        "            pass\n"
    )
    assert function_lengths(source) == {"top": 4, "top.inner": 2, "K.method": 3}
