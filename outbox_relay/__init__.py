"""Publishes outbox rows to Kafka, at least once and in order per key.

Knows outbox rows and Kafka, nothing about what the rows mean.
"""

from outbox_relay.table import OutboxMessage, outbox_table

__all__ = ["OutboxMessage", "outbox_table"]
