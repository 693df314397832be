"""The same retention, with the archive on an S3-compatible store: moto's server mode,
started by the test on a free loopback port, reached through s3fs (the ``s3`` extra)
with ``TOOL_DISPATCHER_ARCHIVE_STORAGE_OPTIONS``. The pass, ``archive show``, DuckDB
(through the same filesystem) and a crash at two points behave as on a local disk."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import duckdb
import httpx
import pytest

from devtools.embedded import free_port
from dispatcher.provider.transport import Transport
from dispatcher.retention.archive import Archive
from tests.fixtures.capabilities import registry_file
from tests.fixtures.cli import run_cli
from tests.retention.history import (
    Sessions,
    age,
    assert_each_call_once,
    completed_calls,
    live_ids,
    past_run,
    retention_registry,
    run_view_json,
)
from tests.retention.test_retention_crash import killed_then_rerun, settings_env

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

BUCKET = "tool-dispatcher-archive"


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    """moto's S3 on 127.0.0.1, for this module."""
    port = free_port("127.0.0.1")
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                # A refused connection is retried at once; once it listens, its first
                # answer may take many seconds on a loaded machine (moto loads its
                # backends then), and an attempt cut short would only start another.
                httpx.get(endpoint, timeout=httpx.Timeout(60, connect=1))
                break
            except httpx.TransportError:
                assert server.poll() is None and time.monotonic() < deadline, "moto did not start"
                time.sleep(0.2)
        yield endpoint
    finally:
        server.terminate()
        server.wait(timeout=10)


@pytest.fixture
def s3_archive(s3_endpoint: str, tmp_path: Path) -> tuple[Archive, dict[str, str]]:
    """A fresh prefix of the bucket, and the options that reach it."""
    options = {"endpoint_url": s3_endpoint, "key": "testing", "secret": "testing"}
    archive = Archive(f"s3://{BUCKET}/{tmp_path.name}", options)
    if not archive.fs.exists(BUCKET):
        archive.fs.mkdir(BUCKET)
    return archive, {"TOOL_DISPATCHER_ARCHIVE_STORAGE_OPTIONS": json.dumps(options)}


async def test_the_archive_on_s3_holds_every_old_call_once_and_shows_its_run(
    sessions: Sessions,
    http: Transport,
    sandbox: object,
    database_url: str,
    tmp_path: Path,
    s3_archive: tuple[Archive, dict[str, str]],
) -> None:
    archive, options = s3_archive
    registry = retention_registry(sandbox.url)  # type: ignore[attr-defined]
    await completed_calls(sessions, registry, http, run_id="run-old", count=4)
    before = await run_view_json(sessions, "acme", "run-old")
    await age(sessions, 40)
    await past_run(sessions)
    everything = await live_ids(sessions)
    env = settings_env(
        database_url, tmp_path, registry_file(tmp_path, registry), archive.url, **options
    )

    done = run_cli("retention", "--once", **env)

    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("retention: archived 6 calls"), done.stdout
    await assert_each_call_once(sessions, archive, everything)
    shown = run_cli("archive", "show", "run-old", "--tenant", "acme", **env)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout) == json.loads(before)
    # DuckDB over the same store, through fsspec (no extension to download).
    conn = duckdb.connect()
    conn.register_filesystem(archive.fs)
    counted = conn.sql(
        f"SELECT count(*), count(DISTINCT tool_call_id) FROM read_parquet("
        f"'s3://{BUCKET}/{tmp_path.name}/**/calls-*.parquet', hive_partitioning = true)"
    ).fetchall()
    assert counted == [(6, 6)]


@pytest.mark.parametrize("point", ["after-write:1", "mid-delete:2", "after-verify:3"])
async def test_a_pass_killed_on_s3_loses_nothing_and_copies_nothing(
    sessions: Sessions,
    http: Transport,
    sandbox: object,
    database_url: str,
    tmp_path: Path,
    s3_archive: tuple[Archive, dict[str, str]],
    point: str,
) -> None:
    archive, options = s3_archive
    url = sandbox.url  # type: ignore[attr-defined]
    await killed_then_rerun(sessions, http, url, database_url, tmp_path, archive, point, **options)


def test_an_unreachable_archive_exits_1_with_one_line(
    database_url: str, tmp_path: Path, s3_endpoint: str
) -> None:
    registry = retention_registry("http://127.0.0.1:9")
    dead = {"endpoint_url": f"http://127.0.0.1:{free_port('127.0.0.1')}", "key": "k", "secret": "s"}
    env = settings_env(
        database_url,
        tmp_path,
        registry_file(tmp_path, registry),
        f"s3://{BUCKET}/nowhere",
        TOOL_DISPATCHER_ARCHIVE_STORAGE_OPTIONS=json.dumps(dead),
    )
    done = run_cli("retention", "--once", **env)
    assert done.returncode == 1, done.stderr
    assert "cannot reach the archive" in done.stderr and done.stderr.count("\n") == 1
