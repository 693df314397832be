"""Ordering keys built in SQL (by the statements that publish the events they insert)
are the very keys :func:`dispatcher.tenancy.ordering_key` builds in Python, and every
message a call's life writes is keyed by its tenant."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.capabilities import CapabilityRegistry
from dispatcher.db.tables import outbox
from dispatcher.tenancy import ordering_key, ordering_key_sql
from tests.fixtures.calls import submit_call

pytestmark = pytest.mark.postgres

Sessions = async_sessionmaker[AsyncSession]
_KEY = text(f"SELECT {ordering_key_sql('CAST(:t AS text)', 'CAST(:n AS text)')}")


@settings(max_examples=200, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    tenant=st.text(min_size=1, max_size=30).filter(lambda t: "\x00" not in t),
    name=st.text(
        alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E, exclude_characters="/"),
        min_size=1,
        max_size=30,
    ),
)
async def test_sql_builds_the_ordering_key_python_builds(
    sessions: Sessions, tenant: str, name: str
) -> None:
    async with sessions() as session:
        built = await session.scalar(_KEY, {"t": tenant, "n": name})
    assert built == ordering_key(tenant, name)


async def test_every_message_of_a_submission_is_keyed_by_its_tenant(
    sessions: Sessions, registry: CapabilityRegistry
) -> None:
    call = await submit_call(
        sessions, registry, "send-email", {"to": "a@example.com"}, run_id="run-1"
    )
    async with sessions() as session:
        keys = (await session.execute(select(outbox.c.topic, outbox.c.key))).all()
    by_topic = {topic: {key for t, key in keys if t == topic} for topic, _ in keys}
    assert by_topic == {
        "tool-dispatcher.events": {"acme/run-1"},
        "tool-dispatcher.commands": {f"acme/{call}"},
    }
