"""The producer's helper against a running bus intake and relay: every request it
writes is answered on the replies topic, a resent event with the same call."""

from __future__ import annotations

import asyncio
import gc
import uuid
import warnings

import orjson
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaConnectionError, KafkaError

from devtools.embedded import Tansu, free_port
from dispatcher.capabilities import CapabilityRegistry
from dispatcher.client.bus import BusSubmitter, replies_topic
from dispatcher.schemas import SubmitRequest
from tests.fixtures.bus import BusWorld, bus_intake, rows, topic_exists
from tests.fixtures.relay import RunningRelay, relay_config
from tests.fixtures.waiting import eventually

pytestmark = [pytest.mark.postgres, pytest.mark.kafka]


async def test_a_submitter_gets_one_reply_per_request(
    kafka_bootstrap: str, database_url: str, registry: CapabilityRegistry
) -> None:
    world = BusWorld(kafka_bootstrap, database_url, ["acme"])
    topic = world.topic("acme")
    replies = f"td-{world.run}.replies.acme"
    email = SubmitRequest(run_id="run-1", capability_id="send-email", input={"to": "a@x.io"})
    unknown = SubmitRequest(run_id="run-1", capability_id="no-such-tool", input={})
    async with (
        bus_intake(world.settings(), registry),
        RunningRelay(relay_config(database_url, kafka_bootstrap)),
    ):
        await eventually(lambda: topic_exists(kafka_bootstrap, replies), what="replies topic")
        async with BusSubmitter(kafka_bootstrap, topic, source="/billing") as bus:
            first = await bus.submit(email, event_id="evt-1")
            await bus.submit(email, event_id="evt-1")  # a retry of the same event
            other = await bus.submit(email)
            refused = await bus.submit(unknown)
            accepted = await bus.reply(first, within=60)
            assert (await bus.reply(other, within=60)).outcome == "accepted"
            no = await bus.reply(refused, within=60)
    assert accepted.outcome == "accepted" and accepted.call is not None
    assert accepted.created is True  # the first of the two records made the call
    assert accepted.call["toolCallId"] == accepted.tool_call_id
    other_id = (await bus.reply(other, within=0)).tool_call_id
    assert other_id != accepted.tool_call_id
    assert no.outcome == "refused" and no.problem is not None
    assert no.problem["code"] == "capability_not_found"
    calls = await rows(database_url, "SELECT tool_call_id FROM tool_calls")
    assert sorted(c for (c,) in calls) == sorted([accepted.tool_call_id, other_id])


async def test_a_submitter_refuses_to_start_without_its_replies_topic(
    kafka_bootstrap: str,
) -> None:
    with pytest.raises(LookupError, match="replies"):
        async with BusSubmitter(kafka_bootstrap, "td-none.requests.acme", source="/t"):
            pass


def unclosed_clients() -> list[str]:
    """What the garbage collector warns of as it frees aiokafka clients nobody closed."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gc.collect()
    return [str(w.message) for w in caught if "Unclosed AIOKafka" in str(w.message)]


async def test_a_submitter_that_cannot_start_closes_what_it_opened(kafka_bootstrap: str) -> None:
    unclosed_clients()  # whatever earlier tests left is not this test's
    # No broker at all (the producer fails to connect; with a reader of replies or
    # without), or a broker without the replies topic (the producer and the consumer
    # are up when the start fails).
    nobody, topic = f"127.0.0.1:{free_port()}", "td-none.requests.acme"
    starts: list[tuple[BusSubmitter, type[Exception]]] = [
        (BusSubmitter(nobody, topic, source="/t"), KafkaConnectionError),
        (BusSubmitter(nobody, topic, source="/t", replies=False), KafkaConnectionError),
        (BusSubmitter(kafka_bootstrap, topic, source="/t"), LookupError),
    ]
    for submitter, error in starts:
        with pytest.raises(error):
            await submitter.start()
    del submitter, starts

    assert unclosed_clients() == []


async def _request_topic_with_replies(bootstrap: str) -> str:
    """A request topic of its own whose replies topic exists (no bus intake needed)."""
    topic = f"td-{uuid.uuid4().hex[:8]}.requests.acme"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(replies_topic(topic), 1, 1)])
    finally:
        await admin.close()
    return topic


async def test_a_record_that_holds_no_reply_does_not_stop_the_replies_after_it(
    kafka_bootstrap: str,
) -> None:
    topic = await _request_topic_with_replies(kafka_bootstrap)
    reply = {"requestId": "evt-1", "outcome": "refused", "problem": {"code": "x"}}
    async with BusSubmitter(kafka_bootstrap, topic, source="/t") as bus:
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
        await producer.start()
        try:
            for junk in (b"not json", b"[1, 2]", b'{"outcome": "accepted"}'):
                await producer.send_and_wait(replies_topic(topic), junk)
            await producer.send_and_wait(replies_topic(topic), orjson.dumps(reply))
        finally:
            await producer.stop()
        answer = await bus.reply("evt-1", within=30)
    assert (answer.outcome, answer.problem) == ("refused", {"code": "x"})


async def test_a_submitter_whose_reader_failed_still_closes_both_clients(
    kafka_bootstrap: str,
) -> None:
    unclosed_clients()  # whatever earlier tests left is not this test's
    topic = await _request_topic_with_replies(kafka_bootstrap)
    bus = BusSubmitter(kafka_bootstrap, topic, source="/t")
    await bus.start()

    # The reader of replies as a broker refusing its fetches leaves it: ended by an error.
    async def refused() -> None:
        raise KafkaError("fetch refused")

    assert bus._reader is not None
    bus._reader.cancel()
    bus._reader = asyncio.create_task(refused())
    await asyncio.wait([bus._reader])
    await bus.stop()
    del bus
    assert unclosed_clients() == []


def clients_tasks() -> list[asyncio.Task[object]]:
    """The aiokafka tasks still running: what a client left behind when not closed."""
    here = asyncio.current_task()
    return [
        t
        for t in asyncio.all_tasks()
        if t is not here and "aiokafka" in (getattr(t.get_coro(), "__qualname__", "") + repr(t))
    ]


async def test_a_submitter_stopped_during_an_outage_closes_and_raises_nothing(
    own_broker: Tansu,
) -> None:
    """aiokafka's consumer lets a cancellation of its own fetch out of ``stop()`` when
    the stop lands in a failed fetch's retry backoff; the submitter finishes the close
    and its caller, which nobody cancelled, is not told it was."""
    topic = await _request_topic_with_replies(own_broker.bootstrap)
    # A long backoff, so that the stop lands in it (in an outage, it lands there by chance).
    bus = BusSubmitter(own_broker.bootstrap, topic, source="/t", retry_backoff_ms=120_000)
    await bus.start()
    assert clients_tasks()  # the reader's fetches, the metadata sync
    own_broker.stop(kill=True)
    await asyncio.sleep(2)  # the fetch in flight fails, and waits out its backoff

    async with asyncio.timeout(60):
        await bus.stop()
    assert clients_tasks() == []
