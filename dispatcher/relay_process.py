"""The dispatcher's relay process: its topics first, then :mod:`outbox_relay`."""

from __future__ import annotations

import asyncio

import outbox_relay
from dispatcher.db.tables import outbox
from dispatcher.settings import Settings
from dispatcher.topics import ensure_topics_when_reachable


def relay_config(settings: Settings) -> outbox_relay.RelayConfig:
    """The relay of the dispatcher's outbox, tuned by ``settings.relay``; ``ValueError``
    if a setting is out of range."""
    if settings.database_url is None or settings.kafka_bootstrap is None:
        raise ValueError("the relay needs a database and a Kafka bootstrap")
    return outbox_relay.RelayConfig(
        database_url=settings.database_url,
        kafka_bootstrap=settings.kafka_bootstrap,
        enable_idempotence=settings.kafka_enable_idempotence,
        metadata_max_age_ms=settings.kafka_metadata_max_age_ms,
        # Rows name the topics the dispatcher's settings chose and created: published as
        # they are, no prefix, no renaming.
        table=outbox.name,
        **settings.relay.model_dump(exclude_none=True),
    )


async def run_relay_process(
    settings: Settings, config: outbox_relay.RelayConfig, stop: asyncio.Event
) -> None:
    """`tool-dispatcher relay`: the service's topics first (waiting for the broker if
    need be: a relay that found them missing would dead-letter its rows), then the
    relay until ``stop``."""
    if await ensure_topics_when_reachable(settings, stop):
        await outbox_relay.run_relay(config, stop)
