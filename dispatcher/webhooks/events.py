"""The event types of webhooks, and the body each delivery carries.

A body is fixed once, when a notification is fanned out to a subscription, and stored
with the delivery: every attempt signs and sends the same bytes under the same
``webhook-id``, so a receiver can drop duplicates by that id.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Final, get_args

from dispatcher.webhook_settings import WebhookEvent

EVENT_TYPES: Final[frozenset[str]] = frozenset(get_args(WebhookEvent))
"""``escalation.opened``, ``approval.pending``, ``approval.expiring``,
``breaker.opened``, ``breaker.closed``, ``dead_letter.written``, ``operation.finished``."""

ESCALATION_OPENED: Final = "escalation.opened"
APPROVAL_PENDING: Final = "approval.pending"
APPROVAL_EXPIRING: Final = "approval.expiring"
BREAKER_OPENED: Final = "breaker.opened"
BREAKER_CLOSED: Final = "breaker.closed"
DEAD_LETTER_WRITTEN: Final = "dead_letter.written"
OPERATION_FINISHED: Final = "operation.finished"


def body(
    *,
    notification_id: str,
    event_type: str,
    tenant: str | None,
    occurred_at: datetime,
    data: dict[str, Any],
) -> str:
    """The JSON a receiver gets: Standard Webhooks' ``type``, ``timestamp`` and
    ``data``, with the notification's id and its tenant (null: every tenant's)."""
    return json.dumps(
        {
            "type": event_type,
            "timestamp": occurred_at.isoformat(),
            "id": notification_id,
            "tenant": tenant,
            "data": data,
        },
        separators=(",", ":"),
        ensure_ascii=False,
    )


def approval_data(approval: Mapping[Any, Any]) -> dict[str, Any]:
    """What a receiver is told of an approval (``approval.pending``, ``.expiring``):
    which call waits for a decision, until when; never the call's input."""
    return {
        "approvalId": approval["approval_id"],
        "toolCallId": approval["tool_call_id"],
        "runId": approval["run_id"],
        "capabilityId": approval["capability_id"],
        "risk": approval["risk"],
        "expiresAt": approval["expires_at"],
    }
