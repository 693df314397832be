"""A tenant's dead letters through the real HTTP API (uvicorn on loopback): the list
shows the caller's tenant's only and walks them by cursor, each row exactly once;
retry and discard act on the tenant's own and leave another tenant's untouched; and a
dead letter the real relay leaves is listed and, once discarded, releases its key."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from sqlalchemy import func, insert, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

import outbox_relay
from devtools.databases import unique_name
from dispatcher.db.tables import outbox
from tests.fixtures.api import GLOBEX, OPERATOR, READER, bearer
from tests.fixtures.relay import TopicReader, relay_config

pytestmark = pytest.mark.postgres

Sessions = async_sessionmaker[AsyncSession]
LIST = "/v1/outbox/dead-letters"
EVENTS = "tool-dispatcher.events"


async def outbox_row(
    sessions: Sessions,
    tenant: str,
    key: str,
    *,
    topic: str = EVENTS,
    dead: bool = False,
    **values: Any,
) -> int:
    """One outbox row naming ``tenant`` in its payload, as the ledger writes them;
    ``dead``: as the relay leaves a row the broker refused for good."""
    row = outbox_relay.OutboxMessage(
        topic=topic, key=key, type="t", source="test", payload={"tenant": tenant}
    ).row()
    if dead:
        row.update(attempts=3, last_error="message too large", dead_lettered_at=func.now())
    async with sessions() as session, session.begin():
        found = await session.scalar(
            insert(outbox).values({**row, **values}).returning(outbox.c.id)
        )
    assert found is not None
    return int(found)


async def row_state(sessions: Sessions, row_id: int) -> Any:
    async with sessions() as session:
        found = await session.execute(
            select(outbox.c.dead_lettered_at, outbox.c.attempts, outbox.c.last_error).where(
                outbox.c.id == row_id
            )
        )
        return found.one_or_none()


async def walk(api: httpx.AsyncClient, api_key: str, **params: Any) -> list[list[int]]:
    """Every page of the list, following ``next`` until it is null: the ids of each."""
    pages: list[list[int]] = []
    after: int | None = None
    while True:
        query = {**params, **({"after": after} if after is not None else {})}
        answer = await api.get(LIST, params=query, headers=bearer(api_key))
        assert answer.status_code == 200, answer.text
        body = answer.json()
        pages.append([d["id"] for d in body["deadLetters"]])
        after = body["next"]
        if after is None:
            return pages
        assert after == pages[-1][-1]
        assert len(pages) < 50, "the cursor does not move on"


async def test_the_list_shows_the_callers_dead_letters_only_with_what_waits_behind(
    sessions: Sessions, api: httpx.AsyncClient
) -> None:
    mine = await outbox_row(sessions, "acme", "acme/run-1", dead=True)
    for _ in range(2):
        await outbox_row(sessions, "acme", "acme/run-1")
    # A published row of the key waits for nothing; another tenant's row is not acme's.
    await outbox_row(sessions, "acme", "acme/run-1", published_at=func.now())
    await outbox_row(sessions, "globex", "acme/run-1")
    await outbox_row(sessions, "acme", "acme/run-2")
    theirs = await outbox_row(sessions, "globex", "globex/run-9", dead=True)
    second = await outbox_row(sessions, "acme", "acme/run-5", dead=True, topic="other")

    answer = await api.get(LIST, headers=bearer(OPERATOR))

    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["next"] is None
    first, last = body["deadLetters"]
    async with sessions() as session:
        message_id = await session.scalar(
            select(outbox.c.headers["ce_id"].astext).where(outbox.c.id == mine)
        )
    assert first | {"deadLetteredAt": None, "createdAt": None} == {
        "id": mine,
        "topic": EVENTS,
        "key": "acme/run-1",
        "messageId": message_id,
        "attempts": 3,
        "lastError": "message too large",
        "deadLetteredAt": None,
        "createdAt": None,
        "blockedRows": 2,
    }
    assert first["deadLetteredAt"] and first["createdAt"]
    assert (last["id"], last["topic"], last["blockedRows"]) == (second, "other", 0)
    other = (await api.get(LIST, headers=bearer(GLOBEX))).json()
    assert [d["id"] for d in other["deadLetters"]] == [theirs]


async def test_the_cursor_walks_every_row_once_in_id_order(
    sessions: Sessions, api: httpx.AsyncClient
) -> None:
    ids: list[int] = []
    for n in range(7):
        ids.append(await outbox_row(sessions, "acme", f"acme/run-{n % 2}", dead=True))
        # Interleaved: another tenant's dead letters and published history.
        await outbox_row(sessions, "globex", f"globex/run-{n}", dead=True)
        await outbox_row(sessions, "acme", f"acme/run-{n}", published_at=func.now())

    pages = await walk(api, OPERATOR, limit=3)

    assert pages == [ids[0:3], ids[3:6], ids[6:7]]
    # A page that ends exactly at the last row says so: no empty page to fetch.
    assert await walk(api, OPERATOR, limit=7) == [ids]
    assert await walk(api, OPERATOR, limit=2, key="acme/run-1") == [
        [ids[1], ids[3]],
        [ids[5]],
    ]
    assert await walk(api, OPERATOR, topic="other") == [[]]
    # A row retried between two pages shifts no other row: the next page is the same.
    first = (await api.get(LIST, params={"limit": 3}, headers=bearer(OPERATOR))).json()
    retried = await api.post(f"{LIST}/{ids[0]}/retry", headers=bearer(OPERATOR))
    assert retried.status_code == 200
    after = {"limit": 3, "after": first["next"]}
    following = (await api.get(LIST, params=after, headers=bearer(OPERATOR))).json()
    assert [d["id"] for d in following["deadLetters"]] == ids[3:6]


async def test_bad_paging_is_refused(api: httpx.AsyncClient) -> None:
    for params in ({"limit": 0}, {"limit": 201}, {"after": -1}, {"after": "x"}, {"key": "a\0"}):
        answer = await api.get(LIST, params=params, headers=bearer(OPERATOR))
        assert answer.status_code == 400, params
        assert answer.json()["code"] == "validation_failed"
        assert answer.json()["field"] == next(iter(params))
    assert (await api.get(LIST, params={"limit": 200}, headers=bearer(OPERATOR))).is_success
    # Listing dead letters is operating the outbox: a read key is refused.
    refused = await api.get(LIST, headers=bearer(READER))
    assert refused.status_code == 403 and refused.json()["scope"] == "operate"


async def test_another_tenant_can_neither_retry_nor_discard(
    sessions: Sessions, api: httpx.AsyncClient
) -> None:
    row_id = await outbox_row(sessions, "acme", "acme/run-1", dead=True)
    waiting = await outbox_row(sessions, "acme", "acme/run-1")
    before = await row_state(sessions, row_id)

    retried = await api.post(f"{LIST}/{row_id}/retry", headers=bearer(GLOBEX))
    discarded = await api.post(
        f"{LIST}/{row_id}/discard", json={"confirm": True}, headers=bearer(GLOBEX)
    )
    # A row that is not a dead letter is not one, for its own tenant either.
    not_dead = await api.post(f"{LIST}/{waiting}/retry", headers=bearer(OPERATOR))

    for answer, named in ((retried, row_id), (discarded, row_id), (not_dead, waiting)):
        assert answer.status_code == 404, answer.text
        assert answer.json()["code"] == "dead_letter_not_found"
        assert answer.json()["rowId"] == named
    assert await row_state(sessions, row_id) == before
    listed = (await api.get(LIST, headers=bearer(OPERATOR))).json()
    assert [d["id"] for d in listed["deadLetters"]] == [row_id]


async def test_a_retry_puts_the_dead_letter_back_in_line(
    sessions: Sessions, api: httpx.AsyncClient
) -> None:
    row_id = await outbox_row(sessions, "acme", "acme/run-1", dead=True)

    answer = await api.post(f"{LIST}/{row_id}/retry", headers=bearer(OPERATOR))

    assert answer.status_code == 200, answer.text
    assert answer.json() == {"id": row_id, "action": "retried"}
    state = await row_state(sessions, row_id)
    assert state.dead_lettered_at is None and state.attempts == 0
    assert (await api.get(LIST, headers=bearer(OPERATOR))).json()["deadLetters"] == []
    again = await api.post(f"{LIST}/{row_id}/retry", headers=bearer(OPERATOR))
    assert again.status_code == 404


async def test_a_discard_needs_its_confirmation_then_deletes_the_row(
    sessions: Sessions, api: httpx.AsyncClient
) -> None:
    row_id = await outbox_row(sessions, "acme", "acme/run-1", dead=True)
    before = await row_state(sessions, row_id)

    for body in (None, {}, {"confirm": False}, {"confirm": "yes"}):
        unconfirmed = await api.post(
            f"{LIST}/{row_id}/discard", json=body, headers=bearer(OPERATOR)
        )
        assert unconfirmed.status_code == 400, body
        assert unconfirmed.json()["field"] == "confirm"
    assert await row_state(sessions, row_id) == before

    answer = await api.post(
        f"{LIST}/{row_id}/discard", json={"confirm": True}, headers=bearer(OPERATOR)
    )

    assert answer.status_code == 200, answer.text
    assert answer.json() == {"id": row_id, "action": "discarded"}
    assert await row_state(sessions, row_id) is None
    again = await api.post(
        f"{LIST}/{row_id}/discard", json={"confirm": True}, headers=bearer(OPERATOR)
    )
    assert again.status_code == 404


@pytest.mark.kafka
async def test_the_relays_dead_letter_is_listed_and_a_discard_releases_its_key(
    sessions: Sessions, api: httpx.AsyncClient, database_url: str, kafka_bootstrap: str
) -> None:
    good = unique_name("dead-api")
    await outbox_row(sessions, "acme", "acme/run-1", topic="not a valid topic!")
    behind = await outbox_row(sessions, "acme", "acme/run-1", topic=good)
    config = relay_config(database_url, kafka_bootstrap)

    assert (await outbox_relay.run_once(config)).dead_lettered == 1

    [dead] = (await api.get(LIST, headers=bearer(OPERATOR))).json()["deadLetters"]
    assert "invalid topic name" in dead["lastError"] and dead["blockedRows"] == 1
    assert (await api.get(LIST, headers=bearer(GLOBEX))).json()["deadLetters"] == []
    discarded = await api.post(
        f"{LIST}/{dead['id']}/discard", json={"confirm": True}, headers=bearer(OPERATOR)
    )
    assert discarded.status_code == 200
    assert (await outbox_relay.run_once(config)).published == 1
    async with TopicReader(kafka_bootstrap, good) as reader:
        [message] = await reader.distinct(1, within=20)
    assert message.key == "acme/run-1"
    async with sessions() as session:
        published = await session.scalar(select(outbox.c.published_at).where(outbox.c.id == behind))
    assert published is not None
