"""How the console writes times, ages, links and pages (pure logic)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from dispatcher.console import formats, paging
from dispatcher.errors import ValidationFailed

NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)


def test_times_are_written_in_utc_whatever_their_zone() -> None:
    east = datetime(2026, 12, 1, 14, 30, 5, tzinfo=timezone(timedelta(hours=2)))
    assert formats.utc(east) == "2026-12-01 12:30:05 UTC"
    assert formats.iso(east) == "2026-12-01T12:30:05+00:00"
    assert formats.utc(None) == "—" and formats.iso(None) == ""


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (40, "40s"), (62, "1m 2s"), (3600, "1h"), (3 * 86400 + 4 * 3600 + 5, "3d 4h")],
)
def test_a_span_shows_its_two_largest_units(seconds: int, text: str) -> None:
    assert formats.span(seconds) == text


def test_an_age_says_ago_for_the_past_and_in_for_the_future() -> None:
    assert formats.age(NOW - timedelta(seconds=90), NOW) == "1m 30s ago"
    assert formats.age(NOW + timedelta(minutes=5), NOW) == "in 5m"
    assert formats.age(None, NOW) == ""


def test_links_encode_every_id_segment() -> None:
    assert formats.link("calls", "a?b#c%d") == "/console/calls/a%3Fb%23c%25d"


def test_keyset_pages_lead_after_the_last_item_and_back_to_the_first() -> None:
    items = [10 * n for n in range(1, paging.PAGE_SIZE + 2)]
    query = {"topic": "t", "after": "5", "done": "retried"}
    page = paging.Page.keyset(items, path="/console/outbox", query=query, after=5, key=int)
    assert list(page.items) == items[: paging.PAGE_SIZE]
    assert page.next == f"/console/outbox?topic=t&after={10 * paging.PAGE_SIZE}"
    assert page.previous == "/console/outbox?topic=t"
    first = paging.Page.keyset(items[:3], path="/console/outbox", query={}, after=0, key=int)
    assert first.next is None and first.previous is None


@pytest.mark.parametrize("raw", ["-1", "x", "²", "1e3", "9" * 20, str(2**63)])
def test_a_cursor_that_is_no_id_is_refused(raw: str) -> None:
    with pytest.raises(ValidationFailed):
        paging.cursor({"after": raw})
    assert paging.cursor({}) == 0 and paging.cursor({"after": str(2**63 - 1)}) == 2**63 - 1
