"""Long lists a page at a time, with the page and filters in the URL, so a link pasted
into an incident channel opens the same view."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar
from urllib.parse import urlencode

from dispatcher.errors import ValidationFailed

T = TypeVar("T")
PAGE_SIZE = 50
_MAX_PAGE = 10_000


def page_number(query: Mapping[str, str]) -> int:
    raw = query.get("page", "1")
    # ASCII digits, and few: str.isdigit() admits "²", which int() refuses (a 500).
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 5) or not 1 <= int(raw) <= _MAX_PAGE:
        raise ValidationFailed(f"page must be a whole number from 1 to {_MAX_PAGE}", field="page")
    return int(raw)


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
            params = {k: v for k, v in query.items() if k not in ("page", "done") and v}
            if n > 1:
                params["page"] = str(n)
            return path + (f"?{urlencode(params)}" if params else "")

        more = len(fetched) > PAGE_SIZE
        return cls(
            items=fetched[:PAGE_SIZE],
            previous=url(number - 1) if number > 1 else None,
            next=url(number + 1) if more else None,
        )


def offset_of(number: int) -> int:
    return (number - 1) * PAGE_SIZE
