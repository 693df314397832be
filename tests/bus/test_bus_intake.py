"""Bus intake on the real broker and database: records become calls or refusals, each
answered once through the outbox, in partition order, for the topic's own tenant."""

from __future__ import annotations

import pytest

from devtools.registries import capability
from dispatcher.bus.records import derived_key
from dispatcher.capabilities import CapabilityRegistry
from tests.fixtures.bus import (
    BusWorld,
    body,
    bus_intake,
    headers,
    producing,
    read_topic,
    rows,
    wait_recorded,
)
from tests.fixtures.capabilities import with_capability

pytestmark = [pytest.mark.postgres, pytest.mark.kafka]


async def replies(database_url: str, topic: str) -> dict[str, dict[str, object]]:
    found = await rows(
        database_url,
        "SELECT headers, payload FROM outbox WHERE topic = %s ORDER BY id",
        topic,
    )
    return {h["ce_requestid"]: {"type": h["ce_type"], **p} for h, p in found}


async def test_records_become_calls_and_replies(
    kafka_bootstrap: str, database_url: str, registry: CapabilityRegistry
) -> None:
    world = BusWorld(kafka_bootstrap, database_url, ["acme", "globex"])
    settings = world.settings()
    async with bus_intake(settings, registry), producing(kafka_bootstrap) as producer:
        sent = []
        for i in range(20):
            for tenant in world.tenants:
                sent.append(
                    await producer.send_and_wait(
                        world.topic(tenant), body(f"run-{i % 3}"), key=f"run-{i % 3}".encode(),
                        headers=headers(f"{tenant}-{i}"),
                    )
                )  # fmt: skip
        # A resend of one event lands once; a record naming the other tenant is refused.
        sent.append(
            await producer.send_and_wait(
                world.topic("acme"), body("run-0"), key=b"run-0", headers=headers("acme-0")
            )
        )
        sent.append(
            await producer.send_and_wait(
                world.topic("globex"), body("run-9", tenant="acme"), headers=headers("sneaky")
            )
        )
        await wait_recorded(database_url, sent)

    calls = await rows(database_url, "SELECT tenant, count(*) FROM tool_calls GROUP BY tenant")
    assert dict(calls) == {"acme": 20, "globex": 20}
    acme = await replies(database_url, f"td-{world.run}.replies.acme")
    globex = await replies(database_url, f"td-{world.run}.replies.globex")
    assert set(acme) == {f"acme-{i}" for i in range(20)}
    assert set(globex) == {f"globex-{i}" for i in range(20)} | {"sneaky"}
    assert globex["sneaky"]["outcome"] == "refused"
    assert globex["sneaky"]["problem"]["code"] == "tenant_mismatch"  # type: ignore[index]
    assert all(r["outcome"] == "accepted" for k, r in globex.items() if k != "sneaky")
    assert acme["acme-5"]["tenant"] == "acme"
    # The resend got its reply too (the same call, not created again).
    resent = await rows(
        database_url,
        "SELECT count(*), count(DISTINCT payload->>'toolCallId') FROM outbox"
        " WHERE topic = %s AND headers->>'ce_requestid' = 'acme-0'",
        f"td-{world.run}.replies.acme",
    )
    assert resent == [(2, 1)]
    # Keyed by the tenant too: the relay holds a key's rows behind its dead letter, and
    # another tenant's requests may use the same key.
    keys = await rows(
        database_url,
        "SELECT DISTINCT split_part(key, '/', 1) FROM outbox WHERE topic LIKE %s",
        f"td-{world.run}.replies.%",
    )
    assert sorted(k for (k,) in keys) == ["acme", "globex"]


async def test_records_are_recorded_in_partition_order(
    kafka_bootstrap: str, database_url: str, registry: CapabilityRegistry
) -> None:
    world = BusWorld(kafka_bootstrap, database_url, ["acme"])
    async with bus_intake(world.settings(), registry), producing(kafka_bootstrap) as producer:
        sent = [
            await producer.send_and_wait(
                world.topic("acme"), body(f"run-{i % 4}"), key=f"run-{i % 4}".encode(),
                headers=headers(f"e-{i}"),
            )
            for i in range(60)
        ]  # fmt: skip
        await wait_recorded(database_url, sent)
    found = await rows(
        database_url,
        "SELECT (payload->'via'->'bus'->>'partition')::int, (payload->'via'->'bus'->>'offset')::int"
        " FROM execution_events WHERE event_type = 'tool.call.requested' ORDER BY seq",
    )
    assert len(found) == 60
    for partition in {p for p, _ in found}:
        offsets = [o for p, o in found if p == partition]
        assert offsets == sorted(offsets)


async def test_poison_is_dead_lettered_and_the_partition_goes_on(
    kafka_bootstrap: str, database_url: str, registry: CapabilityRegistry
) -> None:
    world = BusWorld(kafka_bootstrap, database_url, ["acme"])
    settings = world.settings(bus={"max_record_bytes": 2048})
    topic = world.topic("acme")
    poison = {
        "bytes": (b"\xff\x00 not json", headers("p-bytes")),
        "headers": (body("run-1"), [("ce_id", b"p-headers")]),
        "large": (body("run-1", input={"pad": "x" * 4096}), headers("p-large")),
    }
    async with bus_intake(settings, registry), producing(kafka_bootstrap) as producer:
        sent = []
        for i in range(12):
            sent.append(
                await producer.send_and_wait(
                    topic, body("run-1"), key=b"k", headers=headers(f"g-{i}")
                )
            )
            if i % 4 == 1:
                value, hdrs = poison[["bytes", "headers", "large"][i // 4]]
                sent.append(await producer.send_and_wait(topic, value, key=b"k", headers=hdrs))
        await wait_recorded(database_url, sent)
    calls = await rows(database_url, "SELECT count(*) FROM tool_calls")
    assert calls == [(12,)]
    answered = await replies(database_url, f"td-{world.run}.replies.acme")
    assert {k for k, r in answered.items() if r["outcome"] == "refused"} == {"p-bytes", "p-large"}
    assert answered["p-large"]["problem"]["code"] == "payload_too_large"  # type: ignore[index]
    dead = await read_topic(kafka_bootstrap, f"td-{world.run}.dead-letters.acme", 3)
    reasons = {dict(r.headers)["dlq_code"].decode(): r for r in dead}
    assert set(reasons) == {"unreadable_record", "payload_too_large"}
    assert len(dead) == 3
    copied = {r.value for r in dead}
    assert {v for v, _ in poison.values()} == copied


async def test_a_record_is_keyed_by_its_key_its_template_or_its_event(
    kafka_bootstrap: str, database_url: str, registry: CapabilityRegistry
) -> None:
    keyed = capability(
        "refund-keyed", "http://127.0.0.1:9", idempotencyKeyTemplate="refund:{input.orderId}"
    )
    world = BusWorld(kafka_bootstrap, database_url, ["acme"])
    topic = world.topic("acme")
    async with (
        bus_intake(world.settings(), with_capability(registry, keyed)),
        producing(kafka_bootstrap) as producer,
    ):
        sent = [
            await producer.send_and_wait(
                topic, body("run-1", idempotencyKey="given-1"), headers=headers("k-given")
            ),
            await producer.send_and_wait(
                topic, body("run-1", capabilityId="refund-keyed", input={"orderId": "o-7"}),
                headers=headers("k-template"),
            ),
            await producer.send_and_wait(
                topic, body("run-1"), headers=headers("k-event", source="/billing")
            ),
        ]  # fmt: skip
        await wait_recorded(database_url, sent)
    found = await rows(database_url, "SELECT idempotency_key FROM tool_calls")
    assert {k for (k,) in found} == {"given-1", "refund:o-7", derived_key("/billing", "k-event")}


async def test_a_tenant_over_its_rate_waits_and_loses_nothing(
    kafka_bootstrap: str, database_url: str, registry: CapabilityRegistry
) -> None:
    world = BusWorld(kafka_bootstrap, database_url, ["acme", "globex"])
    settings = world.settings(submit_rate_per_second=10, submit_burst=5)
    async with bus_intake(settings, registry), producing(kafka_bootstrap) as producer:
        sent = [
            await producer.send_and_wait(
                world.topic("acme"), body("run-a"), key=b"run-a", headers=headers(f"a-{i}")
            )
            for i in range(25)
        ]
        sent += [
            await producer.send_and_wait(
                world.topic("globex"), body("run-g"), key=b"run-g", headers=headers(f"g-{i}")
            )
            for i in range(5)
        ]
        await wait_recorded(database_url, sent)
    answered = await replies(database_url, f"td-{world.run}.replies.acme")
    assert len(answered) == 25
    assert {r["outcome"] for r in answered.values()} == {"accepted"}  # late, not refused
    found = await rows(
        database_url,
        "SELECT tenant, extract(epoch FROM created_at - min(created_at) OVER ())"
        " FROM tool_calls ORDER BY created_at",
    )
    acme = [float(at) for tenant, at in found if tenant == "acme"]
    globex = [float(at) for tenant, at in found if tenant == "globex"]
    assert len(acme) == 25 and len(globex) == 5
    # The bucket's bound (5 at once, then 10 a second) holds; the other tenant's
    # records did not wait for acme's to be admitted.
    assert sum(1 for at in acme if at < 1.0) <= 5 + 10
    assert max(globex) < max(acme)
