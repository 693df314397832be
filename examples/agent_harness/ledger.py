"""tool-dispatcher as the effects ledger: tool uses are submitted to it and executed by
it (the harness never runs a tool), and after a crash it is asked what happened.

The lesson's ledger is a local file written after a tool succeeds, so a crash between
the tool and that write leaves "did it run?" unanswerable. Here the ledger is the
executor itself: a call it has no record of never ran, and one it recorded has its
outcome there. What stays unknown is only what the provider left unknown, and the
reconciler is already settling that.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

from dispatcher.client import DispatcherClient, WaitTimedOut
from dispatcher.errors import ToolCallNotFound
from dispatcher.schemas import SubmitRequest, ToolCallView
from dispatcher.states import SETTLED_STATES
from examples.agent_harness.checkpoint import PendingToolUse
from examples.agent_harness.crash import CrashPlan
from examples.agent_harness.tools import TOOLS

ToolResult = dict[str, Any]


class Ledger:
    """Runs tool uses through tool-dispatcher and reconciles the pending one on resume."""

    def __init__(
        self,
        client: DispatcherClient,
        *,
        run_id: str,
        wait_seconds: float,
        resume_wait_seconds: float,
        crash: CrashPlan,
        log: Callable[[str], None],
    ) -> None:
        self._client = client
        self._run_id = run_id
        self._wait = wait_seconds
        self._resume_wait = resume_wait_seconds
        self._crash = crash
        self._log = log

    async def run(self, pending: PendingToolUse, turn: int) -> ToolResult:
        """Submit the tool use under its ``tool_call_id`` and wait for its outcome."""
        await self._client.submit(
            SubmitRequest(
                run_id=self._run_id,
                turn_id=f"turn-{turn}",
                capability_id=pending.name,
                tool_call_id=pending.tool_call_id,
                correlation_id=pending.id,
                input=pending.input,
            )
        )
        self._crash.point("after-submit", turn)
        try:
            view = await self._client.wait(pending.tool_call_id, within=self._wait)
        except WaitTimedOut as late:
            view = late.view
        self._log(
            f"[turn {turn}][tool-dispatcher] {pending.name} {view.tool_call_id} {view.status}"
        )
        self._crash.point("after-effect-write", turn)
        if view.status in SETTLED_STATES:
            return recorded_result(pending, view)
        if TOOLS[pending.name].read_only:
            return _error(
                pending,
                f"{pending.name} gave no outcome within {self._wait:g} s ({view.status}); "
                "try again",
            )
        return unknown_result(pending, view)

    async def reconcile(self, pending: PendingToolUse, turn: int) -> ToolResult:
        """The three-way rule for the tool use pending at the crash."""
        head = f"[resume][reconcile] tool_use_id={pending.id} name={pending.name}"
        try:
            view = await self._client.wait(pending.tool_call_id, within=self._resume_wait)
        except ToolCallNotFound:
            # Point A is saved before the submit, so the call may never have been sent;
            # submitting it under the same id is safe even if an earlier submit is
            # still on its way, because tool-dispatcher keeps one call per id.
            self._log(
                f"{head} tool-dispatcher has no call {pending.tool_call_id}: "
                "it never ran, running it now"
            )
            return await self.run(pending, turn)
        except WaitTimedOut as late:
            view = late.view
        if view.status in SETTLED_STATES:
            self._log(
                f"{head} recorded by tool-dispatcher ({view.status}): "
                "reusing the outcome, not running it again"
            )
            return recorded_result(pending, view)
        if TOOLS[pending.name].read_only:
            again = PendingToolUse(
                pending.id,
                pending.name,
                pending.input,
                f"{pending.tool_call_id}.rerun-{uuid.uuid4().hex[:6]}",
            )
            self._log(
                f"{head} no recorded outcome ({view.status}), read-only: "
                f"running it again as {again.tool_call_id}"
            )
            return await self.run(again, turn)
        self._log(
            f"{head} no recorded outcome ({view.status}), side effects: "
            "not running it again, telling the model the state is unknown"
        )
        return unknown_result(pending, view)


def recorded_result(pending: PendingToolUse, view: ToolCallView) -> ToolResult:
    """The tool result of a settled call, from its recorded outcome."""
    took_effect = view.status == "completed" or (
        view.status == "confirmed" and view.verification_status == "confirmed_success"
    )
    if took_effect:
        return {
            "type": "tool_result",
            "tool_use_id": pending.id,
            "content": json.dumps(view.result),
        }
    if view.status == "escalated":
        return unknown_result(pending, view)
    what = {
        "compensated": "took effect and was undone",
        "rejected": "was rejected by a human",
        "cancelled": "was cancelled (the run was stopped)",
    }.get(view.status, "failed")
    return _error(pending, f"{pending.name} {what}: {view.last_error or view.status}")


def unknown_result(pending: PendingToolUse, view: ToolCallView) -> ToolResult:
    """The honest answer for a side effect nobody can vouch for yet."""
    who = (
        "an on-call engineer owns it (escalated)"
        if view.status == "escalated"
        else "tool-dispatcher's reconciler is settling it"
    )
    return _error(
        pending,
        f"The outcome of this {pending.name} call is unknown: tool-dispatcher has no "
        f"recorded outcome (status {view.status}) and, to avoid a duplicate side effect, "
        f"it was not run again. {who} under toolCallId {view.tool_call_id} (idempotency "
        f"key {view.idempotency_key}); check GET /v1/tool-calls/{view.tool_call_id} "
        "before trying again.",
    )


def _error(pending: PendingToolUse, text: str) -> ToolResult:
    return {"type": "tool_result", "tool_use_id": pending.id, "content": text, "is_error": True}
