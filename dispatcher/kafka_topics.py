"""Creating the service's topics before anyone consumes them (a consumer subscribed to
a missing topic would only notice it at its next metadata refresh)."""

from __future__ import annotations

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from dispatcher.settings import Settings


async def ensure_topics(settings: Settings) -> None:
    if settings.kafka_bootstrap is None:
        raise ValueError("no Kafka configured (TOOL_DISPATCHER_KAFKA_BOOTSTRAP)")
    wanted = [settings.dispatch_topic, settings.events_topic, settings.escalations_topic]
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        missing = [t for t in wanted if t not in existing]
        if missing:
            try:
                await admin.create_topics(
                    [NewTopic(t, settings.topic_partitions, 1) for t in missing]
                )
            except TopicAlreadyExistsError:
                pass  # another process created it first
    finally:
        await admin.close()
