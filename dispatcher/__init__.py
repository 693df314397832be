"""tool-dispatcher: crash-safe, at-most-once execution of side-effecting tool calls.

The library surface for producers that write in their own PostgreSQL transaction:
``await dispatcher.submit(session, SubmitRequest(...), tenant=..., registry=...)``.

Each name is imported on first use (PEP 562), so importing a light subpackage such as
:mod:`dispatcher.client` does not load SQLAlchemy and the server along with it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dispatcher.capabilities import Capability, CapabilityRegistry, load_registry
    from dispatcher.errors import DispatcherError
    from dispatcher.intake.service import submit, submit_many
    from dispatcher.schemas import EventView, Submission, SubmitRequest, ToolCallView
    from dispatcher.settings import Settings, load_settings
    from dispatcher.states import ExecutionStatus, ReconciliationStatus, VerificationStatus

_HOMES = {
    "Capability": "dispatcher.capabilities",
    "CapabilityRegistry": "dispatcher.capabilities",
    "DispatcherError": "dispatcher.errors",
    "EventView": "dispatcher.schemas",
    "ExecutionStatus": "dispatcher.states",
    "ReconciliationStatus": "dispatcher.states",
    "Settings": "dispatcher.settings",
    "Submission": "dispatcher.schemas",
    "SubmitRequest": "dispatcher.schemas",
    "ToolCallView": "dispatcher.schemas",
    "VerificationStatus": "dispatcher.states",
    "load_registry": "dispatcher.capabilities",
    "load_settings": "dispatcher.settings",
    "submit": "dispatcher.intake.service",
    "submit_many": "dispatcher.intake.service",
}

__all__ = [
    "Capability",
    "CapabilityRegistry",
    "DispatcherError",
    "EventView",
    "ExecutionStatus",
    "ReconciliationStatus",
    "Settings",
    "Submission",
    "SubmitRequest",
    "ToolCallView",
    "VerificationStatus",
    "load_registry",
    "load_settings",
    "submit",
    "submit_many",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
