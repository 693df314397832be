"""Webhook settings (``TOOL_DISPATCHER_WEBHOOKS__<FIELD>``, a section of
:class:`dispatcher.settings.Settings`, which reads the environment): who is told what,
and how the sender delivers. Its own module to keep ``settings.py`` short; it reads no
environment, only the files the settings name.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator


def _secret_files(directory: Path | None) -> dict[str, str]:
    """One secret per file of ``directory``, named by the file."""
    if directory is None:
        return {}
    return {p.name: p.read_text().strip() for p in sorted(directory.iterdir()) if p.is_file()}


def _revealed(secrets: dict[str, SecretStr]) -> dict[str, str]:
    return {name: secret.get_secret_value() for name, secret in secrets.items()}


WebhookEvent = Literal[
    "escalation.opened",
    "approval.pending",
    "approval.expiring",
    "breaker.opened",
    "breaker.closed",
    "dead_letter.written",
    "operation.finished",
]
"""The event types a webhook subscription may ask for (docs/webhooks.md)."""


class WebhookSubscription(BaseModel):
    """One tenant's receiver of some event types. Its signing secret is not here: it is
    the file named ``id`` in ``webhooks.secrets_dir`` (or ``webhooks.secrets[id]``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(pattern=r"^[A-Za-z0-9._-]{1,64}$")
    tenant: str = Field(min_length=1, max_length=128)
    url: str = Field(pattern=r"^https?://[^\s]+$", max_length=2048)
    events: list[WebhookEvent] = Field(min_length=1)


class WebhookSettings(BaseModel):
    """``TOOL_DISPATCHER_WEBHOOKS__<FIELD>``: who is told what (``subscriptions``, and
    those of ``subscriptions_file``, a JSON list of the same objects) and how the sender
    (``tool-dispatcher webhooks``) delivers. Never created over the API: the service
    calls only the URLs its operator configured."""

    model_config = ConfigDict(extra="forbid")

    subscriptions: list[WebhookSubscription] = Field(default_factory=list)
    subscriptions_file: Path | None = None
    # Signing secrets (``whsec_`` + base64, as Standard Webhooks prints them): one file
    # per subscription id in secrets_dir, or by id here (which wins).
    secrets_dir: Path | None = None
    secrets: dict[str, SecretStr] = Field(default_factory=dict)
    # Attempts before a delivery is dead; the backoff doubles from backoff_initial up to
    # backoff_max (with jitter), per delivery and per subscription.
    max_attempts: int = Field(default=12, ge=1)
    backoff_initial_seconds: float = Field(default=5.0, gt=0)
    backoff_max_seconds: float = Field(default=3600.0, gt=0)
    # One POST's whole time (connect, send, answer).
    timeout_seconds: float = Field(default=10.0, gt=0)
    # POSTs in flight per sender process, and per subscription within them.
    concurrency: int = Field(default=16, ge=1)
    per_subscription: int = Field(default=4, ge=1)
    # How long a claimed delivery stays off other senders (more than timeout_seconds).
    lease_seconds: float = Field(default=60.0, gt=0)
    interval_seconds: float = Field(default=1.0, gt=0)
    # A dead delivery not sent again is removed this long after it died (the console
    # lists it until then).
    dead_kept_days: float = Field(default=30.0, gt=0)
    # An approval pending with less than this left is reported as approval.expiring.
    expiring_within_seconds: float = Field(default=900.0, gt=0)

    @model_validator(mode="after")
    def _lease_outlasts_a_post(self) -> WebhookSettings:
        # A claim that lapsed mid-POST would be sent again by another sender at once.
        if self.lease_seconds <= self.timeout_seconds:
            raise ValueError("lease_seconds must be longer than timeout_seconds")
        return self

    def all_subscriptions(self) -> list[WebhookSubscription]:
        """``subscriptions`` and those of ``subscriptions_file`` (read now). Raises
        ValueError when two share an id (their secret and backoff would be one)."""
        found = list(self.subscriptions)
        if self.subscriptions_file is not None:
            listed = json.loads(self.subscriptions_file.read_text())
            found.extend(WebhookSubscription.model_validate(item) for item in listed)
        ids = [s.id for s in found]
        if len(ids) != len(set(ids)):
            raise ValueError(f"webhook subscription ids repeat: {sorted(ids)}")
        return found

    def signing_secrets(self) -> dict[str, str]:
        """Signing secrets by subscription id: files in ``secrets_dir``, then ``secrets``."""
        found = _secret_files(self.secrets_dir)
        found.update(_revealed(self.secrets))
        return found
