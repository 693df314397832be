"""Whether a fetched partition is the log its recorded offset was taken from.

``bus_offsets`` says "every record below this offset was recorded", which holds for one
log. A request topic deleted and made again (an operator's mistake, a broker that lost
its data) starts again at offset 0, and without a check every new record below the old
offset would be skipped as recorded: lost without a word.

So where a process's fetch does not simply continue what it handled last (it started,
was given the partition, or sought), the first batch is judged against the row:

- it starts at or past the recorded offset: nothing was skipped, nothing to tell;
- the log ends below the recorded offset (its high watermark): a log that never held
  the last recorded record is a new one;
- the last recorded record is in the batch: the same fingerprint is the same log;
- it is further on: the partition is sought to it, and the next fetch decides.

A new log's row goes back to 0 and the partition is read from its beginning, so every
record of the new log is recorded once. A redelivery of the same log costs one seek.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from enum import StrEnum


class Verdict(StrEnum):
    SAME_LOG = "same_log"
    NEW_LOG = "new_log"
    LOOK_FURTHER = "look_further"
    """Read the last recorded record first (the batch stops before it)."""


@dataclass(frozen=True, slots=True)
class Recorded:
    """A partition's row: the next offset to record and the last record's fingerprint."""

    next_offset: int
    last_record: bytes | None


def fingerprint(timestamp_ms: int | None, key: bytes | None, value: bytes | None) -> bytes:
    """A record's identity within its partition: the same record delivered again has the
    same; a new log's record at that offset almost surely another (its time differs
    even where a producer sends the same bytes again)."""
    digest = hashlib.blake2b(digest_size=16)
    for part in (str(timestamp_ms).encode(), key, value):
        digest.update(b"-" if part is None else b"+%d:" % len(part) + part)
    return digest.digest()


def judge(
    first: int,
    fingerprints: dict[int, bytes | None],
    recorded: Recorded | None,
    highwater: int | None,
) -> Verdict:
    """The verdict on a batch starting at offset ``first`` (``fingerprints``: its
    records' by offset), given the partition's row and its high watermark."""
    if recorded is None or first >= recorded.next_offset or recorded.last_record is None:
        return Verdict.SAME_LOG  # nothing of it would be skipped, or nothing to compare
    last = recorded.next_offset - 1
    if highwater is not None and highwater <= last:
        return Verdict.NEW_LOG
    if last in fingerprints:
        same = fingerprints[last] == recorded.last_record
        return Verdict.SAME_LOG if same else Verdict.NEW_LOG
    return Verdict.LOOK_FURTHER
