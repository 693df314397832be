"""The example agent harness run as a real process against a whole stack (API, relay,
worker and sandbox as processes) that one test module shares."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
from psycopg import sql

from dispatcher.testing.embedded import free_port, wait_for_port
from tests.services import with_database
from tests.stack_support import API_KEY, ProcessStack

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "agent_harness"
TOOLS = ("read_notes", "count_words", "write_report")


@dataclass(frozen=True)
class Harness:
    """Where the shared stack listens, and how to run the harness against it."""

    stack: ProcessStack
    api_url: str
    sandbox_url: str
    key_file: Path
    worker: subprocess.Popen[bytes]

    async def run(
        self, workdir: Path, *args: str, crash: str | None = None
    ) -> tuple[int, str, str]:
        """Run ``python -m examples.agent_harness``; returns exit code, stdout, stderr."""
        env = {k: v for k, v in os.environ.items() if k != "CRASH_AFTER"}
        if crash:
            env["CRASH_AFTER"] = crash
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "examples.agent_harness",
            "--dispatcher",
            self.api_url,
            "--api-key-file",
            str(self.key_file),
            "--workdir",
            str(workdir),
            *args,
            cwd=REPO,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(process.communicate(), timeout=120)
        assert process.returncode is not None
        return process.returncode, out.decode(), err.decode()

    async def books(self) -> dict[str, Any]:
        async with httpx.AsyncClient() as http:
            data: dict[str, Any] = (await http.get(f"{self.sandbox_url}/v1/effects")).json()
        return data

    async def calls_of(self, run_id: str, capability_id: str) -> list[str]:
        """The run's calls of one capability, from tool-dispatcher's run view."""
        async with httpx.AsyncClient() as http:
            response = await http.get(
                f"{self.api_url}/v1/runs/{run_id}", headers={"Authorization": f"Bearer {API_KEY}"}
            )
        response.raise_for_status()
        return [
            c["toolCallId"]
            for c in response.json()["toolCalls"]
            if c["capabilityId"] == capability_id
        ]

    async def add_fault(self, rule: dict[str, Any]) -> None:
        async with httpx.AsyncClient() as http:
            (await http.post(f"{self.sandbox_url}/v1/faults", json=rule)).raise_for_status()


def example_capabilities(sandbox_url: str) -> str:
    """The example's own registry, pointed at this stack's sandbox."""
    return (EXAMPLE / "capabilities.toml").read_text().replace("http://127.0.0.1:8790", sandbox_url)


def harness_stack(tmp: Path, pg_server_url: str, template: str, kafka: str) -> Iterator[Harness]:
    """A database of its own, then sandbox, API, relay and worker processes."""
    name = f"td_harness_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(name), sql.Identifier(template)
            )
        )
    sandbox_port, api_port = free_port(), free_port()
    sandbox_url = f"http://127.0.0.1:{sandbox_port}"
    stack = ProcessStack(
        tmp,
        database_url=with_database(pg_server_url, name),
        kafka_bootstrap=kafka,
        sandbox_url=sandbox_url,
        http_port=api_port,
    )
    (tmp / "capabilities.toml").write_text(example_capabilities(sandbox_url))
    key_file = tmp / "api-key"
    key_file.write_text(API_KEY + "\n")
    try:
        stack.start("sandbox", "--port", str(sandbox_port))
        stack.start("serve")
        stack.start("relay")
        worker = stack.start("worker")
        # Four Python services boot at once and share the machine's cores: a bound that
        # only stops a hung start, not a start-up time budget.
        wait_for_port("127.0.0.1", sandbox_port, timeout=60)
        wait_for_port("127.0.0.1", api_port, timeout=60)
        yield Harness(stack, f"http://127.0.0.1:{api_port}", sandbox_url, key_file, worker)
    finally:
        stack.close()
        with psycopg.connect(pg_server_url, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def transcript_problems(messages: list[dict[str, Any]]) -> list[str]:
    """What makes a transcript invalid: every tool_use must be answered by exactly one
    tool_result in the next message, and every tool_result must answer one."""
    problems = []
    for i, message in enumerate(messages):
        content = message.get("content")
        blocks = content if isinstance(content, list) else []
        uses = [b["id"] for b in blocks if b.get("type") == "tool_use"]
        if message["role"] == "user":
            results = [b["tool_use_id"] for b in blocks if b.get("type") == "tool_result"]
            asked = _uses(messages[i - 1]) if i > 0 else []
            if results and sorted(results) != sorted(asked):
                problems.append(f"message {i} answers {results}, asked {asked}")
        elif uses:
            answered = _results(messages[i + 1]) if i + 1 < len(messages) else []
            for use in uses:
                if answered.count(use) != 1:
                    problems.append(f"tool_use {use} has {answered.count(use)} tool_results")
    return problems


def _uses(message: dict[str, Any]) -> list[str]:
    content = message.get("content")
    blocks = content if isinstance(content, list) else []
    return [b["id"] for b in blocks if message["role"] == "assistant" and b["type"] == "tool_use"]


def _results(message: dict[str, Any]) -> list[str]:
    content = message.get("content")
    blocks = content if isinstance(content, list) else []
    return [
        b["tool_use_id"] for b in blocks if message["role"] == "user" and b["type"] == "tool_result"
    ]


def read_checkpoint(workdir: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((workdir / "checkpoint.json").read_text())
    return data
