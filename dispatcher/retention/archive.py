"""The archive: one Parquet dataset, hive-partitioned by tenant and day, written through
fsspec to ``archive_url`` (``file://...`` or ``s3://bucket/prefix``, the latter with
the ``s3`` extra: s3fs).

Layout: ``<root>/tenant=<tenant>/day=<YYYY-MM-DD>/<table>-<batch>.parquet``, one file
per table (``calls``, ``events``, ``approvals``, ``escalations``) per batch per
partition. The tenant is percent-encoded (a tenant may hold ``/`` or ``=``); the
files also hold it as a column, which is what a query reads. The day is the call's
creation day (UTC), a run-level event's own day. A file's name is its batch's id,
derived from the batch's content, so writing a batch again replaces its files instead
of adding copies (:mod:`dispatcher.retention.batches`).

Every method is blocking I/O: the pass calls them in a thread.
"""

from __future__ import annotations

import functools
import hashlib
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date
from typing import Any
from urllib.parse import quote

import fsspec
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq


class ArchiveUnavailable(Exception):
    """The archive could not be reached, read or written (the pass stops; exit 1)."""


@dataclass(frozen=True, slots=True)
class Encoded:
    """One file of a batch, encoded and not yet written."""

    path: str  # relative to the archive's root
    table: str
    tenant: str
    day: date
    rows: int
    data: bytes

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    def entry(self) -> dict[str, Any]:
        """What the manifest records of it."""
        return {
            "path": self.path,
            "table": self.table,
            "tenant": self.tenant,
            "day": self.day.isoformat(),
            "rows": self.rows,
            "sha256": self.sha256,
        }


def encode(path: str, name: str, tenant: str, day: date, table: pa.Table) -> Encoded:
    # Written to Arrow's memory, not a Python file object (see `owned`).
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd")
    return Encoded(path, name, tenant, day, table.num_rows, sink.getvalue().to_pybytes())


def owned(data: bytes) -> pa.Buffer:
    """``data`` copied into memory Arrow owns, for a reader to parse. A buffer over
    Python bytes needs the GIL to be freed, and a reader's last reference to it may be
    dropped on one of Arrow's threads while the interpreter exits: that thread is ended
    inside a C++ destructor and the process aborts ("terminate called without an active
    exception", exit 134, after its work is done; seen in CI on ``archive show``)."""
    sink = pa.BufferOutputStream()
    sink.write(data)
    return sink.getvalue()


def file_path(tenant: str, day: date, table: str, batch_id: str) -> str:
    return f"tenant={quote(tenant, safe='')}/day={day.isoformat()}/{table}-{batch_id}.parquet"


class Archive:
    """The dataset at ``url``; ``options`` go to the filesystem (s3fs: endpoint_url,
    key, secret...)."""

    def __init__(self, url: str, options: Mapping[str, Any] | None = None) -> None:
        self.url = url.rstrip("/")
        try:
            self.fs, root = fsspec.core.url_to_fs(self.url, **dict(options or {}))
        except ImportError as exc:  # s3:// without s3fs installed
            raise ValueError(f"{url.split('://')[0]}:// needs {exc.name}: the `s3` extra") from exc
        self.root = str(root).rstrip("/")
        self._local = "file" in (
            self.fs.protocol if isinstance(self.fs.protocol, tuple) else (self.fs.protocol,)
        )

    def _full(self, path: str) -> str:
        return f"{self.root}/{path}"

    def check(self) -> None:
        """Reach the archive once (the pass's first step): ArchiveUnavailable if not."""
        try:
            if self._local:
                self.fs.makedirs(self.root, exist_ok=True)
            else:
                self.fs.ls(self.root.split("/", 1)[0], refresh=True)
        except Exception as exc:
            raise ArchiveUnavailable(f"{self.url}: {type(exc).__name__}: {exc}") from exc

    def put(self, file: Encoded) -> None:
        """Write one file whole. Locally through a temporary name and a rename, so a
        crash leaves no half-file under the final name; an object store's PUT is
        whole already."""
        full = self._full(file.path)
        try:
            if not self._local:
                self.fs.pipe_file(full, file.data)
                return
            self.fs.makedirs(full.rsplit("/", 1)[0], exist_ok=True)
            partial = f"{full}.{secrets.token_hex(4)}.partial"
            self.fs.pipe_file(partial, file.data)
            self.fs.mv(partial, full)
        except Exception as exc:
            raise ArchiveUnavailable(f"writing {full}: {type(exc).__name__}: {exc}") from exc

    def verify(self, entry: Mapping[str, Any]) -> bool:
        """Whether the file a manifest entry names is there, with the recorded SHA-256
        of its bytes and as many rows as recorded (read back from the store)."""
        full = self._full(str(entry["path"]))
        try:
            data = self.fs.cat_file(full)
        except FileNotFoundError:
            return False
        except Exception as exc:
            raise ArchiveUnavailable(f"reading {full}: {type(exc).__name__}: {exc}") from exc
        if hashlib.sha256(data).hexdigest() != entry["sha256"]:
            return False
        try:
            rows = pq.read_metadata(pa.BufferReader(owned(data))).num_rows
        except pa.ArrowInvalid:
            return False
        return bool(rows == entry["rows"])

    def remove(self, path: str) -> None:
        """Delete one file of an abandoned batch; a file never written is fine."""
        full = self._full(path)
        try:
            if self.fs.exists(full):
                self.fs.rm_file(full)
        except FileNotFoundError:
            return
        except Exception as exc:
            raise ArchiveUnavailable(f"removing {full}: {type(exc).__name__}: {exc}") from exc

    def tenant_files(self, tenant: str, table: str) -> list[str]:
        """Every file of ``table`` of ``tenant``, every day."""
        pattern = self._full(f"tenant={quote(tenant, safe='')}/day=*/{table}-*.parquet")
        try:
            # s3fs answers listings from its cache: the files may be newer than it.
            self.fs.invalidate_cache()
            return sorted(self.fs.glob(pattern))
        except Exception as exc:
            raise ArchiveUnavailable(f"listing {pattern}: {type(exc).__name__}: {exc}") from exc

    def read(self, paths: list[str], *, equal: Mapping[str, str] | None = None) -> pa.Table:
        """The rows of ``paths`` (as :meth:`tenant_files` lists them) whose columns hold
        the values ``equal`` names, as one table."""
        # Each file's bytes fetched here and parsed from memory Arrow owns by ParquetFile,
        # the rows kept by a compute kernel: no dataset scanner, no Acero plan.
        tables = [self._table(p) for p in paths]
        if not tables:
            return pa.table({})
        # Files of older releases may lack a newer column: unified, as a dataset would.
        table = pa.concat_tables(tables, promote_options="default")
        if not equal:
            return table
        keep = functools.reduce(pc.and_, (pc.equal(table[c], v) for c, v in equal.items()))
        return table.filter(keep)

    def _table(self, path: str) -> pa.Table:
        try:
            return pq.ParquetFile(pa.BufferReader(owned(self.fs.cat_file(path)))).read()
        except Exception as exc:  # gone since the listing, unreachable, or not Parquet
            raise ArchiveUnavailable(f"reading {path}: {type(exc).__name__}: {exc}") from exc
