"""Enum columns read and written as text (migration 0016)."""

from __future__ import annotations

from sqlalchemy.dialects.postgresql import ENUM
from sqlalchemy.engine import Dialect


class Label(ENUM):
    """A PostgreSQL enum column read and written as its labels' text, unchecked here:
    the database holds the list (its migrations), and a reader meets a label a later
    release added as the text it is, not as an error."""

    cache_ok = True

    def bind_processor(self, dialect: Dialect) -> None:
        return None

    def result_processor(self, dialect: Dialect, coltype: object) -> None:
        return None
