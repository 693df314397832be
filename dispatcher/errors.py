"""The dispatcher's error root. Each error knows its stable ``code`` and HTTP status;
the API turns them into problem+json in one place (:mod:`dispatcher.api.problems`)."""

from __future__ import annotations

from typing import Any


class DispatcherError(Exception):
    """Root of every error the dispatcher raises on purpose."""

    code: str = "internal_error"
    status: int = 500
    title: str = "Internal error"
    retriable: bool = False

    def __init__(self, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        self.extra = extra


class ValidationFailed(DispatcherError):
    code, status, title = "validation_failed", 400, "The request is not valid"


class CapabilityNotFound(DispatcherError):
    code, status, title = "capability_not_found", 404, "Unknown capability"

    def __init__(self, capability_id: str) -> None:
        super().__init__(
            f"no capability {capability_id!r} is registered", capabilityId=capability_id
        )


class ToolCallNotFound(DispatcherError):
    code, status, title = "tool_call_not_found", 404, "Tool call not found"

    def __init__(self, tool_call_id: str) -> None:
        super().__init__(f"no tool call {tool_call_id!r}", toolCallId=tool_call_id)


class IdempotencyKeyReused(DispatcherError):
    code, status, title = "idempotency_key_reused", 422, "Idempotency key reused"

    def __init__(self, key: str, tool_call_id: str) -> None:
        super().__init__(
            "this idempotency key was already used for a different request",
            idempotencyKey=key,
            toolCallId=tool_call_id,
        )


class ToolCallIdConflict(DispatcherError):
    code, status, title = "tool_call_id_conflict", 409, "Tool call id already used"

    def __init__(self, tool_call_id: str) -> None:
        super().__init__(
            "this toolCallId already names a call with another idempotency key",
            toolCallId=tool_call_id,
        )


class IllegalTransition(DispatcherError):
    code, status, title = "illegal_transition", 409, "Illegal state transition"

    def __init__(self, current: str, target: str) -> None:
        super().__init__(
            f"a call in {current!r} cannot move to {target!r}", current=current, target=target
        )


class TransitionConflict(DispatcherError):
    """The call was not in the expected state (another worker moved it first)."""

    code, status, title = "transition_conflict", 409, "The call changed concurrently"
    retriable = True


class EscalationNotFound(DispatcherError):
    code, status, title = "escalation_not_found", 404, "Escalation not found"

    def __init__(self, escalation_id: str) -> None:
        super().__init__(f"no escalation {escalation_id!r}", escalationId=escalation_id)


class EscalationAlreadyResolved(DispatcherError):
    code, status, title = "escalation_already_resolved", 409, "Escalation already resolved"

    def __init__(self, escalation_id: str, finding: str | None) -> None:
        super().__init__(
            f"escalation {escalation_id!r} was already resolved ({finding})",
            escalationId=escalation_id,
            finding=finding,
        )


class Unauthenticated(DispatcherError):
    code, status, title = "unauthenticated", 401, "Missing or invalid credentials"


class Forbidden(DispatcherError):
    code, status, title = "forbidden", 403, "Not allowed"


class PayloadTooLarge(DispatcherError):
    code, status, title = "payload_too_large", 413, "Request body too large"


class ServiceUnavailable(DispatcherError):
    code, status, title = "service_unavailable", 503, "Temporarily unavailable"
    retriable = True
