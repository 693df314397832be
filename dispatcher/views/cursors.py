"""Where a keyset page ends, and the opaque ``after`` token that names it on the wire.

A list read a page at a time by OFFSET reads every row before the page and throws it
away (page 200 of the approvals read 10,000 rows to show 50), and its rows shift when
one before them goes away. A keyset page starts *after* the sort key of the last row of
the page before, read as a range of an index in the list's order: it costs its own rows
wherever it is, and a row decided or resolved meanwhile moves no other row.

The sort keys are an instant and an id (the tie-break), and for a list made of segments
(the escalation queue: open, then acknowledged, then resolved) the segment. The API, the
console and the CLI carry them as one opaque token (``next`` of one page, ``after`` of the
next): base64url of a small JSON array, whose shape is this module's business only.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime

from dispatcher.errors import ValidationFailed
from dispatcher.schemas import ID_MAX_LENGTH, check_identifier

CURSOR_MAX_LENGTH = 640
"""Longer than any token :meth:`Position.token` makes (an id of ``ID_MAX_LENGTH``
characters, each escaped in JSON at worst, an instant and a segment, in base64)."""
CURSOR_PATTERN = r"^[A-Za-z0-9_-]+$"
_TOKEN = re.compile(CURSOR_PATTERN)
_REFUSED = "after must be the `next` of a page of this list"


@dataclass(frozen=True, slots=True)
class Position:
    """The sort key of a page's last row: the next page is the rows after it."""

    at: datetime
    id: str
    segment: str = ""
    """The segment of a list made of several (an escalation's status); empty otherwise."""

    def token(self) -> str:
        """The opaque form, URL-safe and without padding."""
        raw = json.dumps([self.segment, self.at.isoformat(), self.id], separators=(",", ":"))
        return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")

    @classmethod
    def parse(cls, token: str, *, segments: Collection[str] = ("",)) -> Position:
        """The position ``token`` names, if it is one :meth:`token` made for a list of
        ``segments``; else :class:`ValidationFailed` on ``after`` (a 400)."""
        if len(token) > CURSOR_MAX_LENGTH or not _TOKEN.match(token):
            raise ValidationFailed(_REFUSED, field="after")
        try:
            raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
            segment, at, name = json.loads(raw)
            when = datetime.fromisoformat(at)
            check_identifier(name, ID_MAX_LENGTH)
        except (binascii.Error, ValueError, TypeError) as exc:
            # A bad JSON document, array shape, instant or id alike (pydantic's error is a
            # ValueError): a token this module never made.
            raise ValidationFailed(_REFUSED, field="after") from exc
        if segment not in segments or when.tzinfo is None:
            raise ValidationFailed(_REFUSED, field="after")
        return cls(when, name, segment)
