"""The checkpoint: the whole scene of the loop, written atomically, read strictly.

``load_checkpoint`` never returns a default: a checkpoint that is missing, cut short,
unparsable, of another version or of another shape raises :class:`CheckpointError`
with what to do, because guessing a state back is how tasks get lost.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

VERSION = 1
Message = dict[str, Any]


class CheckpointError(Exception):
    """The checkpoint cannot be trusted; the message says why and what to do."""


@dataclass(frozen=True)
class PendingToolUse:
    """The tool use named at point A and not yet answered in ``messages``."""

    id: str
    name: str
    input: dict[str, Any]
    tool_call_id: str
    """The id it is (or will be) submitted under: what ``--resume`` asks about."""


@dataclass
class Checkpoint:
    task: str
    run_id: str
    turns: int = 0
    tokens_used: int = 0
    messages: list[Message] = field(default_factory=list)
    pending: PendingToolUse | None = None

    def to_json(self) -> dict[str, Any]:
        pending = self.pending
        return {
            "version": VERSION,
            "task": self.task,
            "runId": self.run_id,
            "turns": self.turns,
            "tokensUsed": self.tokens_used,
            "messages": self.messages,
            "pendingToolUse": None
            if pending is None
            else {
                "id": pending.id,
                "name": pending.name,
                "input": pending.input,
                "toolCallId": pending.tool_call_id,
            },
        }


def save_checkpoint(path: Path, checkpoint: Checkpoint) -> None:
    """Write to a temporary file, then rename it over the checkpoint: a rename within
    one file system is atomic, so a reader sees the old checkpoint or the new one."""
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w") as out:
        json.dump(checkpoint.to_json(), out, indent=2)
        out.flush()
        os.fsync(out.fileno())
    tmp.replace(path)
    # The rename itself is durable only once the directory is flushed.
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def load_checkpoint(path: Path) -> Checkpoint:
    try:
        raw = path.read_text()
    except FileNotFoundError:
        raise CheckpointError(f"no checkpoint at {path}; there is nothing to --resume") from None
    try:
        data: Any = json.loads(raw)
    except ValueError:
        raise CheckpointError(
            f"{path} cannot be parsed; it may have been cut off mid-write. Delete it and "
            "start again without --resume: a half-written checkpoint cannot be guessed back"
        ) from None
    version = data.get("version") if isinstance(data, dict) else None
    if version != VERSION:
        raise CheckpointError(
            f"{path} has version={json.dumps(version)}; this program only accepts "
            f"version={VERSION} and refuses to load it"
        )
    try:
        return _checkpoint_of(data)
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(
            f"{path} is not a checkpoint this program wrote ({exc}); delete it and start "
            "again without --resume"
        ) from None


def _checkpoint_of(data: dict[str, Any]) -> Checkpoint:
    messages = data["messages"]
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise TypeError("messages must be a list of objects")
    pending = data["pendingToolUse"]
    return Checkpoint(
        task=_typed(data, "task", str),
        run_id=_typed(data, "runId", str),
        turns=_typed(data, "turns", int),
        tokens_used=_typed(data, "tokensUsed", int),
        messages=messages,
        pending=None
        if pending is None
        else PendingToolUse(
            id=_typed(pending, "id", str),
            name=_typed(pending, "name", str),
            input=_typed(pending, "input", dict),
            tool_call_id=_typed(pending, "toolCallId", str),
        ),
    )


def _typed(data: Any, name: str, kind: type[Any]) -> Any:
    if not isinstance(data, dict) or not isinstance(data.get(name), kind):
        raise TypeError(f"{name} must be a {kind.__name__}")
    return data[name]
