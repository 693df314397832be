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


class ApprovalNotFound(DispatcherError):
    code, status, title = "approval_not_found", 404, "Approval not found"

    def __init__(self, approval_id: str) -> None:
        super().__init__(f"no approval {approval_id!r}", approvalId=approval_id)


class ApprovalAlreadyDecided(DispatcherError):
    """The first decision won; this one changes nothing."""

    code, status, title = "approval_already_decided", 409, "Approval already decided"

    def __init__(self, approval_id: str, decision: str | None, decided_by: str | None) -> None:
        super().__init__(
            f"approval {approval_id!r} was already decided ({decision})",
            approvalId=approval_id,
            decision=decision,
            decidedBy=decided_by,
        )


class ApprovalExpired(DispatcherError):
    code, status, title = "approval_expired", 409, "Approval expired"

    def __init__(self, approval_id: str, expires_at: str) -> None:
        super().__init__(
            f"approval {approval_id!r} expired at {expires_at}",
            approvalId=approval_id,
            expiresAt=expires_at,
        )


class ApprovalStale(DispatcherError):
    """The call's input or the capability's policy changed since the approval was asked."""

    code, status, title = "approval_stale", 409, "Approval no longer matches the call"

    def __init__(self, approval_id: str, what: str) -> None:
        super().__init__(
            f"approval {approval_id!r} was asked for another {what}; ask again",
            approvalId=approval_id,
            changed=what,
        )


class SelfApprovalForbidden(DispatcherError):
    code, status, title = "self_approval_forbidden", 403, "Self-approval is not allowed"

    def __init__(self, approval_id: str, who: str) -> None:
        super().__init__(
            f"{who!r} submitted this call and cannot approve it", approvalId=approval_id
        )


class CapabilityUnavailable(DispatcherError):
    """The capability was removed or disabled since the call was proposed."""

    code, status, title = "capability_unavailable", 409, "Capability unavailable"

    def __init__(self, capability_id: str, why: str) -> None:
        super().__init__(f"capability {capability_id!r} {why}", capabilityId=capability_id)


class RunStopped(DispatcherError):
    code, status, title = "run_stopped", 409, "Run stopped"

    def __init__(self, run_id: str) -> None:
        super().__init__(f"run {run_id!r} was stopped and accepts no more calls", runId=run_id)


class RunNotFound(DispatcherError):
    code, status, title = "run_not_found", 404, "Run not found"

    def __init__(self, run_id: str) -> None:
        super().__init__(f"no run {run_id!r}", runId=run_id)


class RetryNotAllowed(DispatcherError):
    code, status, title = "retry_not_allowed", 409, "Retry not allowed"

    def __init__(self, tool_call_id: str, status: str, reason: str) -> None:
        super().__init__(reason, toolCallId=tool_call_id, currentStatus=status)
