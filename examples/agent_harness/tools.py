"""The three tools the model may name. Each is a tool-dispatcher capability of the same
id (capabilities.toml); the harness only knows whether a tool is read-only, which
decides what ``--resume`` may do with a call whose outcome was never recorded."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Tool:
    name: str
    read_only: bool
    description: str
    input_schema: dict[str, Any]


def _schema(**properties: str) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {name: {"type": kind} for name, kind in properties.items()},
        "required": list(properties),
    }


TOOLS: dict[str, Tool] = {
    tool.name: tool
    for tool in (
        Tool("read_notes", True, "Read a sales notes file", _schema(path="string")),
        Tool("count_words", True, "Count the words of a text", _schema(text="string")),
        Tool(
            "write_report",
            False,
            "Write the report file (a side effect: never run it twice)",
            _schema(path="string", content="string"),
        ),
    )
}
