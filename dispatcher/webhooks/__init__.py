"""Webhooks: signed notifications to each tenant's configured receivers.

:func:`notify` writes a notification in the transaction of the fact it reports; the
sender (:mod:`dispatcher.webhooks.sender`, run by ``tool-dispatcher webhooks``) fans it
out to subscriptions, signs each delivery (Standard Webhooks) and POSTs it, at least
once, with backoff, until it is delivered or dead. docs/webhooks.md is the receiver's
side.
"""

from __future__ import annotations

from dispatcher.webhooks.events import (
    APPROVAL_EXPIRING,
    APPROVAL_PENDING,
    BREAKER_CLOSED,
    BREAKER_OPENED,
    DEAD_LETTER_WRITTEN,
    ESCALATION_OPENED,
    EVENT_TYPES,
    OPERATION_FINISHED,
)
from dispatcher.webhooks.notify import notify

__all__ = [
    "APPROVAL_EXPIRING",
    "APPROVAL_PENDING",
    "BREAKER_CLOSED",
    "BREAKER_OPENED",
    "DEAD_LETTER_WRITTEN",
    "ESCALATION_OPENED",
    "EVENT_TYPES",
    "OPERATION_FINISHED",
    "notify",
]
