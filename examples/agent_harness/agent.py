"""The lesson's ``runAgent`` loop with two checkpoints per turn and tool-dispatcher as
the effects ledger; ``main`` is the command line (``--resume``)."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx

from dispatcher.client import DispatcherClient
from dispatcher.errors import DispatcherError
from examples.agent_harness.checkpoint import (
    Checkpoint,
    CheckpointError,
    PendingToolUse,
    load_checkpoint,
    save_checkpoint,
)
from examples.agent_harness.crash import CrashPlan, CrashSpecError
from examples.agent_harness.ledger import Ledger
from examples.agent_harness.model import TASK, Response, ScriptedModel
from kit.cli import OneLineArgumentParser

MAX_TURNS = 10
CHECKPOINT = "checkpoint.json"


def log(line: str) -> None:
    print(line, flush=True)


async def run_agent(
    client: DispatcherClient,
    workdir: Path,
    *,
    resume: bool,
    crash: CrashPlan,
    wait_seconds: float,
    resume_wait_seconds: float,
    run_id: str | None = None,
) -> str:
    """Run the task to its end (or the armed crash); returns the model's final text."""
    path = workdir / CHECKPOINT
    if resume:
        cp = load_checkpoint(path)
        model = ScriptedModel.resuming(cp.messages)
        log(f"[resume] loaded turn={cp.turns} pending={cp.pending.name if cp.pending else None}")
    else:
        # Starting without --resume is always a clean start, never a half-finished scene.
        path.unlink(missing_ok=True)
        cp = Checkpoint(
            TASK,
            run_id or f"report-{uuid.uuid4().hex[:8]}",
            messages=[{"role": "user", "content": TASK}],
        )
        model = ScriptedModel()
    ledger = Ledger(
        client,
        run_id=cp.run_id,
        wait_seconds=wait_seconds,
        resume_wait_seconds=resume_wait_seconds,
        crash=crash,
        log=log,
    )

    if cp.pending is not None:
        result = await ledger.reconcile(cp.pending, cp.turns)
        cp.messages.append({"role": "user", "content": [result]})
        cp.pending = None
        save_checkpoint(path, cp)
        log(f"[turn {cp.turns}][save B] tool result filled in after the resume")
    elif _finished(cp.messages):
        return f"{_text(cp.messages[-1]['content'])} (already finished)"

    response = model.create(cp.messages)
    cp.tokens_used += _tokens(response)
    while response["stop_reason"] == "tool_use":
        if cp.turns >= MAX_TURNS:
            return f"stopped after the maximum of {MAX_TURNS} turns"
        cp.turns += 1
        block = next(b for b in response["content"] if b["type"] == "tool_use")
        cp.messages.append({"role": "assistant", "content": response["content"]})
        # Point A: the tool use is named and not yet answered; the id it will be
        # submitted under is recorded before it is submitted, so --resume can ask.
        cp.pending = PendingToolUse(
            block["id"], block["name"], block["input"], f"{cp.run_id}.{block['id']}"
        )
        save_checkpoint(path, cp)
        log(
            f"[turn {cp.turns}][save A] pending={block['name']} "
            f"toolCallId={cp.pending.tool_call_id}"
        )
        crash.point("after-save-a", cp.turns)

        result = await ledger.run(cp.pending, cp.turns)
        cp.messages.append({"role": "user", "content": [result]})
        # Point B: the result is in messages, nothing is pending.
        cp.pending = None
        save_checkpoint(path, cp)
        log(f"[turn {cp.turns}][save B]")
        crash.point("after-save-b", cp.turns)

        response = model.create(cp.messages)
        cp.tokens_used += _tokens(response)

    cp.messages.append({"role": "assistant", "content": response["content"]})
    save_checkpoint(path, cp)
    return _text(response["content"])


def _tokens(response: Response) -> int:
    usage = response["usage"]
    return int(usage["input_tokens"]) + int(usage["output_tokens"])


def _text(content: list[dict[str, Any]]) -> str:
    return " ".join(b["text"] for b in content if b.get("type") == "text")


def _finished(messages: list[dict[str, Any]]) -> bool:
    last = messages[-1] if messages else {}
    return last.get("role") == "assistant" and not any(
        b.get("type") == "tool_use" for b in last.get("content", [])
    )


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = OneLineArgumentParser(prog="agent_harness", description="A resumable agent harness.")
    parser.add_argument("--resume", action="store_true", help="continue from the checkpoint")
    parser.add_argument("--dispatcher", default="http://127.0.0.1:8780", help="API base URL")
    parser.add_argument(
        "--api-key-file",
        type=Path,
        default=Path(".tool-dispatcher/dev-api-key"),
        help="file holding the API key (default: the one `python -m devtools up` writes)",
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        default=Path(__file__).with_name("run"),
        help="where checkpoint.json lives",
    )
    parser.add_argument("--run-id", help="the run to submit the calls under (default: a new one)")
    parser.add_argument(
        "--wait-seconds", type=float, default=30.0, help="how long to wait for each tool's outcome"
    )
    parser.add_argument(
        "--resume-wait-seconds",
        type=float,
        default=10.0,
        help="how long --resume waits for the pending call to settle before deciding",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    try:
        crash = CrashPlan.parse(os.environ.get("CRASH_AFTER"))
        api_key = args.api_key_file.read_text().strip()
    except (CrashSpecError, OSError) as exc:
        print(f"agent_harness: error: {exc}", file=sys.stderr)
        return 2
    args.workdir.mkdir(parents=True, exist_ok=True)

    async def go() -> str:
        async with DispatcherClient(args.dispatcher, api_key) as client:
            return await run_agent(
                client,
                args.workdir,
                resume=args.resume,
                crash=crash,
                wait_seconds=args.wait_seconds,
                resume_wait_seconds=args.resume_wait_seconds,
                run_id=args.run_id,
            )

    try:
        log(f"[done] {asyncio.run(go())}")
    except CheckpointError as exc:
        print(f"agent_harness: error: {exc}", file=sys.stderr)
        return 2
    except (DispatcherError, httpx.HTTPError) as exc:
        print(f"agent_harness: tool-dispatcher: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0
