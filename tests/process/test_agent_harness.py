"""The example harness as a real process against a real stack: killed at each of the
lesson's crash moments on each tool's turn, then resumed. The report is written once
(the sandbox's effect count) and the transcript stays valid, whatever the moment."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from dispatcher.client import DispatcherClient
from examples.agent_harness.model import REPORT
from tests.fixtures.harness import (
    TOOLS,
    Harness,
    harness_stack,
    read_checkpoint,
    transcript_problems,
)
from tests.fixtures.sandbox import at_provider
from tests.fixtures.stack import API_KEY
from tests.fixtures.waiting import eventually

pytestmark = [pytest.mark.postgres, pytest.mark.kafka, pytest.mark.slow]

DONE = "[done] Report written to report.txt; task complete."
UNSURE = "[done] I could not confirm that report.txt was written"
# What --resume says about the pending call, per crash moment (None: nothing pending).
REUSED = "recorded by tool-dispatcher (completed): reusing the outcome, not running it again"
RECONCILED = {
    "after-save-a": "it never ran, running it now",
    "after-submit": REUSED,
    "after-effect-write": REUSED,
    "after-save-b": None,
}


@pytest.fixture(scope="module")
def harness(
    tmp_path_factory: pytest.TempPathFactory,
    pg_server_url: str,
    template_database: str,
    kafka_bootstrap: str,
) -> Iterator[Harness]:
    yield from harness_stack(
        tmp_path_factory.mktemp("harness-stack"), pg_server_url, template_database, kafka_bootstrap
    )


def provider_key(tool_call_id: str) -> str:
    """The key the provider sees for a call the harness submits without one. The call's
    default key is its toolCallId qualified by the stack key's tenant (toolCallIds are
    per tenant), and the provider receives that key qualified by the tenant again, as
    every key on a shared provider account is (``acme:acme:<toolCallId>``)."""
    return at_provider(f"acme:{tool_call_id}")


def call_ids(run_id: str) -> list[str]:
    return [f"{run_id}.toolu_0{n}" for n in (1, 2, 3)]


async def assert_written_once_and_valid(
    harness: Harness, workdir: Path, *, sent_once: bool = True
) -> str:
    checkpoint = read_checkpoint(workdir)
    assert checkpoint["pendingToolUse"] is None
    assert transcript_problems(checkpoint["messages"]) == []
    run_id: str = checkpoint["runId"]
    report = f"{run_id}.toolu_03"
    # One write_report call in the run (none under another id), its effect applied once.
    assert await harness.calls_of(run_id, "write_report") == [report]
    books = await harness.books()
    assert books["effects"].get(provider_key(report)) == 1
    if sent_once:
        # Its request reached the provider once: nothing was sent again.
        assert books["received"].get(provider_key(report)) == 1
    return run_id


@pytest.mark.parametrize("moment", list(RECONCILED))
@pytest.mark.parametrize("turn", [1, 2, 3], ids=list(TOOLS))
async def test_killed_then_resumed(
    harness: Harness, tmp_path: Path, moment: str, turn: int
) -> None:
    code, out, _ = await harness.run(tmp_path, crash=f"{moment}:{turn}")
    assert code == 137
    assert out.splitlines()[-1] == f"[kill] simulated kill at {moment}:{turn}"
    pending = read_checkpoint(tmp_path)["pendingToolUse"]
    if moment == "after-save-b":
        assert pending is None
    else:
        assert pending["name"] == TOOLS[turn - 1]
        assert pending["toolCallId"].endswith(f".toolu_0{turn}")
    if moment == "after-submit":
        # Killed right after the submit, the call is still on its way through relay,
        # broker and worker. This test is about what --resume does with a recorded
        # outcome, so it resumes once there is one, not when it happens to be ready.
        await settled_as(harness, pending["toolCallId"], "completed")

    code, out, err = await harness.run(tmp_path, "--resume")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == f"[resume] loaded turn={turn} pending={pending and pending['name']}"
    reconciled = [line for line in lines if line.startswith("[resume][reconcile]")]
    if RECONCILED[moment] is None:
        assert reconciled == []
    else:
        assert reconciled == [
            f"[resume][reconcile] tool_use_id=toolu_0{turn} name={TOOLS[turn - 1]} "
            f"{_expected(moment, pending['toolCallId'])}"
        ]
    assert lines[-1] == DONE
    run_id = await assert_written_once_and_valid(harness, tmp_path)
    books = await harness.books()
    # Nothing ran twice: a crash before the submit leaves nothing to repeat, and a
    # recorded outcome is reused.
    mine = {k: n for k, n in books["effects"].items() if k.startswith(provider_key(run_id))}
    assert mine == dict.fromkeys(map(provider_key, call_ids(run_id)), 1)


async def settled_as(harness: Harness, tool_call_id: str, status: str) -> None:
    """Wait until tool-dispatcher reports ``status`` for the call; a call that
    settles in another status fails at once rather than after the bound."""
    async with DispatcherClient(harness.api_url, API_KEY) as client:

        async def reached() -> bool:
            view = await client.get(tool_call_id)
            assert view.status in {status, "authorized", "dispatching"}, view
            return view.status == status

        await eventually(reached, what=f"{tool_call_id} to be {status}")


def _expected(moment: str, tool_call_id: str) -> str:
    if moment == "after-save-a":
        return f"tool-dispatcher has no call {tool_call_id}: it never ran, running it now"
    return str(RECONCILED[moment])


async def test_a_report_in_doubt_is_an_honest_error_and_the_reconciler_settles_it(
    harness: Harness, tmp_path: Path
) -> None:
    run_id = "report-in-doubt"
    report = f"{run_id}.toolu_03"
    # The sandbox writes the report and the answer is lost: tool-dispatcher records
    # result_unknown, and no reconciler runs in this stack until the test runs one.
    await harness.add_fault(
        {
            "kind": "drop_after_apply",
            "method": "POST",
            "times": 1,
            "idempotencyKey": provider_key(report),
        }
    )
    code, _, _ = await harness.run(tmp_path, "--run-id", run_id, crash="after-submit:3")
    assert code == 137
    # The worker has to record the lost answer first: --resume is about a call that
    # tool-dispatcher knows to be in doubt, not one still on its way.
    await settled_as(harness, report, "result_unknown")

    code, out, err = await harness.run(tmp_path, "--resume", "--resume-wait-seconds", "1")
    assert code == 0, err
    assert (
        "[resume][reconcile] tool_use_id=toolu_03 name=write_report no recorded outcome "
        "(result_unknown), side effects: not running it again, telling the model the state "
        "is unknown"
    ) in out.splitlines()
    assert out.splitlines()[-1].startswith(UNSURE)
    messages = read_checkpoint(tmp_path)["messages"]
    answer = messages[-2]["content"][0]
    assert answer["tool_use_id"] == "toolu_03" and answer["is_error"] is True
    assert "The outcome of this write_report call is unknown" in answer["content"]
    assert f"reconciler is settling it under toolCallId {report}" in answer["content"]
    await assert_written_once_and_valid(harness, tmp_path)

    async with DispatcherClient(harness.api_url, API_KEY) as client:

        async def confirmed() -> bool:
            await asyncio.to_thread(harness.stack.run, "reconcile", "--once")
            return (await client.get(report)).status == "confirmed"

        await eventually(confirmed, what="the reconciler to confirm the report")
        view = await client.get(report)
    assert view.verification_status == "confirmed_success"
    # Found by a lookup, not by sending it again (the lookup counts as received).
    await assert_written_once_and_valid(harness, tmp_path, sent_once=False)
    assert view.result == {"echo": {"content": REPORT, "path": "report.txt"}}


async def test_a_read_only_call_without_an_outcome_is_run_again(
    harness: Harness, tmp_path: Path
) -> None:
    run_id = "notes-slow"
    notes = f"{run_id}.toolu_01"
    # The first read is in flight when --resume asks about it. Each of the first three
    # attempts outlasts read_notes's 5 s request timeout (examples/agent_harness/
    # capabilities.toml; the provider client repeats a read-only request after a
    # timeout), the fourth and last the retry policy allows is answered at once.
    await harness.add_fault(
        {"kind": "latency", "latencyMs": 15000, "times": 3, "idempotencyKey": provider_key(notes)}
    )
    code, _, _ = await harness.run(tmp_path, "--run-id", run_id, crash="after-submit:1")
    assert code == 137

    async with DispatcherClient(harness.api_url, API_KEY) as client:

        async def in_flight() -> bool:
            if (await harness.books())["received"].get(provider_key(notes), 0) < 1:
                return False
            status = (await client.get(notes)).status
            assert status in {"authorized", "dispatching"}, status
            return status == "dispatching"

        await eventually(in_flight, what="the worker to send the read and wait for its answer")
        # Paused, the worker (the only process that could record an outcome here) keeps
        # the call dispatching for as long as --resume takes to start and ask about it.
        os.killpg(harness.worker.pid, signal.SIGSTOP)
        try:
            assert (await client.get(notes)).status == "dispatching"
            resume = asyncio.create_task(
                harness.run(tmp_path, "--resume", "--resume-wait-seconds", "0.5")
            )

            async def decided() -> bool:
                # A call after the pending one (the rerun, or whatever --resume did
                # instead) shows --resume has decided; or it has ended.
                calls = [c for tool in TOOLS for c in await harness.calls_of(run_id, tool)]
                return resume.done() or len(calls) > 1

            await eventually(decided, what="--resume to decide about the pending read")
        finally:
            # Woken, the worker finishes the slow read's batch, then runs the rerun.
            os.killpg(harness.worker.pid, signal.SIGCONT)
    code, out, err = await resume
    assert code == 0, err
    line = next(x for x in out.splitlines() if x.startswith("[resume][reconcile]"))
    assert line.startswith(
        "[resume][reconcile] tool_use_id=toolu_01 name=read_notes no recorded outcome "
        "(dispatching), read-only: "
    )
    assert f"read-only: running it again as {notes}.rerun-" in line
    assert out.splitlines()[-1] == DONE
    await assert_written_once_and_valid(harness, tmp_path)
