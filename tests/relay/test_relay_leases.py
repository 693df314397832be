"""A relay's lane leases: the lanes it holds are reported (and new ones wake it to read
them), a running relay renews them, a failed renewal is retried soon after, and the lanes
over its fair share are given up at its next batch."""

from __future__ import annotations

import logging

import psycopg
import pytest
from prometheus_client import REGISTRY

from outbox_relay.relay import Relay
from tests.fixtures.relay import RunningRelay, relay_config, scalar
from tests.fixtures.waiting import eventually

pytestmark = [pytest.mark.postgres, pytest.mark.kafka]


def _sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, {"table": "outbox", **labels}) or 0.0


async def _execute(database_url: str, statement: str) -> None:
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await conn.execute(statement)  # type: ignore[arg-type]


async def test_heartbeat_reports_the_lanes_held_and_wakes_the_relay_for_new_ones(
    database_url: str, kafka_bootstrap: str
) -> None:
    async with Relay(relay_config(database_url, kafka_bootstrap)) as relay:
        owned = await relay.heartbeat()
        assert owned
        assert _sample("outbox_relay_owned_lanes") == len(owned)
        assert relay._wake.is_set()  # new lanes may hold rows: read them now
        relay._wake.clear()
        assert await relay.heartbeat() == owned
        assert not relay._wake.is_set()


async def test_a_relay_gives_its_excess_lanes_up_at_its_next_batch(
    database_url: str, kafka_bootstrap: str
) -> None:
    first = relay_config(database_url, kafka_bootstrap, relay_id="relay-first")
    second = relay_config(database_url, kafka_bootstrap, relay_id="relay-second")
    async with Relay(first) as a, Relay(second) as b:
        lanes = await a.heartbeat()
        assert await b.heartbeat() == frozenset()  # every lane is held
        await a.heartbeat()  # sees the second relay: its share halves
        assert a.leases.excess
        await a.run_once()
        kept, taken = a.leases.owned, await b.heartbeat()
    assert kept
    assert taken
    assert taken | kept == lanes
    assert not taken & kept


async def test_a_running_relay_renews_its_leases(database_url: str, kafka_bootstrap: str) -> None:
    config = relay_config(database_url, kafka_bootstrap, lease_ttl=0.6)
    query = "SELECT max(heartbeat_at) FROM outbox_lanes WHERE owner = %s"
    async with RunningRelay(config):

        async def held() -> bool:
            return await scalar(database_url, query, config.relay_id) is not None

        await eventually(held, within=10, every=0.05)
        first = await scalar(database_url, query, config.relay_id)

        async def renewed() -> bool:
            return bool(await scalar(database_url, query, config.relay_id) > first)

        await eventually(renewed, within=10, every=0.05)


async def test_a_failed_lease_renewal_is_retried(
    database_url: str, kafka_bootstrap: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The relays table away for a moment: the renewal fails, and the next one, soon
    after, renews the leases."""
    config = relay_config(database_url, kafka_bootstrap, lease_ttl=0.6)
    query = "SELECT max(heartbeat_at) FROM outbox_lanes WHERE owner = %s"
    caplog.set_level(logging.WARNING, logger="outbox_relay.relay")

    async def failed() -> bool:
        return any("lease heartbeat failed" in r.getMessage() for r in caplog.records)

    async def held() -> bool:
        return await scalar(database_url, query, config.relay_id) is not None

    async with RunningRelay(config):
        await eventually(held, within=10, every=0.05)
        await _execute(database_url, "ALTER TABLE outbox_relays RENAME TO outbox_relays_away")
        await eventually(failed, within=10, every=0.02)
        await _execute(database_url, "ALTER TABLE outbox_relays_away RENAME TO outbox_relays")
        back = await scalar(database_url, "SELECT now()")

        async def renewed() -> bool:
            return bool(await scalar(database_url, query, config.relay_id) > back)

        await eventually(renewed, within=10, every=0.05)
