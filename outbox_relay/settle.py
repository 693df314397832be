"""What a finished batch may mark: pure logic, no I/O.

A row is marked published only when the broker acknowledged it *and* every earlier
row of its key in the batch was acknowledged too. A row acknowledged behind a failed
row of its key stays unpublished and is sent again after that row, so the key's last
message on the topic is still the last one written (what a compacted topic keeps).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from outbox_relay.kafka import OutboxRow, describe_error, is_permanent


class NotSent:
    """Outcome of a row that was held back because an earlier row of its key failed."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "NOT_SENT"


NOT_SENT = NotSent()

Outcome = BaseException | NotSent | None
"""Per row: ``None`` once the broker acknowledged it, why it failed, or :data:`NOT_SENT`."""


@dataclass(slots=True)
class Settlement:
    """The database writes a batch's outcomes call for."""

    published: list[OutboxRow] = field(default_factory=list)
    dead: list[tuple[OutboxRow, str]] = field(default_factory=list)
    failed: list[tuple[OutboxRow, str]] = field(default_factory=list)
    held_back: list[OutboxRow] = field(default_factory=list)
    """Acknowledged behind a failed row of the same key; will be sent again."""

    @property
    def transient(self) -> bool:
        """Some row failed for a reason that may go away: back off, then retry."""
        return bool(self.failed)


def settle(rows: Sequence[OutboxRow], outcomes: Sequence[Outcome]) -> Settlement:
    """Sort ``rows`` (in the order they were sent) by what their ``outcomes`` allow."""
    if len(rows) != len(outcomes):
        raise ValueError("one outcome per row")
    result = Settlement()
    broken: set[str] = set()
    for row, outcome in zip(rows, outcomes, strict=True):
        if isinstance(outcome, NotSent):
            broken.add(row.key)
        elif isinstance(outcome, BaseException):
            broken.add(row.key)
            error = describe_error(outcome)
            if is_permanent(outcome):
                result.dead.append((row, error))
            else:
                result.failed.append((row, error))
        elif row.key in broken:
            result.held_back.append(row)
        else:
            result.published.append(row)
    return result
