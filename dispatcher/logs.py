"""Logging of every process: configured once at its entry point from the settings
(``TOOL_DISPATCHER_LOG_FORMAT``, ``TOOL_DISPATCHER_LOG_LEVEL``), in the line format of
:mod:`kit.logs`, plus the tool call a line is about.

Code that works on one call wraps it in :func:`log_context`; every JSON line written
inside carries that call's ``tool_call_id``, ``run_id`` and ``capability_id``. A
contextvar, so each asyncio task (a worker's send, a reconciler's lookup) has its own.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from types import MappingProxyType

from dispatcher.settings import Settings
from kit import logs

TRANSITIONS_LOGGER = "tool_dispatcher.transitions"
"""One INFO line per status transition of a call (dispatcher.ledger.transitions)."""

_context: ContextVar[Mapping[str, str]] = ContextVar(
    "tool_dispatcher_log_context", default=MappingProxyType({})
)


@contextmanager
def log_context(
    *, tool_call_id: str | None = None, run_id: str | None = None, capability_id: str | None = None
) -> Iterator[None]:
    """Within the block, log lines carry these ids (those that are not None), on top
    of an enclosing block's."""
    given = {"tool_call_id": tool_call_id, "run_id": run_id, "capability_id": capability_id}
    token = _context.set({**_context.get(), **{k: v for k, v in given.items() if v is not None}})
    try:
        yield
    finally:
        _context.reset(token)


def current_context() -> Mapping[str, str]:
    """The ids of the innermost :func:`log_context` (empty outside any)."""
    return _context.get()


def configure_logging(settings: Settings, *, quiet: bool = False) -> None:
    """Log to stderr in the configured format and level; ``quiet`` commands default to
    WARNING, their output being their story."""
    level = settings.log_level or ("WARNING" if quiet else "INFO")
    logs.configure(level, settings.log_format, context=current_context)
