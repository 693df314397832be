"""The relay's settings: built once by the entry point and passed down.

Nothing here reads the environment; ``python -m outbox_relay`` builds a
:class:`RelayConfig` from its arguments and the dispatcher CLI from its own settings.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta

from kit.owners import owner_id

_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,47}$")


def libpq_url(url: str) -> str:
    """Accept SQLAlchemy-style ``postgresql+psycopg://`` URLs as well as libpq ones."""
    for prefix in ("postgresql+psycopg://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql://" + url[len(prefix) :]
    return url


@dataclass(frozen=True, slots=True, kw_only=True)
class RelayConfig:
    """Everything a relay instance needs; validated on construction (``ValueError``)."""

    database_url: str
    kafka_bootstrap: str
    table: str = "outbox"
    """The outbox table; its lane and relay tables and notify channel derive from it."""
    enable_idempotence: bool = True
    """Idempotent producer. Brokers without it (Tansu) need ``False``."""
    topic_prefix: str = ""
    """Prepended to a row's ``topic`` unless :attr:`topic_map` names it."""
    topic_map: Mapping[str, str] = field(default_factory=dict)
    """Row topic -> Kafka topic, for the rows whose topic needs renaming."""
    relay_id: str = field(default_factory=lambda: owner_id("relay"))
    """Lease owner name (by default ``relay:<host>:<pid>:<random>``, unique to this
    process start). A restarted process given the same id takes its lanes back
    at once instead of waiting for their leases to expire."""
    batch_size: int = 1000
    poll_interval: float = 1.0
    """Seconds between reads when no notification arrives (a lost NOTIFY costs this)."""
    read_interval: float = 0.01
    """Seconds at least from one read's start to the next's. A relay whose last read
    found rows reads again this long after it, without a notification: under a steady
    stream of commits, the rows committed meanwhile go in one batch (one read, one
    produce request a partition and one mark) rather than one batch a commit. A row of
    the stream waits up to this long; the first row after an idle spell is read the
    moment it is notified. 0 reads again as soon as a batch is done."""
    lease_ttl: float = 15.0
    """A lane whose owner has not renewed it for this long may be taken over."""
    retention: timedelta = timedelta(hours=24)
    """Published rows older than this are deleted."""
    retention_interval: float = 60.0
    retention_batch: int = 5000
    metrics_interval: float = 5.0
    backoff_initial: float = 0.1
    backoff_max: float = 30.0
    request_timeout_ms: int = 30_000
    max_message_bytes: int = 1_048_576
    """Larger messages are dead-lettered without being sent."""
    linger_ms: int = 0
    metadata_max_age_ms: int = 300_000
    """How soon the producer sees a topic's partitions change without an error saying so."""

    def __post_init__(self) -> None:
        if not _IDENTIFIER.match(self.table):
            raise ValueError(f"table must be a lower-case SQL identifier, got {self.table!r}")
        if not self.database_url.startswith(
            ("postgresql://", "postgresql+psycopg://", "postgres://")
        ):
            raise ValueError("database_url must be a postgresql:// URL")
        if not self.kafka_bootstrap.strip():
            raise ValueError("kafka_bootstrap must name at least one host:port")
        if not self.relay_id:
            raise ValueError("relay_id must not be empty")
        positive: dict[str, float] = {
            "batch_size": self.batch_size,
            "poll_interval": self.poll_interval,
            "lease_ttl": self.lease_ttl,
            "retention_interval": self.retention_interval,
            "retention_batch": self.retention_batch,
            "metrics_interval": self.metrics_interval,
            "backoff_initial": self.backoff_initial,
            "backoff_max": self.backoff_max,
            "request_timeout_ms": self.request_timeout_ms,
            "max_message_bytes": self.max_message_bytes,
        }
        for name, value in positive.items():
            if value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
        if self.metadata_max_age_ms <= 0:
            raise ValueError("metadata_max_age_ms must be positive")
        if self.read_interval < 0:
            raise ValueError("read_interval must not be negative")
        if self.linger_ms < 0:
            raise ValueError("linger_ms must not be negative")
        if self.retention < timedelta(0):
            raise ValueError("retention must not be negative")

    @property
    def conninfo(self) -> str:
        """The database URL in the form psycopg accepts."""
        return libpq_url(self.database_url)

    def kafka_topic(self, row_topic: str) -> str:
        """Where a row whose ``topic`` column is ``row_topic`` is published."""
        return self.topic_map.get(row_topic) or self.topic_prefix + row_topic
