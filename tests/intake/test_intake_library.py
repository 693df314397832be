"""Library intake (``dispatcher.intake.service.submit`` / ``submit_many``) inside the caller's own
PostgreSQL transaction: the call, its events and its dispatch command commit or roll
back with the caller's domain write, and idempotency keys replay or refuse."""

from __future__ import annotations

import asyncio
import uuid
from datetime import datetime
from typing import Any

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from dispatcher.capabilities import CapabilityRegistry
from dispatcher.db.tables import execution_events, outbox, tool_calls
from dispatcher.errors import (
    CapabilityNotFound,
    IdempotencyKeyReused,
    ToolCallIdConflict,
    ValidationFailed,
)
from dispatcher.intake.service import submit, submit_many
from dispatcher.schemas import Submission, SubmitRequest
from dispatcher.settings import DEFAULT_TOPICS
from dispatcher.tenancy import ordering_key

pytestmark = pytest.mark.postgres

Sessions = async_sessionmaker[AsyncSession]


def refund(order_id: str = "o-1", amount: int = 500, **fields: Any) -> SubmitRequest:
    """A refund keyed by its template ``refund:{input.orderId}:{correlationId}``."""
    values: dict[str, Any] = {
        "run_id": "run-1",
        "capability_id": "refund-order-v2",
        "input": {"orderId": order_id, "amountCents": amount},
        "correlation_id": "corr-1",
    }
    return SubmitRequest(**{**values, **fields})


def email(key: str = "email-1", to: str = "ada@example.com", **fields: Any) -> SubmitRequest:
    values: dict[str, Any] = {
        "run_id": "run-1",
        "capability_id": "send-email",
        "input": {"to": to},
        "idempotency_key": key,
    }
    return SubmitRequest(**{**values, **fields})


async def _submit(
    sessions: Sessions, registry: CapabilityRegistry, request: SubmitRequest, tenant: str = "acme"
) -> Submission:
    async with sessions() as session, session.begin():
        return await submit(session, request, tenant=tenant, registry=registry)


async def _rows(engine: AsyncEngine, table: Any, **where: Any) -> list[dict[str, Any]]:
    query = select(table).where(*(table.c[k] == v for k, v in where.items()))
    async with engine.connect() as conn:
        return [dict(r._mapping) for r in await conn.execute(query)]


async def _snapshot(engine: AsyncEngine) -> dict[str, list[dict[str, Any]]]:
    async with engine.connect() as conn:
        return {
            table.name: [dict(r._mapping) for r in await conn.execute(select(table))]
            for table in (tool_calls, execution_events, outbox)
        }


async def _counts(engine: AsyncEngine) -> dict[str, int]:
    """Calls, events, and dispatch commands (outbox rows on the commands topic; the
    outbox may carry other messages too)."""
    queries = {
        "tool_calls": select(func.count()).select_from(tool_calls),
        "execution_events": select(func.count()).select_from(execution_events),
        "commands": select(func.count())
        .select_from(outbox)
        .where(outbox.c.topic == DEFAULT_TOPICS.dispatch),
    }
    async with engine.connect() as conn:
        return {name: (await conn.execute(q)).scalar_one() for name, q in queries.items()}


async def _commands(engine: AsyncEngine) -> list[dict[str, Any]]:
    return await _rows(engine, outbox, topic=DEFAULT_TOPICS.dispatch)


async def _assert_nothing_recorded(engine: AsyncEngine) -> None:
    assert await _snapshot(engine) == {"tool_calls": [], "execution_events": [], "outbox": []}


@pytest.fixture
async def orders(engine: AsyncEngine) -> None:
    """The producer's own domain table, in the same database."""
    async with engine.begin() as conn:
        await conn.execute(
            text("CREATE TABLE orders (order_id text PRIMARY KEY, refunded_cents integer NOT NULL)")
        )


async def _orders(engine: AsyncEngine) -> list[tuple[str, int]]:
    async with engine.connect() as conn:
        return [tuple(r) for r in await conn.execute(text("SELECT * FROM orders"))]


async def test_domain_write_and_submission_commit_together(
    engine: AsyncEngine, sessions: Sessions, registry: CapabilityRegistry, orders: None
) -> None:
    async with sessions() as session, session.begin():
        await session.execute(text("INSERT INTO orders VALUES ('o-1', 500)"))
        submission = await submit(session, refund(), tenant="acme", registry=registry)
        # Nothing is visible to anyone else until the caller commits.
        assert await _orders(engine) == []
        await _assert_nothing_recorded(engine)

    call_id = submission.view.tool_call_id
    assert submission.created is True
    assert submission.view.status == "authorized"
    assert submission.view.idempotency_key == "refund:o-1:corr-1"
    assert await _orders(engine) == [("o-1", 500)]

    [call] = await _rows(engine, tool_calls)
    assert (call["tool_call_id"], call["tenant"], call["status"]) == (call_id, "acme", "authorized")

    requested, authorized = sorted(
        await _rows(engine, execution_events, tool_call_id=call_id), key=lambda e: e["seq"]
    )
    assert requested["event_type"] == "tool.call.requested"
    # The key is the call's (above) and its command's, not repeated in its first event.
    assert requested["payload"] == {"requiresApproval": False, "via": {"library": {}}}
    assert call["idempotency_key"] == "refund:o-1:corr-1"
    assert authorized["event_type"] == "tool.call.authorized"
    assert authorized["causation_id"] == requested["event_id"]
    for event in (requested, authorized):
        assert (event["tenant"], event["run_id"], event["capability_id"]) == (
            "acme",
            "run-1",
            "refund-order-v2",
        )
        assert event["producer"] == "tool-dispatcher.intake"
        assert event["correlation_id"] == "corr-1"

    [command] = await _commands(engine)
    assert command["topic"] == "tool-dispatcher.commands"
    assert command["key"] == ordering_key("acme", call_id)
    assert command["published_at"] is None
    headers = command["headers"]
    assert set(headers) == {"ce_id", "ce_type", "ce_source", "ce_specversion", "ce_time"}
    assert headers["ce_type"] == "tool.call.dispatch"
    assert headers["ce_specversion"] == "1.0"
    assert headers["ce_source"]
    uuid.UUID(headers["ce_id"])
    assert datetime.fromisoformat(headers["ce_time"]).tzinfo is not None
    assert command["payload"] == {
        "toolCallId": call_id,
        "tenant": "acme",
        "runId": "run-1",
        "capabilityId": "refund-order-v2",
        "idempotencyKey": "refund:o-1:corr-1",
        "causationId": authorized["event_id"],
    }


async def test_caller_rollback_discards_domain_write_and_submission(
    engine: AsyncEngine, sessions: Sessions, registry: CapabilityRegistry, orders: None
) -> None:
    class DomainFailure(Exception):
        pass

    with pytest.raises(DomainFailure):
        async with sessions() as session, session.begin():
            await session.execute(text("INSERT INTO orders VALUES ('o-1', 500)"))
            submission = await submit(session, refund(), tenant="acme", registry=registry)
            assert submission.created is True
            raise DomainFailure

    assert await _orders(engine) == []
    await _assert_nothing_recorded(engine)


async def test_replay_returns_the_stored_call_and_writes_nothing(
    engine: AsyncEngine, sessions: Sessions, registry: CapabilityRegistry
) -> None:
    first = await _submit(sessions, registry, refund())
    before = await _snapshot(engine)

    again = await _submit(sessions, registry, refund())

    assert (first.created, again.created) == (True, False)
    assert again.view == first.view
    assert await _snapshot(engine) == before


async def test_same_key_with_different_input_is_refused(
    engine: AsyncEngine, sessions: Sessions, registry: CapabilityRegistry
) -> None:
    first = await _submit(sessions, registry, email(to="ada@example.com"))
    before = await _snapshot(engine)

    with pytest.raises(IdempotencyKeyReused) as info:
        await _submit(sessions, registry, email(to="grace@example.com"))

    assert info.value.extra == {"idempotencyKey": "email-1", "toolCallId": first.view.tool_call_id}
    assert await _snapshot(engine) == before


async def test_keys_are_per_tenant(
    engine: AsyncEngine, sessions: Sessions, registry: CapabilityRegistry
) -> None:
    acme = await _submit(sessions, registry, email(), tenant="acme")
    globex = await _submit(sessions, registry, email(), tenant="globex")

    assert acme.created and globex.created
    assert acme.view.tool_call_id != globex.view.tool_call_id
    assert {(r["tenant"], r["idempotency_key"]) for r in await _rows(engine, tool_calls)} == {
        ("acme", "email-1"),
        ("globex", "email-1"),
    }
    assert await _counts(engine) == {"tool_calls": 2, "execution_events": 4, "commands": 2}


async def test_capability_needing_approval_is_proposed_without_a_command(
    engine: AsyncEngine, sessions: Sessions, registry: CapabilityRegistry
) -> None:
    submission = await _submit(
        sessions,
        registry,
        SubmitRequest(
            run_id="run-1",
            capability_id="refund-order-approved",
            input={"orderId": "o-9", "amountCents": 900_000},
        ),
    )

    assert submission.created is True
    assert submission.view.status == "proposed"
    events = await _rows(engine, execution_events)
    assert [e["event_type"] for e in events] == ["tool.call.requested", "approval.required"]
    assert events[0]["payload"]["requiresApproval"] is True
    required = events[1]["payload"]
    assert required["approvalId"].startswith("apr_") and required["risk"] == "high"
    assert "expiresAt" in required
    assert await _commands(engine) == []


@pytest.mark.parametrize(
    "request_",
    [
        pytest.param(refund(input={"amountCents": 500}), id="missing-input-field"),
        pytest.param(refund(correlation_id=None), id="missing-correlation-id"),
        pytest.param(refund(input={"orderId": {"nested": 1}}), id="non-scalar-field"),
    ],
)
async def test_key_template_needs_every_placeholder(
    engine: AsyncEngine, sessions: Sessions, registry: CapabilityRegistry, request_: SubmitRequest
) -> None:
    with pytest.raises(ValidationFailed):
        await _submit(sessions, registry, request_)
    await _assert_nothing_recorded(engine)


async def test_explicit_idempotency_key_wins_over_the_template(
    sessions: Sessions, registry: CapabilityRegistry
) -> None:
    explicit = await _submit(sessions, registry, refund(idempotency_key="my-own-key"))
    # Without a correlationId the template could not even be rendered.
    no_template = await _submit(
        sessions, registry, refund(order_id="o-2", correlation_id=None, idempotency_key="k-2")
    )

    assert explicit.view.idempotency_key == "my-own-key"
    assert no_template.view.idempotency_key == "k-2"


async def test_a_template_key_percent_encodes_each_value(
    sessions: Sessions, registry: CapabilityRegistry
) -> None:
    # The key goes to the provider in a header, which carries ASCII only.
    first = await _submit(sessions, registry, refund(order_id="ключ 1/2"))
    again = await _submit(sessions, registry, refund(order_id="ключ 1/2"))
    plain = await _submit(sessions, registry, refund(order_id="o-7:x"))

    encoded = "refund:%D0%BA%D0%BB%D1%8E%D1%87%201%2F2:corr-1"
    assert first.view.idempotency_key == encoded
    assert (again.created, again.view.tool_call_id) == (False, first.view.tool_call_id)
    # A value that keeps the identifier contract is substituted as it is.
    assert plain.view.idempotency_key == "refund:o-7:x:corr-1"


async def test_a_template_key_past_255_characters_is_refused_naming_the_key(
    engine: AsyncEngine, sessions: Sessions, registry: CapabilityRegistry
) -> None:
    # 60 characters that encode to 6 each: 360, past the bound once encoded.
    with pytest.raises(ValidationFailed) as info:
        await _submit(sessions, registry, refund(order_id="ключ" * 15))
    assert info.value.extra["field"] == "idempotencyKey"
    await _assert_nothing_recorded(engine)


async def test_capability_without_template_is_keyed_by_its_tool_call_id(
    sessions: Sessions, registry: CapabilityRegistry
) -> None:
    submission = await _submit(sessions, registry, email(key=None))  # type: ignore[arg-type]
    # Qualified by the tenant: another tenant may use the same toolCallId.
    assert submission.view.idempotency_key == f"acme:{submission.view.tool_call_id}"


async def test_reusing_a_tool_call_id_under_another_key_is_refused(
    engine: AsyncEngine, sessions: Sessions, registry: CapabilityRegistry
) -> None:
    await _submit(sessions, registry, email(key="k-1", tool_call_id="call-1"))
    before = await _snapshot(engine)

    with pytest.raises(ToolCallIdConflict) as info:
        await _submit(sessions, registry, email(key="k-2", tool_call_id="call-1"))

    assert info.value.extra == {"toolCallId": "call-1"}
    assert await _snapshot(engine) == before


async def test_reusing_a_key_with_another_tool_call_id_is_refused(
    engine: AsyncEngine, sessions: Sessions, registry: CapabilityRegistry
) -> None:
    await _submit(sessions, registry, email(key="k-1", tool_call_id="call-1"))
    before = await _snapshot(engine)

    with pytest.raises(IdempotencyKeyReused):
        await _submit(sessions, registry, email(key="k-1", tool_call_id="call-2"))
    assert await _snapshot(engine) == before


async def test_submit_many_gives_each_item_its_own_outcome(
    engine: AsyncEngine, sessions: Sessions, registry: CapabilityRegistry
) -> None:
    await _submit(sessions, registry, email(key="taken", to="ada@example.com"))
    items = [
        (email(key="new-1"), "acme"),
        (email(key="new-1"), "acme"),  # duplicate inside the batch
        (email(key="taken", to="grace@example.com"), "acme"),  # reused key
        (SubmitRequest(run_id="run-1", capability_id="no-such-tool", input={}), "acme"),
        (email(key="new-2"), "acme"),
    ]

    async with sessions() as session, session.begin():
        outcomes = await submit_many(session, items, registry=registry)

    assert len(outcomes) == len(items)
    new_1, duplicate, reused, unknown, new_2 = outcomes
    assert isinstance(new_1, Submission) and new_1.created
    assert isinstance(duplicate, Submission) and not duplicate.created
    assert duplicate.view.tool_call_id == new_1.view.tool_call_id
    assert isinstance(reused, IdempotencyKeyReused)
    assert isinstance(unknown, CapabilityNotFound)
    assert isinstance(new_2, Submission) and new_2.created
    assert {r["idempotency_key"] for r in await _rows(engine, tool_calls)} == {
        "taken",
        "new-1",
        "new-2",
    }
    assert await _counts(engine) == {"tool_calls": 3, "execution_events": 6, "commands": 3}


async def test_submit_many_one_tool_call_id_under_two_keys(
    engine: AsyncEngine, sessions: Sessions, registry: CapabilityRegistry
) -> None:
    # Two items name the same toolCallId with different keys; only one can own it, and
    # an item reported as created must be the one recorded under its own key.
    items = [
        (email(key="zulu", tool_call_id="call-1", to="ada@example.com"), "acme"),
        (email(key="alpha", tool_call_id="call-1", to="grace@example.com"), "acme"),
    ]

    async with sessions() as session, session.begin():
        outcomes = await submit_many(session, items, registry=registry)

    recorded = await _rows(engine, tool_calls)
    assert len(recorded) == 1
    successes = [
        (request, outcome)
        for (request, _), outcome in zip(items, outcomes, strict=True)
        if isinstance(outcome, Submission)
    ]
    assert len(successes) == 1, outcomes
    [(request, outcome)] = successes
    assert outcome.created is True
    assert outcome.view.idempotency_key == request.idempotency_key
    assert outcome.view.input == request.input
    assert recorded[0]["idempotency_key"] == request.idempotency_key
    assert sum(isinstance(o, ToolCallIdConflict) for o in outcomes) == 1


async def test_fifty_concurrent_identical_submissions_record_one_call(
    engine: AsyncEngine, sessions: Sessions, registry: CapabilityRegistry
) -> None:
    outcomes = await asyncio.gather(*(_submit(sessions, registry, refund()) for _ in range(50)))

    assert sum(o.created for o in outcomes) == 1
    assert len({o.view.tool_call_id for o in outcomes}) == 1
    assert await _counts(engine) == {"tool_calls": 1, "execution_events": 2, "commands": 1}


async def test_submit_many_never_answers_one_tenant_with_another_tenants_call(
    sessions: Sessions, registry: CapabilityRegistry
) -> None:
    # The HTTP batcher groups submissions of different tenants into one submit_many.
    items = [
        (email(key="k-globex", tool_call_id="call-1", to="ceo@globex.example"), "globex"),
        (email(key="k-acme", tool_call_id="call-1", to="cfo@acme.example"), "acme"),
    ]

    async with sessions() as session, session.begin():
        outcomes = await submit_many(session, items, registry=registry)

    for (request, _), outcome in zip(items, outcomes, strict=True):
        if isinstance(outcome, Submission):
            assert outcome.view.input == request.input, "answered with another tenant's call"
    # A toolCallId is per tenant: each tenant's call-1 is its own, and both are created.
    assert all(isinstance(o, Submission) and o.created for o in outcomes), outcomes


async def test_an_integer_beyond_64_bits_is_stored_exactly(
    engine: AsyncEngine, sessions: Sessions, registry: CapabilityRegistry
) -> None:
    # jsonb keeps any integer exactly; the parameter encoder (dispatcher.db.jsonb) must
    # too, though orjson refuses one this large.
    big = 2**64 + 1
    created = await _submit(sessions, registry, email(key="big", input={"to": "a@b.c", "n": big}))
    assert created.view.input["n"] == big
    async with engine.connect() as conn:
        stored = await conn.scalar(
            text("SELECT input->>'n' FROM tool_calls WHERE tool_call_id = :id"),
            {"id": created.view.tool_call_id},
        )
    assert stored == str(big)
