"""Where the sandbox provider keeps its requests: the store contract and its in-memory
implementation (the PostgreSQL one is in :mod:`devtools.sandbox.pgstore`)."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Protocol

from devtools.sandbox.records import (
    EffectCounts,
    RequestRecord,
    RequestStatus,
    Reversal,
    ReverseResult,
    after_lookup,
    new_reversal,
)


class SandboxStore(Protocol):
    """Atomic operations on the provider's state.

    Every method is one atomic step even under concurrent callers: that is what makes
    "the same key twice applies the effect once" hold for 50 simultaneous requests.
    """

    name: str
    """``memory`` or ``postgresql``, for the startup line."""

    async def open(self) -> None:
        """Acquire resources (and create tables); called once before serving."""

    async def close(self) -> None:
        """Release resources; the state survives only if the store is durable."""

    async def create(self, record: RequestRecord) -> tuple[RequestRecord, bool]:
        """Insert ``record`` unless its key is taken; returns the stored record and whether
        this call created it (and so applied its effect, when it succeeded)."""

    async def lookup(self, external_id: str) -> RequestRecord | None:
        """The current record, after advancing it by one lookup if pending."""

    async def lookup_by_key(self, idempotency_key: str) -> RequestRecord | None:
        """Like :meth:`lookup`, finding the request by its idempotency key."""

    async def reverse(self, external_id: str, reversal_key: str) -> ReverseResult:
        """Reverse a succeeded request once; later calls get the first reversal back."""

    async def counts(self) -> EffectCounts:
        """Applied effects and reversals per idempotency key."""

    async def reset(self) -> None:
        """Forget everything (tests)."""


class MemoryStore:
    """State in this process only. Each method runs without awaiting, so on one event
    loop it is atomic without a lock."""

    name = "memory"

    def __init__(self) -> None:
        self._by_id: dict[str, RequestRecord] = {}
        self._id_by_key: dict[str, str] = {}
        self._reversals: dict[str, Reversal] = {}
        self._effects: Counter[str] = Counter()
        self._reversed: Counter[str] = Counter()

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def create(self, record: RequestRecord) -> tuple[RequestRecord, bool]:
        existing = self._id_by_key.get(record.idempotency_key)
        if existing is not None:
            return self._by_id[existing], False
        self._by_id[record.external_id] = record
        self._id_by_key[record.idempotency_key] = record.external_id
        if record.status is RequestStatus.SUCCEEDED:
            self._effects[record.idempotency_key] += 1
        return record, True

    async def lookup(self, external_id: str) -> RequestRecord | None:
        record = self._by_id.get(external_id)
        if record is None:
            return None
        advanced, applied = after_lookup(record)
        if advanced is not record:
            self._by_id[external_id] = advanced
        if applied:
            self._effects[record.idempotency_key] += 1
        return advanced

    async def lookup_by_key(self, idempotency_key: str) -> RequestRecord | None:
        external_id = self._id_by_key.get(idempotency_key)
        return None if external_id is None else await self.lookup(external_id)

    async def reverse(self, external_id: str, reversal_key: str) -> ReverseResult:
        record = self._by_id.get(external_id)
        if record is None:
            return ReverseResult(None, None)
        reversal = self._reversals.get(external_id)
        if reversal is None and record.status is RequestStatus.SUCCEEDED:
            reversal = new_reversal(record, reversal_key)
            self._reversals[external_id] = reversal
            record = self._by_id[external_id] = replace(record, reversed=True)
            self._reversed[record.idempotency_key] += 1
        return ReverseResult(record, reversal)

    async def counts(self) -> EffectCounts:
        return EffectCounts(dict(self._effects), dict(self._reversed))

    async def reset(self) -> None:
        for state in (
            self._by_id,
            self._id_by_key,
            self._reversals,
            self._effects,
            self._reversed,
        ):
            state.clear()
