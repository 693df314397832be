"""Publishes outbox rows to Kafka, at least once and in order per key.

Knows outbox rows and Kafka, nothing about what the rows mean. See
``outbox_relay/README.md`` and :mod:`outbox_relay.relay` for the mechanism.
"""

from outbox_relay.config import RelayConfig
from outbox_relay.dead_letters import (
    DeadLetter,
    discard_dead_letter,
    list_dead_letters,
    retry_dead_letter,
)
from outbox_relay.relay import BatchResult, run_once, run_relay
from outbox_relay.retention import purge_published
from outbox_relay.table import OutboxMessage, outbox_table

__all__ = [
    "BatchResult",
    "DeadLetter",
    "OutboxMessage",
    "RelayConfig",
    "discard_dead_letter",
    "list_dead_letters",
    "outbox_table",
    "purge_published",
    "retry_dead_letter",
    "run_once",
    "run_relay",
]
