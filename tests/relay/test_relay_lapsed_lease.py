"""A relay whose lane leases lapsed reads nothing from those lanes.

A lease lapses when its relay stopped renewing it (paused, partitioned from the
database, stuck in a long GC): from that instant another relay may take the lane and
publish it. The stale relay must not read the lane any more, or two relays publish
one key at once and its order is lost. The claim read carries the lease test in the
same statement (``l.expires_at > now()`` in ``outbox_relay.queries``), so there is no
window between "my lease is valid" and "read the rows". The other relay tests hand
lanes over only by release or by another owner taking them, where the owner test
alone already hides the lane; here the lease lapses with the owner unchanged, the
case only the expiry test covers.
"""

from __future__ import annotations

import pytest

from devtools.databases import unique_name
from outbox_relay.relay import BatchResult, Relay
from tests.fixtures.relay import TopicReader, insert, message, relay_config, scalar, unpublished

pytestmark = [pytest.mark.postgres, pytest.mark.kafka]


async def test_a_relay_whose_leases_lapsed_reads_nothing(
    database_url: str, kafka_bootstrap: str
) -> None:
    """Guards: a relay reads only the lanes it holds an *unexpired* lease on, tested in
    the read itself. With its leases lapsed (owner unchanged, nobody took them yet) the
    relay's batch reads and publishes nothing; renewed, the same relay publishes all."""
    topic = unique_name("relay-lapsed")
    config = relay_config(database_url, kafka_bootstrap)
    await insert(database_url, [message(topic, f"k{i}", i) for i in range(8)])

    async with Relay(config) as relay:
        owned = await relay.heartbeat()
        lanes = await scalar(database_url, "SELECT count(*) FROM outbox_lanes")
        assert len(owned) == lanes  # the only relay: every row's lane is its own

        # The relay stops renewing (run_once does not heartbeat) and its leases lapse.
        lapsed = await scalar(
            database_url,
            "WITH l AS (UPDATE outbox_lanes SET expires_at = now() - interval '1 second' "
            "WHERE owner = %s RETURNING 1) SELECT count(*) FROM l",
            config.relay_id,
        )
        assert lapsed == lanes
        assert relay.leases.owned == owned  # it still believes it holds them

        assert await relay.run_once() == BatchResult()
        assert await unpublished(database_url) == 8
        assert await scalar(database_url, "SELECT max(attempts) FROM outbox") == 0

        # Renewed (nobody took the lanes meanwhile), the same relay reads them all.
        await relay.heartbeat()
        assert await relay.run_once() == BatchResult(read=8, published=8)
    assert await unpublished(database_url) == 0

    async with TopicReader(kafka_bootstrap, topic) as reader:
        messages = await reader.distinct(8, within=20)
    # Every row on the topic, sent by the renewed relay.
    assert sorted(m.seq for m in messages) == list(range(8))
