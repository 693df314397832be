"""Archived files are parsed from memory Arrow owns, without pyarrow's dataset scanner
or an Acero plan. A reader over Python bytes (or a Python file object) needs the GIL to
be freed, and a reader's last reference may be dropped on one of Arrow's threads as the
interpreter exits: that thread is ended inside a C++ destructor and the process aborts
("terminate called without an active exception", exit 134) after its work is done. It
happened to ``archive show`` of a missing run on a loaded CI machine; the core dump
showed a pool thread in ``PyBuffer``'s destructor, under a Parquet page reader. Found in
the source with :mod:`ast`, everywhere a process or a test worker reads an archive, so
the next reader added cannot bring either back."""

from __future__ import annotations

import ast
from datetime import date
from pathlib import Path

import pyarrow as pa
import pytest

from dispatcher.retention.archive import Archive, ArchiveUnavailable, encode, file_path, owned
from tests.fixtures.paths import REPO

PACKAGES = (
    "dispatcher", "reconciler", "kit", "tool_dispatcher", "devtools", "outbox_relay", "bench",
    "tests",
)  # fmt: skip
# Modules whose use starts the scanner or a plan; ``pq.read_table`` goes through a dataset.
MODULES = {"pyarrow.dataset", "pyarrow.acero"}
# Calls that scan, or that hand Arrow memory Python owns.
CALLS = {"read_table", "to_table", "dataset", "py_buffer", "PythonFile", "BytesIO"}


def name_of(func: ast.expr) -> str:
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def risky(node: ast.Call) -> str | None:
    """What is wrong with ``node``, if anything."""
    name = name_of(node.func)
    if name in CALLS:
        return name
    if name == "BufferReader":
        given = node.args[0] if node.args else None
        if not (isinstance(given, ast.Call) and name_of(given.func) == "owned"):
            return "BufferReader without owned()"
    return None


def imported(node: ast.AST) -> list[str]:
    """The modules (and ``module.name``s) an import statement names."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom):
        return [node.module or "", *(f"{node.module}.{a.name}" for a in node.names)]
    return []


def reader_risks(source: str) -> set[str]:
    """What in ``source`` imports a scanning module or makes a risky call, if the module
    uses pyarrow at all."""
    tree = ast.parse(source)
    imports = {module for node in ast.walk(tree) for module in imported(node)}
    if not any(m.startswith("pyarrow") for m in imports):
        return set()
    calls = {risky(n) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    return (imports & MODULES) | {c for c in calls if c}


def test_the_guard_sees_each_way_in() -> None:
    source = (
        "import io\nimport pyarrow.dataset as ds\nfrom pyarrow import acero\n"
        "t = pq.read_table(b)\nu = ds.dataset(p).to_table()\n"
        "v = pq.ParquetFile(pa.BufferReader(data)).read()\n"
        "w = pq.read_metadata(io.BytesIO(data))\nx = pa.py_buffer(data)\n"
    )
    assert reader_risks(source) == {
        "pyarrow.dataset", "pyarrow.acero", "read_table", "dataset", "to_table",
        "BufferReader without owned()", "BytesIO", "py_buffer",
    }  # fmt: skip
    safe = "import pyarrow as pa\nt = pq.ParquetFile(pa.BufferReader(owned(b))).read()\n"
    assert reader_risks(safe) == set()
    assert reader_risks("import io\nb = io.BytesIO()\n") == set()  # no pyarrow: not ours


def test_nothing_reads_an_archive_through_python_memory_or_the_scanner() -> None:
    found = {
        (path.relative_to(REPO).as_posix(), risk)
        for package in PACKAGES
        for path in (REPO / package).rglob("*.py")
        if path.name != "test_archive_reads.py"
        for risk in reader_risks(path.read_text())
    }
    assert found == set()


def test_owned_bytes_are_a_copy_in_arrow_memory() -> None:
    data = b"parquet bytes" * 100
    copy = owned(data)
    assert copy.to_pybytes() == data
    # A zero-copy view (py_buffer) would share the bytes object's address.
    assert copy.address != pa.py_buffer(data).address


def test_a_read_keeps_the_rows_whose_columns_hold_the_values(tmp_path: Path) -> None:
    archive = Archive(f"file://{tmp_path}")
    day = date(2026, 1, 2)
    old = pa.table({"run_id": ["r1", "r2"], "tenant": ["acme", "acme"]})
    # A later file with a column the earlier one lacks: unified, absent values null.
    new = pa.table({"run_id": ["r1", "r1"], "tenant": ["acme", "zeta"], "extra": [1, 2]})
    paths = []
    for batch, table in (("b1", old), ("b2", new)):
        file = encode(file_path("acme", day, "events", batch), "events", "acme", day, table)
        archive.put(file)
        paths.append(f"{archive.root}/{file.path}")

    kept = archive.read(paths, equal={"run_id": "r1", "tenant": "acme"})

    assert kept.to_pylist() == [
        {"run_id": "r1", "tenant": "acme", "extra": None},
        {"run_id": "r1", "tenant": "acme", "extra": 1},
    ]
    assert archive.read(paths).num_rows == 4
    assert archive.read([], equal={"run_id": "r1"}).num_rows == 0


def test_a_file_that_cannot_be_read_is_the_archive_failing(tmp_path: Path) -> None:
    archive = Archive(f"file://{tmp_path}")
    bad = tmp_path / "events-x.parquet"
    bad.write_bytes(b"not parquet")
    for path in (str(bad), str(tmp_path / "gone.parquet")):
        with pytest.raises(ArchiveUnavailable, match=f"reading {path}: "):
            archive.read([path])
