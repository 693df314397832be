"""The sandbox provider's state in PostgreSQL (schema ``sandbox``), so that it survives
a restart of the sandbox itself.

The sandbox owns its tables and creates them on start; they are not part of the
dispatcher's Alembic migrations because a real provider's storage is not ours either.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from devtools.sandbox.records import (
    EffectCounts,
    RequestRecord,
    RequestStatus,
    Reversal,
    ReverseResult,
    after_lookup,
    new_reversal,
)

# Any fixed number: it only keeps two sandboxes starting at once from racing on DDL
# (CREATE ... IF NOT EXISTS is not safe against a concurrent identical CREATE).
_DDL_LOCK = 0x5A4D_B0C5

_DDL = (
    "CREATE SCHEMA IF NOT EXISTS sandbox",
    """CREATE TABLE IF NOT EXISTS sandbox.requests (
        external_id text PRIMARY KEY,
        idempotency_key text NOT NULL UNIQUE,
        body_hash text NOT NULL,
        body text NOT NULL,
        status text NOT NULL,
        pending_lookups integer NOT NULL,
        pending_outcome text NOT NULL,
        reply_status integer NOT NULL,
        reply_body bytea NOT NULL,
        created_at timestamptz NOT NULL DEFAULT now()
    )""",
    """CREATE TABLE IF NOT EXISTS sandbox.reversals (
        external_id text PRIMARY KEY REFERENCES sandbox.requests ON DELETE CASCADE,
        idempotency_key text NOT NULL,
        reversal_id text NOT NULL,
        reversal_key text NOT NULL,
        reply_body bytea NOT NULL,
        created_at timestamptz NOT NULL DEFAULT now()
    )""",
    # An append-only log written in the same transaction as the state change: counting
    # its rows, rather than trusting the unique key, is what lets a test prove that an
    # effect was applied once.
    """CREATE TABLE IF NOT EXISTS sandbox.effects (
        seq bigserial PRIMARY KEY,
        idempotency_key text NOT NULL,
        external_id text NOT NULL,
        kind text NOT NULL CHECK (kind IN ('apply', 'reverse')),
        applied_at timestamptz NOT NULL DEFAULT now()
    )""",
)

_COLUMNS = (
    "r.external_id, r.idempotency_key, r.body_hash, r.body, r.status, r.pending_lookups,"
    " r.pending_outcome, r.reply_status, r.reply_body,"
    " EXISTS (SELECT 1 FROM sandbox.reversals v WHERE v.external_id = r.external_id)"
)
_SELECT = f"SELECT {_COLUMNS} FROM sandbox.requests r"  # noqa: S608 - constant text


def _record(row: tuple[Any, ...]) -> RequestRecord:
    return RequestRecord(
        external_id=row[0],
        idempotency_key=row[1],
        body_hash=row[2],
        body=row[3],
        status=RequestStatus(row[4]),
        pending_lookups=row[5],
        pending_outcome=RequestStatus(row[6]),
        reply_status=row[7],
        reply_body=bytes(row[8]),
        reversed=row[9],
    )


async def _log_effect(conn: AsyncConnection[Any], record: RequestRecord, kind: str) -> None:
    await conn.execute(
        "INSERT INTO sandbox.effects (idempotency_key, external_id, kind) VALUES (%s, %s, %s)",
        (record.idempotency_key, record.external_id, kind),
    )


class PostgresStore:
    """State in PostgreSQL; each operation is one transaction."""

    name = "postgresql"

    def __init__(self, database_url: str, *, max_connections: int = 10) -> None:
        # Accept the SQLAlchemy spelling the rest of the project uses, too.
        if database_url.startswith("postgresql+psycopg://"):
            database_url = "postgresql://" + database_url.removeprefix("postgresql+psycopg://")
        self._url = database_url
        self._pool: AsyncConnectionPool[AsyncConnection[Any]] = AsyncConnectionPool(
            database_url,
            min_size=1,
            max_size=max_connections,
            # Reads are single statements; writes open an explicit transaction.
            kwargs={"autocommit": True},
            open=False,
        )

    async def open(self) -> None:
        # A direct connection first: an unreachable database fails here at once with
        # psycopg's own message, where the pool would retry quietly until its timeout.
        async with await AsyncConnection.connect(self._url, connect_timeout=10) as conn:
            async with conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_DDL_LOCK,))
                for statement in _DDL:
                    await conn.execute(statement)
        await self._pool.open(wait=True, timeout=30)

    async def close(self) -> None:
        await self._pool.close()

    async def create(self, record: RequestRecord) -> tuple[RequestRecord, bool]:
        async with self._pool.connection() as conn, conn.transaction():
            # ON CONFLICT waits for a concurrent insert of the same key to commit, so of
            # 50 simultaneous requests exactly one inserts; the others read its row below
            # (a new statement, hence a new snapshot under READ COMMITTED).
            cur = await conn.execute(
                "INSERT INTO sandbox.requests (external_id, idempotency_key, body_hash, body,"
                " status, pending_lookups, pending_outcome, reply_status, reply_body)"
                " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)"
                " ON CONFLICT (idempotency_key) DO NOTHING RETURNING external_id",
                (
                    record.external_id,
                    record.idempotency_key,
                    record.body_hash,
                    record.body,
                    record.status.value,
                    record.pending_lookups,
                    record.pending_outcome.value,
                    record.reply_status,
                    record.reply_body,
                ),
            )
            if await cur.fetchone() is not None:
                if record.status is RequestStatus.SUCCEEDED:
                    await _log_effect(conn, record, "apply")
                return record, True
            cur = await conn.execute(
                f"{_SELECT} WHERE r.idempotency_key = %s", (record.idempotency_key,)
            )
            row = await cur.fetchone()
            if row is None:  # deleted by a concurrent reset
                raise RuntimeError("the conflicting request disappeared")
            return _record(row), False

    async def lookup(self, external_id: str) -> RequestRecord | None:
        return await self._lookup("r.external_id", external_id)

    async def lookup_by_key(self, idempotency_key: str) -> RequestRecord | None:
        return await self._lookup("r.idempotency_key", idempotency_key)

    async def _lookup(self, column: str, value: str) -> RequestRecord | None:
        async with self._pool.connection() as conn:
            cur = await conn.execute(f"{_SELECT} WHERE {column} = %s", (value,))
            row = await cur.fetchone()
            if row is None or row[4] != RequestStatus.PENDING:
                return None if row is None else _record(row)
            async with conn.transaction():
                # Pending requests are rare: only they pay for the row lock that keeps
                # two concurrent lookups from both settling (and applying) the request.
                cur = await conn.execute(f"{_SELECT} WHERE {column} = %s FOR UPDATE OF r", (value,))
                row = await cur.fetchone()
                if row is None:
                    return None
                record = _record(row)
                advanced, applied = after_lookup(record)
                if advanced != record:
                    await conn.execute(
                        "UPDATE sandbox.requests SET status = %s, pending_lookups = %s"
                        " WHERE external_id = %s",
                        (advanced.status.value, advanced.pending_lookups, record.external_id),
                    )
                if applied:
                    await _log_effect(conn, record, "apply")
                return advanced

    async def reverse(self, external_id: str, reversal_key: str) -> ReverseResult:
        async with self._pool.connection() as conn, conn.transaction():
            # The row lock serialises concurrent reversals of the same request.
            cur = await conn.execute(
                f"{_SELECT} WHERE r.external_id = %s FOR UPDATE OF r", (external_id,)
            )
            row = await cur.fetchone()
            if row is None:
                return ReverseResult(None, None)
            record = _record(row)
            cur = await conn.execute(
                "SELECT external_id, idempotency_key, reversal_id, reversal_key, reply_body"
                " FROM sandbox.reversals WHERE external_id = %s",
                (external_id,),
            )
            found = await cur.fetchone()
            if found is not None:
                reversal = Reversal(found[0], found[1], found[2], found[3], bytes(found[4]))
                return ReverseResult(record, reversal)
            if record.status is not RequestStatus.SUCCEEDED:
                return ReverseResult(record, None)
            reversal = new_reversal(record, reversal_key)
            await conn.execute(
                "INSERT INTO sandbox.reversals"
                " (external_id, idempotency_key, reversal_id, reversal_key, reply_body)"
                " VALUES (%s, %s, %s, %s, %s)",
                (
                    reversal.external_id,
                    reversal.idempotency_key,
                    reversal.reversal_id,
                    reversal.reversal_key,
                    reversal.reply_body,
                ),
            )
            await _log_effect(conn, record, "reverse")
            return ReverseResult(replace(record, reversed=True), reversal)

    async def counts(self) -> EffectCounts:
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "SELECT kind, idempotency_key, count(*) FROM sandbox.effects"
                " GROUP BY kind, idempotency_key"
            )
            counts = EffectCounts()
            for kind, key, n in await cur.fetchall():
                (counts.effects if kind == "apply" else counts.reversals)[key] = n
            return counts

    async def reset(self) -> None:
        async with self._pool.connection() as conn:
            await conn.execute(
                "TRUNCATE sandbox.reversals, sandbox.effects, sandbox.requests RESTART IDENTITY"
            )
