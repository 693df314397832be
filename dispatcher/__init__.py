"""tool-dispatcher: crash-safe, at-most-once execution of side-effecting tool calls.

The library surface for producers that write in their own PostgreSQL transaction:
``await dispatcher.submit(session, SubmitRequest(...), tenant=..., registry=...)``.
"""

from dispatcher.capabilities import Capability, CapabilityRegistry, load_registry
from dispatcher.errors import DispatcherError
from dispatcher.intake.service import Submission, SubmitRequest, submit, submit_many
from dispatcher.schemas import EventView, ToolCallView
from dispatcher.settings import Settings, load_settings
from dispatcher.states import ExecutionStatus, ReconciliationStatus, VerificationStatus

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
