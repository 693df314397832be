"""The run's topics after a broker restart, as a real broker would have kept them."""

from __future__ import annotations

import contextlib
import logging

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from dispatcher.settings import Settings
from dispatcher.topics import ensure_topics, wanted_topics

log = logging.getLogger(__name__)


class TopicsNotRestored(RuntimeError):
    """The run's topics could not be given their partitions back."""


async def restore_topics(settings: Settings, attempts: int = 20) -> None:
    """Every topic of ``settings`` with exactly ``topic_partitions`` partitions.

    Tansu forgets its topics when it stops, and creates a missing one, with 4
    partitions, on the first metadata request that names it: a client reconnecting
    right after the restart can ask before :func:`ensure_topics` does (a slow machine
    loses that race more often). Worse, it acks writes to partitions a topic does not
    have, and no consumer ever sees them: a relay still holding the 8-partition picture
    from before the restart would lose a quarter of its messages without an error, again
    at every redrive. So a topic created with the wrong count is deleted and created
    again, until every one is right (the clients' next metadata refresh sees them).
    """
    if settings.kafka_bootstrap is None:
        raise ValueError("no Kafka configured (TOOL_DISPATCHER_KAFKA_BOOTSTRAP)")
    wanted = wanted_topics(settings)
    for _ in range(attempts):
        await ensure_topics(settings)
        admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap)
        try:
            await admin.start()
            counts = {
                d["topic"]: len(d["partitions"])
                for d in await admin.describe_topics(wanted)
                if d["error_code"] == 0
            }
            wrong = [t for t, n in counts.items() if n != settings.topic_partitions]
            if not wrong and len(counts) == len(wanted):
                return
            if wrong:
                log.warning(
                    "the restarted broker made %s with too few partitions; making them again",
                    ", ".join(f"{t} ({counts[t]})" for t in wrong),
                )
                await admin.delete_topics(wrong)
                with contextlib.suppress(TopicAlreadyExistsError):
                    await admin.create_topics(
                        [NewTopic(t, settings.topic_partitions, 1) for t in wrong]
                    )
        finally:
            await admin.close()
    raise TopicsNotRestored(
        f"topics {wanted} still lack {settings.topic_partitions} partitions"
        f" after {attempts} attempts"
    )
