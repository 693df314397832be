"""The JSON log line (kit.logs.JsonLines, with dispatcher.logs's call
context): its fields, keys without a value left out, the current span's ids, the
exception's text, and one line per record whatever the message holds."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import format_span_id, format_trace_id

from dispatcher.logs import current_context, log_context
from kit.logs import JsonLines


class Lines:
    """A logger whose records are written as JSON lines into a buffer."""

    def __init__(self) -> None:
        self.buffer = io.StringIO()
        self.handler = logging.StreamHandler(self.buffer)
        self.handler.setFormatter(JsonLines(current_context))
        self.logger = logging.getLogger("tests.log_lines")
        self.logger.addHandler(self.handler)
        self.logger.setLevel(logging.DEBUG)
        self.logger.propagate = False

    def records(self) -> list[dict[str, Any]]:
        # Lines end at "\n" alone (str.splitlines would also split at U+2028).
        return [json.loads(line) for line in self.buffer.getvalue().split("\n")[:-1]]

    def one(self) -> dict[str, Any]:
        [record] = self.records()
        return record


@pytest.fixture
def lines() -> Iterator[Lines]:
    made = Lines()
    yield made
    made.logger.removeHandler(made.handler)
    made.logger.propagate = True


def test_a_line_has_time_level_logger_and_message(lines: Lines) -> None:
    before = datetime.now(UTC)
    lines.logger.warning("refund %s sent", "r-1")

    record = lines.one()
    assert record["level"] == "WARNING"
    assert record["logger"] == "tests.log_lines"
    assert record["message"] == "refund r-1 sent"
    assert record["time"].endswith("Z")
    when = datetime.fromisoformat(record["time"])
    assert when.utcoffset() is not None and when.utcoffset().total_seconds() == 0  # type: ignore[union-attr]
    assert abs((when - before).total_seconds()) < 60


def test_keys_without_a_value_are_left_out(lines: Lines) -> None:
    lines.logger.info("plain", extra={"run_id": None})

    assert set(lines.one()) == {"time", "level", "logger", "message"}


def test_the_call_context_and_extra_fields(lines: Lines) -> None:
    with log_context(tool_call_id="tc-1", run_id="run-1"):
        with log_context(capability_id="refund"):
            lines.logger.info("inner", extra={"attempt": 2})
        lines.logger.info("outer", extra={"tool_call_id": "tc-given"})
    lines.logger.info("outside")

    inner, outer, outside = lines.records()
    assert inner["tool_call_id"] == "tc-1"
    assert inner["run_id"] == "run-1"
    assert inner["capability_id"] == "refund"
    assert inner["attempt"] == 2
    # extra= names the call the line is about, over the context's.
    assert outer["tool_call_id"] == "tc-given"
    assert "capability_id" not in outer
    assert not {"tool_call_id", "run_id", "capability_id"} & set(outside)


async def test_each_task_has_its_own_call_context(lines: Lines) -> None:
    async def work(call: str) -> None:
        with log_context(tool_call_id=call):
            await asyncio.sleep(0)
            lines.logger.info("sent %s", call)

    await asyncio.gather(work("a"), work("b"), work("c"))

    assert sorted((r["message"], r["tool_call_id"]) for r in lines.records()) == [
        ("sent a", "a"),
        ("sent b", "b"),
        ("sent c", "c"),
    ]


def test_trace_and_span_ids_of_the_current_span(lines: Lines) -> None:
    tracer = TracerProvider().get_tracer("tests")
    lines.logger.info("no span")
    with tracer.start_as_current_span("dispatch") as span:
        lines.logger.info("in a span")
    ids = span.get_span_context()

    outside, inside = lines.records()
    assert "trace_id" not in outside and "span_id" not in outside
    assert inside["trace_id"] == format_trace_id(ids.trace_id)
    assert inside["span_id"] == format_span_id(ids.span_id)
    assert len(inside["trace_id"]) == 32 and len(inside["span_id"]) == 16


def test_an_exception_is_rendered(lines: Lines) -> None:
    try:
        raise ZeroDivisionError("the divisor was zero")
    except ZeroDivisionError:
        lines.logger.exception("lookup failed")

    record = lines.one()
    assert record["level"] == "ERROR"
    assert record["message"] == "lookup failed"
    assert record["exception"].startswith("Traceback (most recent call last):")
    assert "ZeroDivisionError: the divisor was zero" in record["exception"]


def test_one_line_per_record_whatever_the_message(lines: Lines) -> None:
    lines.logger.info("first\nsecond\r\nthird \u2028 fourth")
    try:
        raise ValueError("line one\nline two")
    except ValueError:
        lines.logger.error("failed:\n%s", "detail", exc_info=True)

    text = lines.buffer.getvalue()
    assert text.count("\n") == 2
    first, second = lines.records()
    assert first["message"] == "first\nsecond\r\nthird \u2028 fourth"
    assert "line one\nline two" in second["exception"]
