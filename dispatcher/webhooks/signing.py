"""The Standard Webhooks headers of one attempt.

``webhook-id`` is the delivery's id, the same on every attempt (a receiver drops
duplicates by it); ``webhook-timestamp`` is the attempt's time, so a receiver's
tolerance window (five minutes in ``standardwebhooks``) refuses a replay of an old
attempt; ``webhook-signature`` is the HMAC-SHA256 of ``id.timestamp.body`` under the
subscription's secret, as ``standardwebhooks.Webhook.sign`` computes it.
"""

from __future__ import annotations

from datetime import UTC, datetime

from standardwebhooks import Webhook


def headers(
    secret: str, *, webhook_id: str, body: str, now: datetime | None = None
) -> dict[str, str]:
    """The headers of a POST of ``body`` (the exact text sent) signed with ``secret``
    (``whsec_`` + base64, or the bare base64)."""
    at = now or datetime.now(UTC)
    return {
        "content-type": "application/json",
        "webhook-id": webhook_id,
        "webhook-timestamp": str(int(at.timestamp())),
        "webhook-signature": Webhook(secret).sign(webhook_id, at, body),
    }
