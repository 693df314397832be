"""Running the service's own processes (`python -m dispatcher ...`) against the
test's database, broker and sandbox, for the crash and end-to-end tests."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from dispatcher.settings import hash_api_key

API_KEY = "tdk_test_pipeline_key"


def capabilities_toml(sandbox_url: str, *, timeout: float = 2.0, attempts: int = 3) -> str:
    """A registry with one side-effecting and one read-only capability on the sandbox."""
    common = (
        f'request = {{ method = "POST", url = "{sandbox_url}/v1/requests", '
        f"timeoutSeconds = {timeout} }}\n"
        f'statusLookup = {{ method = "GET", '
        f'url = "{sandbox_url}/v1/requests/{{externalRequestId}}" }}\n'
        f"retry = {{ maxAttempts = {attempts}, initialBackoffSeconds = 0.02, "
        f"maxBackoffSeconds = 0.1 }}\n"
    )
    return (
        '[[capability]]\nid = "refund"\nsideEffects = true\n'
        + common
        + '\n[[capability]]\nid = "lookup"\nsideEffects = false\n'
        + common
    )


class ProcessStack:
    """Environment and processes of one test's stack; every process is killed at close."""

    def __init__(
        self,
        tmp: Path,
        *,
        database_url: str,
        kafka_bootstrap: str,
        sandbox_url: str,
        **settings: Any,
    ) -> None:
        run = uuid.uuid4().hex[:8]
        caps = tmp / "capabilities.toml"
        caps.write_text(capabilities_toml(sandbox_url, **settings.pop("capability", {})))
        self.tmp = tmp
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("TOOL_DISPATCHER_")},
            "TOOL_DISPATCHER_DATABASE_URL": database_url,
            "TOOL_DISPATCHER_KAFKA_BOOTSTRAP": kafka_bootstrap,
            "TOOL_DISPATCHER_KAFKA_ENABLE_IDEMPOTENCE": "false",
            "TOOL_DISPATCHER_CAPABILITIES_FILE": str(caps),
            "TOOL_DISPATCHER_DISPATCH_TOPIC": f"td-commands-{run}",
            "TOOL_DISPATCHER_EVENTS_TOPIC": f"td-events-{run}",
            "TOOL_DISPATCHER_ESCALATIONS_TOPIC": f"td-escalations-{run}",
            "TOOL_DISPATCHER_WORKER_GROUP_ID": f"td-workers-{run}",
            "TOOL_DISPATCHER_API_KEYS": json.dumps(
                [{"sha256": hash_api_key(API_KEY), "tenant": "acme"}]
            ),
            "TOOL_DISPATCHER_MIN_LEASE_SECONDS": "1",
            "TOOL_DISPATCHER_LEASE_MARGIN_SECONDS": "0.5",
            "TOOL_DISPATCHER_RECOVERY_INTERVAL_SECONDS": "0.5",
            "TOOL_DISPATCHER_KAFKA_SESSION_TIMEOUT_MS": "6000",
            "TOOL_DISPATCHER_STATE_DIR": str(tmp / "state"),
        }
        self.env.update({f"TOOL_DISPATCHER_{k.upper()}": str(v) for k, v in settings.items()})
        self.processes: list[subprocess.Popen[bytes]] = []

    @property
    def topics(self) -> dict[str, str]:
        return {
            name: self.env[f"TOOL_DISPATCHER_{name.upper()}_TOPIC"]
            for name in ("dispatch", "events")
        }

    def start(
        self, command: str, *args: str, name: str | None = None, **env: str
    ) -> subprocess.Popen[bytes]:
        log_path = self.tmp / f"{name or command}-{len(self.processes)}.log"
        # The child keeps its own copy of the descriptor; ours is closed at once.
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "dispatcher", command, *args],
                env={**self.env, **{f"TOOL_DISPATCHER_{k.upper()}": v for k, v in env.items()}},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.processes.append(process)
        return process

    def run(self, command: str, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "dispatcher", command, *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def log_of(self, process: subprocess.Popen[bytes]) -> str:
        index = self.processes.index(process)
        return "\n".join(p.read_text(errors="replace") for p in self.tmp.glob(f"*-{index}.log"))

    def close(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGCONT)
                process.terminate()
        for process in self.processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


async def eventually(
    check: Callable[[], Awaitable[bool]], *, within: float = 60.0, what: str = "condition"
) -> None:
    """Wait for ``check`` to hold. The bound only stops a hung test; it is not a
    performance threshold."""
    deadline = time.monotonic() + within
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


async def exited(process: subprocess.Popen[bytes], within: float = 60.0) -> int:
    async def done() -> bool:
        return process.poll() is not None

    await eventually(done, within=within, what="the process to exit")
    assert process.returncode is not None
    return process.returncode
