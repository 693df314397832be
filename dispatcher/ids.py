"""Random ids (calls, events, messages, approvals) from the OS's CSPRNG, read in blocks.

``uuid.uuid4()`` asks the kernel for 16 bytes each time, one ``getrandom`` call per
id; intake makes four ids per call, and on this service's hosts a system call is not
cheap (in a profile of the API at 16 clients, ``uuid4`` was 5% of the samples). The
bytes here are the same ``os.urandom`` bytes, read 4 KiB at a time.

Each thread reads its own block, so two threads never hand out the same bytes, and a
forked child drops its parent's block: a copy of it would repeat the parent's ids.
"""

from __future__ import annotations

import os
import threading
import time

_BLOCK = 4096
_SIZE = 16
# The RFC 9562 version-4 and variant bits of a 128-bit integer.
_CLEARED = ~((0xF000 << 64) | (0xC000 << 48))
_SET = (0x4000 << 64) | (0x8000 << 48)
# Version 7: the top 48 bits are the Unix time in milliseconds.
_V7_CLEARED = ~((0xF000 << 64) | (0xC000 << 48)) & ((1 << 80) - 1)
_V7_SET = (0x7000 << 64) | (0x8000 << 48)


class _Blocks(threading.local):
    buffer = b""
    offset = 0


_blocks = _Blocks()


def _drop_blocks() -> None:
    global _blocks
    _blocks = _Blocks()


os.register_at_fork(after_in_child=_drop_blocks)


def random_bytes() -> bytes:
    """16 fresh bytes from the OS's CSPRNG."""
    blocks = _blocks
    offset = blocks.offset
    if offset >= len(blocks.buffer):
        blocks.buffer, offset = os.urandom(_BLOCK), 0
    blocks.offset = offset + _SIZE
    return blocks.buffer[offset : offset + _SIZE]


def random_hex() -> str:
    """32 hex digits (128 random bits): the tail of ``evt_``, ``apr_`` ids."""
    return random_bytes().hex()


def random_uuid() -> str:
    """A random (version 4) UUID in its canonical text form, as ``str(uuid.uuid4())``."""
    digits = f"{int.from_bytes(random_bytes()) & _CLEARED | _SET:032x}"
    return f"{digits[:8]}-{digits[8:12]}-{digits[12:16]}-{digits[16:20]}-{digits[20:]}"


def time_ordered_uuid() -> str:
    """A version-7 UUID (RFC 9562): the time in milliseconds, then 74 random bits.

    A call's id is the key of the B-trees that intake writes into (the calls' primary
    key, its default idempotency key, its events and dispatch commands by call). Random
    ids spread each insert over the whole tree, so once a year of history outgrows the
    cache every insert reads a cold page; ids that grow with time land on the few pages
    at the tree's current end. The order within one millisecond stays random, and no id
    is guessable from another: 74 of the 128 bits are the CSPRNG's.
    """
    low = int.from_bytes(random_bytes()[:10]) & _V7_CLEARED | _V7_SET
    digits = f"{time.time_ns() // 1_000_000:012x}{low:020x}"
    return f"{digits[:8]}-{digits[8:12]}-{digits[12:16]}-{digits[16:20]}-{digits[20:]}"
