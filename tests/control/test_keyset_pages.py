"""The approval inbox and the escalation queue, walked a page at a time by their cursors,
are the whole list in its order, every row once: across the queue's segments (open,
acknowledged, resolved), through rows that tie on their instant (one transaction's
now()), with and without a status; through the library, the HTTP API (``after``,
``next``) and the CLI (``--after``, ``next:``). A cursor the list never made is a 400."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import httpx
import pytest
from sqlalchemy import insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.db.tables import approvals, escalations
from dispatcher.errors import ValidationFailed
from dispatcher.states import ApprovalStatus, EscalationStatus
from dispatcher.views import queues
from dispatcher.views.cursors import Position
from tests.fixtures.api import BOB, GLOBEX, OPERATOR, bearer
from tests.fixtures.cli import run_cli

pytestmark = pytest.mark.postgres

Sessions = async_sessionmaker[AsyncSession]
T = TypeVar("T")
T0 = datetime(2026, 1, 1, tzinfo=UTC)

# (id, status, minutes after T0): ids out of time order, and ties on the minute.
QUEUE = [
    ("esc-k", "resolved", 0), ("esc-a", "open", 5), ("esc-c", "acknowledged", 1),
    ("esc-b", "open", 5), ("esc-j", "resolved", 0), ("esc-d", "open", 2),
    ("esc-e", "acknowledged", 1), ("esc-f", "resolved", 3), ("esc-g", "open", 9),
]  # fmt: skip
RANK = {"open": 0, "acknowledged": 1, "resolved": 2}
INBOX = [
    ("apr-3", "pending", 5), ("apr-1", "approved", 5), ("apr-9", "pending", 1),
    ("apr-2", "rejected", 7), ("apr-5", "pending", 5), ("apr-4", "expired", 0),
]  # fmt: skip


async def fill(sessions: Sessions, tenant: str = "acme") -> None:
    async with sessions() as session, session.begin():
        await session.execute(
            insert(escalations),
            [
                {
                    "escalation_id": f"{tenant}-{eid}" if tenant != "acme" else eid,
                    "tool_call_id": f"tc-{eid}",
                    "tenant": tenant,
                    "episode": 1,
                    "status": status,
                    "reason": "r",
                    "evidence": {},
                    "created_at": T0 + timedelta(minutes=minutes),
                }
                for eid, status, minutes in QUEUE
            ],
        )
        await session.execute(
            insert(approvals),
            [
                {
                    "approval_id": f"{tenant}-{aid}" if tenant != "acme" else aid,
                    "tool_call_id": f"tc-{aid}",
                    "tenant": tenant,
                    "run_id": "run-1",
                    "capability_id": "refund",
                    "risk": "high",
                    "input_hash": "h",
                    "policy_version": 1,
                    "status": status,
                    "expires_at": T0 + timedelta(minutes=minutes),
                    "closed_at": None if status == "pending" else T0,
                    "decision": {"approved": "approve", "rejected": "reject"}.get(status),
                }
                for aid, status, minutes in INBOX
            ],
        )


def queue_order(statuses: Sequence[str] = tuple(RANK)) -> list[str]:
    rows = [r for r in QUEUE if r[1] in statuses]
    return [r[0] for r in sorted(rows, key=lambda r: (RANK[r[1]], r[2], r[0]))]


def inbox_order(statuses: Sequence[str] | None = None) -> list[str]:
    rows = [r for r in INBOX if statuses is None or r[1] in statuses]
    return [r[0] for r in sorted(rows, key=lambda r: (r[2], r[0]))]


async def walk(
    page: Callable[[Position | None], Awaitable[list[T]]], position: Callable[[T], Position]
) -> list[list[T]]:
    """Every page, each read after the last row of the one before, until one is short."""
    pages: list[list[T]] = []
    after = None
    while True:
        found = await page(after)
        pages.append(found)
        if len(found) < 2:
            return pages
        after = position(found[-1])


@pytest.mark.parametrize(
    "statuses",
    [None, (EscalationStatus.OPEN, EscalationStatus.ACKNOWLEDGED), (EscalationStatus.RESOLVED,)],
    ids=["all", "unresolved", "resolved"],
)
async def test_the_queue_walked_by_its_cursor_is_the_queue_in_order(
    sessions: Sessions, statuses: tuple[EscalationStatus, ...] | None
) -> None:
    await fill(sessions)
    await fill(sessions, "globex")

    async def page(after: Position | None) -> list[Any]:
        async with sessions() as session:
            return await queues.list_escalations(
                session, tenant="acme", status=statuses, limit=2, after=after
            )

    pages = await walk(page, queues.escalation_position)
    listed = [e.escalation_id for p in pages for e in p]
    assert listed == queue_order([s.value for s in statuses] if statuses else tuple(RANK))
    assert all(len(p) == 2 for p in pages[:-1])


async def test_every_tenants_queue_walked_by_its_cursor_has_every_row_once(
    sessions: Sessions,
) -> None:
    await fill(sessions)
    await fill(sessions, "globex")

    async def page(after: Position | None) -> list[Any]:
        async with sessions() as session:
            return await queues.list_escalations(session, limit=2, after=after)

    listed = [e for p in await walk(page, queues.escalation_position) for e in p]
    assert len({e.escalation_id for e in listed}) == len(listed) == 2 * len(QUEUE)
    keys = [(RANK[e.status.value], e.created_at, e.escalation_id) for e in listed]
    assert keys == sorted(keys)


@pytest.mark.parametrize("status", [None, ApprovalStatus.PENDING], ids=["all", "pending"])
async def test_the_inbox_walked_by_its_cursor_is_the_inbox_in_order(
    sessions: Sessions, status: ApprovalStatus | None
) -> None:
    await fill(sessions)
    await fill(sessions, "globex")

    async def page(after: Position | None) -> list[Any]:
        async with sessions() as session:
            return await queues.list_approvals(
                session, tenant="acme", status=status, limit=2, after=after
            )

    listed = [a.approval_id for p in await walk(page, queues.approval_position) for a in p]
    assert listed == inbox_order(None if status is None else [status.value])


async def test_a_row_that_moves_on_between_pages_moves_no_other(sessions: Sessions) -> None:
    """Resolving an escalation of the first page leaves the second page as it was: the
    cursor names where the first page ended, not how many rows came before it."""
    await fill(sessions)
    async with sessions() as session:
        first = await queues.list_escalations(session, tenant="acme", limit=3)
    async with sessions() as session, session.begin():
        await session.execute(
            escalations.update()
            .where(escalations.c.escalation_id == first[0].escalation_id)
            .values(status="resolved")
        )
    async with sessions() as session:
        second = await queues.list_escalations(
            session, tenant="acme", limit=3, after=queues.escalation_position(first[-1])
        )
    assert [e.escalation_id for e in first + second] == queue_order()[:6]


@pytest.mark.parametrize(
    "token",
    [
        "", "x", "%%", "a" * 700, "bm90IGpzb24", "WzEsMiwzXQ", "WyIiLCJub3cgb3IgbmV2ZXIiLCJ4Il0",
        Position(T0.replace(tzinfo=None), "esc-a", "open").token(),
        Position(T0, "esc-a", "closed").token(),
        Position(T0, "esc/a", "open").token(),
    ],
)  # fmt: skip
def test_a_cursor_the_queue_never_made_is_refused(token: str) -> None:
    with pytest.raises(ValidationFailed) as refused:
        queues.parse_escalation_after(token)
    assert refused.value.extra == {"field": "after"}


def test_a_cursor_of_one_list_is_refused_by_the_other() -> None:
    inbox = Position(T0, "apr-1").token()
    queue = Position(T0, "esc-a", "open").token()
    assert queues.parse_approval_after(inbox) == Position(T0, "apr-1")
    assert queues.parse_escalation_after(queue) == Position(T0, "esc-a", "open")
    with pytest.raises(ValidationFailed):
        queues.parse_escalation_after(inbox)
    with pytest.raises(ValidationFailed):
        queues.parse_approval_after(queue)


async def follow(api: httpx.AsyncClient, path: str, key: str, field: str) -> list[str]:
    """Every id of a list over HTTP, two a page, following ``next``."""
    listed: list[str] = []
    params: dict[str, Any] = {"limit": 2}
    while True:
        answer = await api.get(path, params=params, headers=bearer(key))
        assert answer.status_code == 200, answer.text
        body = answer.json()
        listed += [item[f"{field}Id"] for item in body[f"{field}s"]]
        if body["next"] is None:
            return listed
        params["after"] = body["next"]


async def test_the_api_lists_a_page_at_a_time_after_its_next(
    sessions: Sessions, api: httpx.AsyncClient
) -> None:
    await fill(sessions)
    await fill(sessions, "globex")
    assert await follow(api, "/v1/escalations", OPERATOR, "escalation") == queue_order()
    assert await follow(api, "/v1/approvals", BOB, "approval") == inbox_order()
    theirs = await follow(api, "/v1/escalations", GLOBEX, "escalation")
    assert theirs == [f"globex-{e}" for e in queue_order()]
    last = await api.get("/v1/approvals", params={"limit": 100}, headers=bearer(BOB))
    assert last.json()["next"] is None


@pytest.mark.parametrize("path", ["/v1/escalations", "/v1/approvals"])
async def test_an_after_the_list_never_made_is_a_400(
    sessions: Sessions, api: httpx.AsyncClient, path: str
) -> None:
    for bad in ("x", "WzEsMiwzXQ", "a/b", Position(T0, "x", "elsewhere").token()):
        answer = await api.get(path, params={"after": bad}, headers=bearer(OPERATOR))
        assert answer.status_code == 400, (bad, answer.text)
        assert answer.json()["code"] == "validation_failed"


async def test_the_cli_lists_a_page_and_prints_the_cursor_of_the_next(
    sessions: Sessions, database_url: str
) -> None:
    await fill(sessions)
    env = {"TOOL_DISPATCHER_DATABASE_URL": database_url}
    listed: list[str] = []
    after: list[str] = []
    while True:
        page = run_cli("escalations", "list", "--tenant", "acme", "--limit", "4", *after, **env)
        assert page.returncode == 0, page.stderr
        lines = page.stdout.splitlines()
        cursor = lines.pop() if lines and lines[-1].startswith("next: ") else None
        listed += [line.split()[0] for line in lines]
        if cursor is None:
            break
        after = ["--after", cursor.removeprefix("next: ")]
    assert listed == queue_order()
    as_json = run_cli("escalations", "list", "--limit", "4", "--json", **env)
    assert len(as_json.stdout.splitlines()) == 4
    assert as_json.stderr.startswith("next: ")
    bad = run_cli("escalations", "list", "--after", "nope", **env)
    assert (bad.returncode, len(bad.stderr.splitlines())) == (2, 1)
