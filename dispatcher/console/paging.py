"""Long lists a page at a time, with the page and filters in the URL, so a link pasted
into an incident channel opens the same view.

Keyset pages (``?after=``: where the page before ended, an id or an opaque cursor of
:mod:`dispatcher.views.cursors`), whose cost does not grow with how far in they are and
whose rows do not shift when rows before them go away (a dead letter retried, an
approval decided meanwhile). No list is paged by OFFSET: the runs are read from their
summaries, in an order an index holds (:mod:`dispatcher.views.run_list`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar
from urllib.parse import urlencode

from dispatcher.errors import ValidationFailed

T = TypeVar("T")
PAGE_SIZE = 50
_MAX_CURSOR = 2**63 - 1  # ids are bigints
# Parameters that belong to one page or one answer, never carried to another page.
_NOT_CARRIED = ("page", "after", "done")


def cursor(query: Mapping[str, str]) -> int:
    """The ``after`` of a keyset page by id: the last id of the page before (0: the
    first)."""
    raw = query.get("after", "0")
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 19) or int(raw) > _MAX_CURSOR:
        raise ValidationFailed("after must be the id a next link names", field="after")
    return int(raw)


def token(query: Mapping[str, str]) -> str:
    """The ``after`` of a keyset page by an opaque cursor, as the URL has it (empty: the
    first page); the list's own parser says whether it names a position."""
    return query.get("after", "")


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
    def keyset(
        cls,
        fetched: Sequence[T],
        *,
        path: str,
        query: Mapping[str, str],
        after: int | str,
        key: Callable[[T], int | str],
    ) -> Page[T]:
        """A keyset page: ``fetched`` (up to one item more than a page: its presence means a
        next page exists, without a count) read after ``after``; the next
        page starts after the ``key`` of this page's last item. Going back one page
        would take reading the list backwards: ``previous`` leads to the first page."""
        items = fetched[:PAGE_SIZE]
        more = len(fetched) > PAGE_SIZE
        return cls(
            items=items,
            previous=_link(path, query) if after else None,
            next=_link(path, query, after=str(key(items[-1]))) if more else None,
        )
