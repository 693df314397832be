"""``TOOL_DISPATCHER_LOG_FORMAT=json``: every process writes one JSON object per line,
and no line carries a provider credential or a producer's API key (the secret canary
of tests/worker/test_provider_credentials.py, on the processes' own output).

The API, relay, worker and reconciler run as processes against the test's database,
broker and sandbox; one call completes and one loses its answer, so the worker sends
both with the credential and the reconciler takes up the second."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from devtools.embedded import free_port, wait_for_port
from devtools.sandbox import SandboxServer
from tests.fixtures.rows import call_row
from tests.fixtures.sandbox import add_fault, at_provider
from tests.fixtures.stack import API_KEY, MakeStack, ProcessStack
from tests.fixtures.waiting import eventually

pytestmark = [pytest.mark.postgres, pytest.mark.kafka]

SECRET = "sk_live_json-canary-7d2a9b"
TRANSITIONS = "tool_dispatcher.transitions"


def json_lines(text: str) -> list[dict[str, Any]]:
    """Every line of a process's output, each parsed as one JSON object."""
    lines = [line for line in text.split("\n") if line]
    parsed = [json.loads(line) for line in lines]
    assert all(isinstance(line, dict) for line in parsed)
    return parsed


def assert_no_secret(name: str, text: str) -> None:
    for secret in (SECRET, API_KEY, "Bearer"):
        assert secret not in text, f"{secret!r} in the output of {name}"


async def test_every_process_writes_json_lines_without_secrets(
    make_stack: MakeStack,
    sandbox: SandboxServer,
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    port = free_port()
    stack: ProcessStack = make_stack(
        sandbox_url=sandbox.url,
        http_port=port,
        log_format="json",
        provider_secrets=json.dumps({"refund": SECRET}),
        reconcile_interval_seconds="0.2",
    )
    processes = {name: stack.start(name) for name in ("serve", "relay", "worker", "reconcile")}
    wait_for_port("127.0.0.1", port, timeout=60)
    await add_fault(
        sandbox.url, {"kind": "drop_after_apply", "idempotencyKey": at_provider("json:lost")}
    )

    ids = {}
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {API_KEY}"}
    ) as api:
        for key in ("json:ok", "json:lost"):
            response = await api.post(
                "/v1/tool-calls",
                json={
                    "runId": "run-json",
                    "capabilityId": "refund",
                    "input": {},
                    "idempotencyKey": key,
                },
            )
            assert response.status_code == 201, response.text
            ids[key] = response.json()["toolCallId"]

    async def settled() -> bool:
        ok = (await call_row(sessions, ids["json:ok"]))["status"]
        lost = (await call_row(sessions, ids["json:lost"]))["status"]
        return ok == "completed" and lost not in ("authorized", "dispatching", "result_unknown")

    await eventually(settled, within=60, what="both calls to be settled")

    async def reconciler_logged() -> bool:
        return f'"tool_call_id":"{ids["json:lost"]}"' in stack.log_of(processes["reconcile"])

    await eventually(reconciler_logged, within=30, what="the reconciler's transition line")
    stack.close()

    outputs = {name: stack.log_of(p) for name, p in processes.items()}
    for name, text in outputs.items():
        assert_no_secret(name, text)
        lines = json_lines(text)
        # The API logs only what goes wrong (uvicorn at WARNING, no access log).
        assert lines or name == "serve", f"{name} wrote nothing"
        for line in lines:
            assert {"time", "level", "logger", "message"} <= set(line), line
            assert None not in line.values(), line
    worker = [line for line in json_lines(outputs["worker"]) if line["logger"] == TRANSITIONS]
    completed = [line for line in worker if line["tool_call_id"] == ids["json:ok"]]
    assert [(line["from"], line["to"]) for line in completed] == [
        ("authorized", "dispatching"),
        ("dispatching", "completed"),
    ]
    assert {(line["level"], line["run_id"], line["capability_id"]) for line in completed} == {
        ("INFO", "run-json", "refund")
    }


async def test_the_standalone_relay_writes_json_lines(tmp_path: Path, database_url: str) -> None:
    """``python -m outbox_relay --log-format json`` (which reads no settings): a relay
    whose broker is not there logs the broker's absence, and the exception it dies of,
    as JSON lines."""
    log_path = tmp_path / "relay.log"
    with log_path.open("wb") as log:
        relay = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "outbox_relay",
            "--database-url", database_url,
            "--bootstrap", f"127.0.0.1:{free_port()}",
            "--log-format", "json",
            stdout=log, stderr=log,
        )  # fmt: skip
    try:
        assert await asyncio.wait_for(relay.wait(), timeout=120) != 0
    finally:
        if relay.returncode is None:
            relay.kill()
            await relay.wait()
    lines = json_lines(log_path.read_text())
    assert lines[-1]["level"] == "CRITICAL"
    assert lines[-1]["message"] == "the process died"
    assert "KafkaConnectionError" in lines[-1]["exception"]
