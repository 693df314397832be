"""The scripted model, as in the lesson: a fixed queue of responses, one per call, so
which tool each turn names and when the model finishes are constants, and a crash can
be aimed at a turn. Responses have the Messages API's shape."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

Response = dict[str, Any]

TASK = "Turn sales-notes.txt into a short report and write it to report.txt."

NOTES = (
    "Q3 sales notes. Acme renewed for two years. Globex asked for a discount on the "
    "support plan. Initech churned after the outage. Pipeline up 12% on Q2."
)
REPORT = (
    "Q3 sales report\n\nRenewals: Acme (2 years). At risk: Globex (discount request). "
    "Lost: Initech (after the outage). Pipeline: +12% on Q2.\n"
)


def _usage(inp: int, out: int) -> dict[str, int]:
    return {"input_tokens": inp, "output_tokens": out}


def _tool_use(n: int, text: str, name: str, tool_input: dict[str, Any]) -> Response:
    return {
        "stop_reason": "tool_use",
        "content": [
            {"type": "text", "text": text},
            {"type": "tool_use", "id": f"toolu_0{n}", "name": name, "input": tool_input},
        ],
        "usage": _usage(120 * n, 40),
    }


def _final(text: str) -> Response:
    return {
        "stop_reason": "end_turn",
        "content": [{"type": "text", "text": text}],
        "usage": _usage(520, 30),
    }


RESPONSES: tuple[Response, ...] = (
    _tool_use(1, "I'll read the sales notes first.", "read_notes", {"path": "sales-notes.txt"}),
    _tool_use(2, "Now I'll count the words of the notes.", "count_words", {"text": NOTES}),
    _tool_use(3, "Writing the report.", "write_report", {"path": "report.txt", "content": REPORT}),
    _final("Report written to report.txt; task complete."),
)
UNSURE = _final(
    "I could not confirm that report.txt was written (see the last tool result); I will "
    "not write it again until tool-dispatcher has settled that call."
)


class ScriptExhausted(RuntimeError):
    """The model was called after its last scripted response."""


class ScriptedModel:
    """Hands out ``responses`` in order; a resumed run starts the queue after the
    responses its transcript already holds."""

    def __init__(self, responses: Sequence[Response] = RESPONSES) -> None:
        self._queue = deque(responses)

    @classmethod
    def resuming(cls, messages: Sequence[dict[str, Any]]) -> ScriptedModel:
        answered = sum(1 for m in messages if m.get("role") == "assistant")
        return cls(RESPONSES[answered:])

    def create(self, messages: Sequence[dict[str, Any]]) -> Response:
        if not self._queue:
            raise ScriptExhausted("the scripted model has no response left")
        response = self._queue.popleft()
        # The one branch in the script: a final answer must not claim a write that the
        # last tool result says is in doubt.
        if response["stop_reason"] == "end_turn" and _last_result_is_error(messages):
            return UNSURE
        return response


def _last_result_is_error(messages: Sequence[dict[str, Any]]) -> bool:
    for message in reversed(messages):
        content = message.get("content")
        if message.get("role") == "user" and isinstance(content, list):
            return any(block.get("is_error") for block in content)
    return False
