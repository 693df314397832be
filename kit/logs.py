"""The log line format of every process: plain text, or one JSON object per record.

It lives at the bottom layer because ``python -m outbox_relay`` may not import the
dispatcher (.importlinter) and the dispatcher's processes must write the same lines:
the dispatcher adds its tool-call fields through ``context`` (:mod:`dispatcher.logs`).
Nothing here knows about tool calls.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Literal

from opentelemetry import trace
from pythonjsonlogger.core import RESERVED_ATTRS, merge_record_extra
from pythonjsonlogger.orjson import OrjsonFormatter

LogFormat = Literal["text", "json"]
Context = Callable[[], Mapping[str, Any]]

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"

# Attributes every record has (``taskName`` since Python 3.12): not extra fields.
_NOT_EXTRA = frozenset([*RESERVED_ATTRS, "taskName"])


def _no_context() -> Mapping[str, Any]:
    return {}


class JsonLines(OrjsonFormatter):
    """``time`` (ISO 8601, UTC), ``level``, ``logger``, ``message``, ``exception`` and
    ``stack`` when present, the current OpenTelemetry span's ``trace_id`` and
    ``span_id`` when it is valid, the ``context`` fields, and the record's ``extra=``
    fields (which win over the context). A key without a value is left out.

    orjson escapes control characters, so a record is one line whatever its message.
    """

    def __init__(self, context: Context = _no_context) -> None:
        super().__init__(reserved_attrs=list(_NOT_EXTRA))
        self._context = context

    def add_fields(
        self, log_data: dict[str, Any], record: logging.LogRecord, message_dict: dict[str, Any]
    ) -> None:
        created = datetime.fromtimestamp(record.created, UTC)
        log_data["time"] = created.isoformat(timespec="milliseconds").replace("+00:00", "Z")
        log_data["level"] = record.levelname
        log_data["logger"] = record.name
        log_data["message"] = record.message
        # A dict logged as the message gives its keys as fields.
        fields = dict(message_dict)
        log_data["exception"] = fields.pop("exc_info", None)
        log_data["stack"] = fields.pop("stack_info", None)
        span = trace.get_current_span().get_span_context()
        if span.is_valid:
            log_data["trace_id"] = trace.format_trace_id(span.trace_id)
            log_data["span_id"] = trace.format_span_id(span.span_id)
        log_data.update(self._context())
        log_data.update(fields)
        merge_record_extra(record, log_data, reserved=self._skip_fields)

    def process_log_record(self, log_data: dict[str, Any]) -> dict[str, Any]:
        return {key: value for key, value in log_data.items() if value is not None}


def configure(
    level: str | int,
    log_format: LogFormat,
    *,
    context: Context = _no_context,
    text_format: str = TEXT_FORMAT,
) -> None:
    """Log to stderr at ``level`` in ``log_format``: once per process, at its entry
    point. As :func:`logging.basicConfig`, it leaves a logging already configured
    alone (a test's capture, a host program's own). In JSON, an exception that ends
    the process is logged too."""
    handler = logging.StreamHandler()
    handler.setFormatter(
        JsonLines(context) if log_format == "json" else logging.Formatter(text_format)
    )
    logging.basicConfig(level=level, handlers=[handler])
    if log_format == "json" and handler in logging.getLogger().handlers:
        # A process that dies of an exception would print its traceback as text lines
        # among the JSON ones: logged instead, as one line.
        sys.excepthook = _log_uncaught


def _log_uncaught(
    kind: type[BaseException], value: BaseException, tb: TracebackType | None
) -> None:
    if issubclass(kind, KeyboardInterrupt):
        sys.__excepthook__(kind, value, tb)
        return
    logging.getLogger("uncaught").critical("the process died", exc_info=(kind, value, tb))
