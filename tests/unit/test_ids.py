"""dispatcher.ids: CSPRNG ids read in blocks, never the same bytes twice."""

from __future__ import annotations

import os
import re
import threading
import time
import uuid

import pytest

from dispatcher import ids

UUID_TEXT = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")


def test_a_random_uuid_is_a_canonical_version_4_uuid() -> None:
    for _ in range(1000):
        text = ids.random_uuid()
        assert UUID_TEXT.match(text), text
        parsed = uuid.UUID(text)
        assert (parsed.version, parsed.variant, str(parsed)) == (4, uuid.RFC_4122, text)


def test_a_time_ordered_uuid_is_version_7_and_grows_with_time() -> None:
    before = time.time_ns() // 1_000_000
    drawn = [ids.time_ordered_uuid() for _ in range(2000)]
    after = time.time_ns() // 1_000_000
    for text in drawn:
        parsed = uuid.UUID(text)
        assert (parsed.version, parsed.variant, str(parsed)) == (7, uuid.RFC_4122, text)
        assert before <= parsed.int >> 80 <= after
    # Ordered by the millisecond, random within one: the B-tree's end, never a guess.
    stamps = [uuid.UUID(t).int >> 80 for t in drawn]
    assert stamps == sorted(stamps)
    assert len({uuid.UUID(t).int & ((1 << 80) - 1) for t in drawn}) == len(drawn)


def test_ids_do_not_repeat_across_blocks() -> None:
    # Several 4 KiB blocks' worth: the refill starts on fresh bytes.
    drawn = [ids.random_hex() for _ in range(3000)] + [ids.random_uuid() for _ in range(3000)]
    assert len({d.replace("-", "") for d in drawn}) == len(drawn)
    assert all(len(h) == 32 for h in drawn[:3000])


def test_two_threads_never_get_the_same_bytes() -> None:
    drawn: list[list[bytes]] = [[], []]

    def draw(into: list[bytes]) -> None:
        into.extend(ids.random_bytes() for _ in range(2000))

    threads = [threading.Thread(target=draw, args=(d,)) for d in drawn]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not set(drawn[0]) & set(drawn[1])


def test_each_thread_reads_a_block_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    # A shared block would hand out the same offset to two threads that both read it
    # before either moves it on: each thread must start from its own read.
    reads: list[str] = []
    real = os.urandom

    def counted(n: int) -> bytes:
        reads.append(threading.current_thread().name)
        return real(n)

    monkeypatch.setattr(ids.os, "urandom", counted)
    ids.random_bytes()  # this thread's block, read now or earlier
    before = len(reads)
    other = threading.Thread(target=ids.random_bytes, name="other")
    other.start()
    other.join()
    assert reads[before:] == ["other"]


def test_a_forked_child_does_not_repeat_its_parents_ids() -> None:
    ids.random_bytes()  # the parent holds a block with bytes still to hand out
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next ids, to the parent
        os.close(read)
        os.write(write, b"".join(ids.random_bytes() for _ in range(8)))
        os._exit(0)
    os.close(write)
    child = b""
    while chunk := os.read(read, 4096):
        child += chunk
    os.close(read)
    os.waitpid(pid, 0)
    parent = b"".join(ids.random_bytes() for _ in range(8))
    assert len(child) == 128
    assert {child[i : i + 16] for i in range(0, 128, 16)}.isdisjoint(
        parent[i : i + 16] for i in range(0, 128, 16)
    )
