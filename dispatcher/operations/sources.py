"""What an operation of each kind reads: calls (:mod:`dispatcher.operations.selection`)
or the outbox's dead letters (:mod:`dispatcher.operations.dead_letters`), each with the
same four functions."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher.operations import dead_letters, selection
from dispatcher.operations.models import (
    DEAD_LETTER_KINDS,
    CallSample,
    DeadLetterSample,
    OperationKind,
)


@dataclass(frozen=True, slots=True)
class Source:
    """How many a filter selects now, the first of them, the next batch after a
    cursor, and the cursor after a batch's last row."""

    count: Callable[[AsyncSession, Mapping[str, Any]], Awaitable[int]]
    sample: Callable[
        [AsyncSession, Mapping[str, Any], int],
        Awaitable[list[CallSample]] | Awaitable[list[DeadLetterSample]],
    ]
    next_batch: Callable[
        [AsyncSession, str, Mapping[str, Any], datetime, Mapping[str, Any] | None, int],
        Awaitable[Sequence[Any]],
    ]
    cursor_of: Callable[[Any], dict[str, Any]]


CALLS = Source(selection.count, selection.sample, selection.next_batch, selection.cursor_of)
DEAD_LETTERS = Source(
    dead_letters.count, dead_letters.sample, dead_letters.next_batch, dead_letters.cursor_of
)


def source_of(kind: OperationKind) -> Source:
    return DEAD_LETTERS if kind in DEAD_LETTER_KINDS else CALLS
