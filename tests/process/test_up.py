"""`python -m devtools up` (what `make up` runs): it prints the console's URL and a dev key,
and that key signs in to the console over the plain http `up` serves."""

from __future__ import annotations

import os
import re
import selectors
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest

from devtools.embedded import free_port
from devtools.registries import refund_and_lookup
from tests.fixtures.capabilities import registry_file

pytestmark = pytest.mark.postgres


def read_until(process: subprocess.Popen[str], marker: str, within: float) -> list[str]:
    assert process.stdout is not None
    lines: list[str] = []
    selector = selectors.DefaultSelector()
    selector.register(process.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not selector.select(timeout=0.5):
            assert process.poll() is None, "\n".join(lines)
            continue
        line = process.stdout.readline()
        assert line, "up exited early:\n" + "\n".join(lines)
        lines.append(line.rstrip())
        if marker in line:
            return lines
    raise AssertionError(f"no {marker!r} within {within}s:\n" + "\n".join(lines))


def test_up_prints_the_console_and_a_dev_key_that_signs_in(
    tmp_path: Path, database_url: str, kafka_bootstrap: str
) -> None:
    run = uuid.uuid4().hex[:8]
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("TOOL_DISPATCHER_")},
        "TOOL_DISPATCHER_DATABASE_URL": database_url,
        "TOOL_DISPATCHER_KAFKA_BOOTSTRAP": kafka_bootstrap,
        "TOOL_DISPATCHER_KAFKA_ENABLE_IDEMPOTENCE": "false",
        "TOOL_DISPATCHER_HTTP_PORT": str(port),
        "TOOL_DISPATCHER_STATE_DIR": str(tmp_path / "state"),
        "TOOL_DISPATCHER_CAPABILITIES_FILE": str(
            registry_file(tmp_path, refund_and_lookup("http://127.0.0.1:9"))
        ),
        "TOOL_DISPATCHER_DISPATCH_TOPIC": f"td-commands-{run}",
        "TOOL_DISPATCHER_EVENTS_TOPIC": f"td-events-{run}",
        "TOOL_DISPATCHER_ESCALATIONS_TOPIC": f"td-escalations-{run}",
        "TOOL_DISPATCHER_WORKER_GROUP_ID": f"td-workers-{run}",
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "devtools", "up"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        lines = read_until(process, "Ctrl-C stops everything", within=60)
        text = "\n".join(lines)
        console = re.search(r"console\s+(http://\S+/console/)", text)
        key = re.search(r"dev API key[^:]*: (\S+)", text)
        assert console is not None and key is not None, text
        assert console.group(1) == f"http://127.0.0.1:{port}/console/"
        with httpx.Client(base_url=console.group(1)) as client:
            signed = client.post("login", data={"key": key.group(1)})
            assert signed.status_code == 303
            # Not Secure: `up` is plain http, where a Secure cookie would never come back.
            assert "secure" not in signed.headers["set-cookie"].lower()
            home = client.get("")
            assert home.status_code == 200
            assert 'data-testid="whoami">dev · tenant dev' in home.text
    finally:
        process.send_signal(signal.SIGINT)
        try:
            assert process.wait(timeout=30) == 0
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
            assert process.stdout is not None
            process.stdout.close()
