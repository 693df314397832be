"""The dispatcher's errors: one tree. Each leaf names its stable ``code`` (public:
docs/api.md lists them, the HTTP client maps them back to these classes); a branch names
the HTTP status and title its leaves share, and whether trying again can help
(``retriable``). :mod:`dispatcher.api.problems` is the one place that turns them into
problem+json.

    DispatcherError                    500 internal_error (the root; never raised itself)
    ├── InvalidRequest                 400 the request itself is wrong; resending it fails again
    │   ├── ValidationFailed               validation_failed
    │   ├── UnreadableRecord               unreadable_record (a bus record that is no request)
    │   └── PayloadTooLarge            413 payload_too_large
    ├── Unauthenticated                401 unauthenticated
    ├── Forbidden                      403 forbidden (the key lacks the scope)
    │   ├── CsrfRejected                   csrf_rejected (a console form's token or origin)
    │   ├── TenantMismatch                 tenant_mismatch (a bus record names another tenant)
    │   └── SelfApprovalForbidden          self_approval_forbidden
    ├── NotFound                       404 (another tenant's things are not found either)
    │   ├── CapabilityNotFound             capability_not_found
    │   ├── ToolCallNotFound               tool_call_not_found
    │   ├── RunNotFound                    run_not_found
    │   ├── ApprovalNotFound               approval_not_found
    │   ├── EscalationNotFound             escalation_not_found
    │   ├── DeadLetterNotFound             dead_letter_not_found
    │   ├── OperationNotFound              operation_not_found
    │   └── WebhookDeliveryNotFound        webhook_delivery_not_found
    ├── Conflict                       409 the state of what it names does not allow it
    │   ├── ToolCallIdConflict             tool_call_id_conflict
    │   ├── TransitionConflict             transition_conflict (retriable: moved concurrently)
    │   ├── RunStopped                     run_stopped
    │   ├── CapabilityUnavailable          capability_unavailable
    │   ├── RetryNotAllowed                retry_not_allowed
    │   ├── ApprovalAlreadyDecided         approval_already_decided
    │   ├── ApprovalExpired                approval_expired
    │   ├── ApprovalStale                  approval_stale
    │   ├── EscalationAlreadyResolved      escalation_already_resolved
    │   └── OperationFinished              operation_finished
    ├── Unprocessable                  422 well-formed, but contradicts what is recorded
    │   └── IdempotencyKeyReused           idempotency_key_reused
    ├── LimitExceeded                  a limit that shields the shared service (retriable later)
    │   ├── RateLimited                429 rate_limited (with Retry-After)
    │   └── RequestTimeout             408 request_timeout (the head or body came too slowly)
    ├── ServiceUnavailable             503 service_unavailable (retriable: send it again)
    └── InternalError                  500 internal_error: a bug of this program, not the client's
        └── IllegalTransition              a move the transition tables forbid

An :class:`InternalError` is logged with its traceback and answered as a plain
``internal_error``: its detail is for the log, not for the client, who cannot cause it.
"""

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


class InvalidRequest(DispatcherError):
    """The request is malformed; sending it again unchanged fails again."""

    status, title = 400, "Invalid request"


class ValidationFailed(InvalidRequest):
    code, title = "validation_failed", "The request is not valid"


class UnreadableRecord(InvalidRequest):
    """A request record on the bus that is not a CloudEvent carrying a JSON submission:
    no or malformed ``ce_`` headers, a value that is not a JSON object. It goes to the
    dead-letter topic as it came."""

    code, title = "unreadable_record", "The record is not a readable request"


class PayloadTooLarge(InvalidRequest):
    code, status, title = "payload_too_large", 413, "Request body too large"


class Unauthenticated(DispatcherError):
    """No API key, or one that is not configured."""

    code, status, title = "unauthenticated", 401, "Missing or invalid credentials"


class Forbidden(DispatcherError):
    """The caller is known but not allowed to do this."""

    code, status, title = "forbidden", 403, "Not allowed"


class CsrfRejected(Forbidden):
    """A console form arrived without the session's token, or from another origin:
    a cross-site request, refused before it touches anything."""

    code, title = "csrf_rejected", "Form token missing or invalid"


class TenantMismatch(Forbidden):
    """A request record names a tenant other than its topic's: the topic decides."""

    code, title = "tenant_mismatch", "The record names another tenant"


class SelfApprovalForbidden(Forbidden):
    code, title = "self_approval_forbidden", "Self-approval is not allowed"

    def __init__(self, approval_id: str, who: str) -> None:
        super().__init__(
            f"{who!r} submitted this call and cannot approve it", approvalId=approval_id
        )


class NotFound(DispatcherError):
    """What the request names does not exist (or belongs to another tenant)."""

    status, title = 404, "Not found"


class CapabilityNotFound(NotFound):
    code, title = "capability_not_found", "Unknown capability"

    def __init__(self, capability_id: str) -> None:
        super().__init__(
            f"no capability {capability_id!r} is registered", capabilityId=capability_id
        )


class ToolCallNotFound(NotFound):
    code, title = "tool_call_not_found", "Tool call not found"

    def __init__(self, tool_call_id: str) -> None:
        super().__init__(f"no tool call {tool_call_id!r}", toolCallId=tool_call_id)


class RunNotFound(NotFound):
    code, title = "run_not_found", "Run not found"

    def __init__(self, run_id: str) -> None:
        super().__init__(f"no run {run_id!r}", runId=run_id)


class ApprovalNotFound(NotFound):
    code, title = "approval_not_found", "Approval not found"

    def __init__(self, approval_id: str) -> None:
        super().__init__(f"no approval {approval_id!r}", approvalId=approval_id)


class EscalationNotFound(NotFound):
    code, title = "escalation_not_found", "Escalation not found"

    def __init__(self, escalation_id: str) -> None:
        super().__init__(f"no escalation {escalation_id!r}", escalationId=escalation_id)


class DeadLetterNotFound(NotFound):
    """No dead-lettered outbox row with this id names the caller's tenant (it was
    retried or discarded meanwhile, never existed, or is another tenant's)."""

    code, title = "dead_letter_not_found", "Dead letter not found"

    def __init__(self, row_id: int) -> None:
        super().__init__(f"no dead letter with id {row_id}", rowId=row_id)


class OperationNotFound(NotFound):
    """No bulk operation with this id is the caller's tenant's (an ``admin`` sees
    every tenant's)."""

    code, title = "operation_not_found", "Operation not found"

    def __init__(self, operation_id: str) -> None:
        super().__init__(f"no operation {operation_id!r}", operationId=operation_id)


class WebhookDeliveryNotFound(NotFound):
    """No dead webhook delivery with this id is the caller's tenant's (it was sent
    again meanwhile, never existed, or is another tenant's)."""

    code, title = "webhook_delivery_not_found", "Webhook delivery not found"

    def __init__(self, delivery_id: str) -> None:
        super().__init__(f"no dead webhook delivery {delivery_id!r}", deliveryId=delivery_id)


class Conflict(DispatcherError):
    """What the request names is in a state that does not allow it."""

    status, title = 409, "Conflict"


class ToolCallIdConflict(Conflict):
    code, title = "tool_call_id_conflict", "Tool call id already used"

    def __init__(self, tool_call_id: str) -> None:
        super().__init__(
            "this toolCallId already names a call with another idempotency key",
            toolCallId=tool_call_id,
        )


class TransitionConflict(Conflict):
    """The call was not in the expected state (another worker moved it first)."""

    code, title = "transition_conflict", "The call changed concurrently"
    retriable = True


class RunStopped(Conflict):
    code, title = "run_stopped", "Run stopped"

    def __init__(self, run_id: str) -> None:
        super().__init__(f"run {run_id!r} was stopped and accepts no more calls", runId=run_id)


class CapabilityUnavailable(Conflict):
    """The capability was removed or disabled since the call was proposed."""

    code, title = "capability_unavailable", "Capability unavailable"

    def __init__(self, capability_id: str, why: str) -> None:
        super().__init__(f"capability {capability_id!r} {why}", capabilityId=capability_id)


class RetryNotAllowed(Conflict):
    code, title = "retry_not_allowed", "Retry not allowed"

    def __init__(self, tool_call_id: str, status: str, reason: str) -> None:
        super().__init__(reason, toolCallId=tool_call_id, currentStatus=status)


class ApprovalAlreadyDecided(Conflict):
    """The first decision won; this one changes nothing."""

    code, title = "approval_already_decided", "Approval already decided"

    def __init__(self, approval_id: str, decision: str | None, decided_by: str | None) -> None:
        super().__init__(
            f"approval {approval_id!r} was already decided ({decision})",
            approvalId=approval_id,
            decision=decision,
            decidedBy=decided_by,
        )


class ApprovalExpired(Conflict):
    code, title = "approval_expired", "Approval expired"

    def __init__(self, approval_id: str, expires_at: str) -> None:
        super().__init__(
            f"approval {approval_id!r} expired at {expires_at}",
            approvalId=approval_id,
            expiresAt=expires_at,
        )


class ApprovalStale(Conflict):
    """The call's input or the capability's policy changed since the approval was asked."""

    code, title = "approval_stale", "Approval no longer matches the call"

    def __init__(self, approval_id: str, what: str) -> None:
        super().__init__(
            f"approval {approval_id!r} was asked for another {what}; ask again",
            approvalId=approval_id,
            changed=what,
        )


class EscalationAlreadyResolved(Conflict):
    code, title = "escalation_already_resolved", "Escalation already resolved"

    def __init__(self, escalation_id: str, finding: str | None) -> None:
        super().__init__(
            f"escalation {escalation_id!r} was already resolved ({finding})",
            escalationId=escalation_id,
            finding=finding,
        )


class OperationFinished(Conflict):
    """A bulk operation that completed or was cancelled cannot be cancelled (again)."""

    code, title = "operation_finished", "Operation already finished"

    def __init__(self, operation_id: str, state: str) -> None:
        super().__init__(
            f"operation {operation_id!r} is already {state}", operationId=operation_id, state=state
        )


class Unprocessable(DispatcherError):
    """The request is well-formed but contradicts what is already recorded."""

    status, title = 422, "Unprocessable request"


class IdempotencyKeyReused(Unprocessable):
    code, title = "idempotency_key_reused", "Idempotency key reused"

    def __init__(
        self, key: str, tool_call_id: str | None = None, *, operation_id: str | None = None
    ) -> None:
        # The answer names what the key made: a tool call, or a bulk operation.
        made = (
            {"toolCallId": tool_call_id} if operation_id is None else {"operationId": operation_id}
        )
        super().__init__(
            "this idempotency key was already used for a different request",
            idempotencyKey=key,
            **made,
        )


class LimitExceeded(DispatcherError):
    """A limit that keeps one client from starving the others was hit. Nothing was
    recorded; the same request may succeed after ``retry_after`` seconds."""

    status, title = 429, "Limit exceeded"
    retriable = True

    def __init__(self, detail: str, *, retry_after: int | None = None, **extra: Any) -> None:
        if retry_after is not None:
            extra["retryAfterSeconds"] = retry_after
        super().__init__(detail, **extra)
        self.retry_after = retry_after


class RateLimited(LimitExceeded):
    """The tenant sent more than its share (submissions per second, or long-polls held
    at once); ``Retry-After`` says when to try again."""

    code, title = "rate_limited", "Too many requests"


class RequestTimeout(LimitExceeded):
    """The request's head or body did not arrive in time (a slow or stalled client)."""

    code, status, title = "request_timeout", 408, "Request not received in time"


class ServiceUnavailable(DispatcherError):
    """A dependency (the database) cannot be used right now. Sending the same request
    again is safe: intake replays a recorded call by its idempotency key."""

    code, status, title = "service_unavailable", 503, "Temporarily unavailable"
    retriable = True


class InternalError(DispatcherError):
    """A bug of this program: an invariant does not hold. No client can cause it."""


class IllegalTransition(InternalError):
    """The code asked for a move its transition table forbids (:mod:`dispatcher.states`)."""

    def __init__(self, current: str, target: str, *, subject: str = "a call") -> None:
        super().__init__(
            f"{subject} in {current!r} cannot move to {target!r}", current=current, target=target
        )


def problem(exc: DispatcherError) -> dict[str, Any]:
    """The problem+json body of ``exc`` (RFC 9457), wherever it is answered: the HTTP
    API's responses and bus intake's replies. An :class:`InternalError`'s detail names
    the program's own states; its answer says only that the service failed."""
    if isinstance(exc, InternalError):
        return problem_body(500, "internal_error", "Internal error", "an unexpected error occurred")
    return problem_body(exc.status, exc.code, exc.title, exc.detail, **exc.extra)


def problem_body(status: int, code: str, title: str, detail: str, **extra: Any) -> dict[str, Any]:
    return {
        "type": f"urn:tool-dispatcher:problem:{code}",
        "title": title,
        "status": status,
        "code": code,
        "detail": detail,
        **extra,
    }
