"""Long lists a page at a time, with the page and filters in the URL, so a link pasted
into an incident channel opens the same view.

Two kinds of page: numbered (``?page=N``, an OFFSET) and keyset (``?after=<id>``, the
last id of the page before), whose cost does not grow with how far in it is and whose
rows do not shift when rows before them go away (a dead letter retried meanwhile)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar
from urllib.parse import urlencode

from dispatcher.errors import ValidationFailed

T = TypeVar("T")
PAGE_SIZE = 50
_MAX_PAGE = 10_000
_MAX_CURSOR = 2**63 - 1  # ids are bigints
# Parameters that belong to one page or one answer, never carried to another page.
_NOT_CARRIED = ("page", "after", "done")


def page_number(query: Mapping[str, str]) -> int:
    raw = query.get("page", "1")
    # ASCII digits, and few: str.isdigit() admits "²", which int() refuses (a 500).
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 5) or not 1 <= int(raw) <= _MAX_PAGE:
        raise ValidationFailed(f"page must be a whole number from 1 to {_MAX_PAGE}", field="page")
    return int(raw)


def cursor(query: Mapping[str, str]) -> int:
    """The ``after`` of a keyset page: the last id of the page before (0: the first)."""
    raw = query.get("after", "0")
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 19) or int(raw) > _MAX_CURSOR:
        raise ValidationFailed("after must be the id a next link names", field="after")
    return int(raw)


def _link(path: str, query: Mapping[str, str], **page: str) -> str:
    params = {k: v for k, v in query.items() if k not in _NOT_CARRIED and v}
    params.update(page)
    return path + (f"?{urlencode(params)}" if params else "")


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    items: Sequence[T]
    previous: str | None
    next: str | None

    @classmethod
    def of(
        cls, fetched: Sequence[T], *, path: str, query: Mapping[str, str], number: int
    ) -> Page[T]:
        """``fetched`` holds up to one item more than a page: its presence means a next
        page exists, without a count over the whole table."""

        def url(n: int) -> str:
            return _link(path, query, page=str(n)) if n > 1 else _link(path, query)

        more = len(fetched) > PAGE_SIZE
        return cls(
            items=fetched[:PAGE_SIZE],
            previous=url(number - 1) if number > 1 else None,
            next=url(number + 1) if more else None,
        )

    @classmethod
    def keyset(
        cls,
        fetched: Sequence[T],
        *,
        path: str,
        query: Mapping[str, str],
        after: int,
        key: Callable[[T], int],
    ) -> Page[T]:
        """A keyset page: ``fetched`` as in :meth:`of`, read after ``after``; the next
        page starts after the ``key`` of this page's last item. Going back one page
        would take reading the list backwards: ``previous`` leads to the first page."""
        items = fetched[:PAGE_SIZE]
        more = len(fetched) > PAGE_SIZE
        return cls(
            items=items,
            previous=_link(path, query) if after else None,
            next=_link(path, query, after=str(key(items[-1]))) if more else None,
        )


def offset_of(number: int) -> int:
    return (number - 1) * PAGE_SIZE
