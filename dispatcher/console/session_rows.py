"""The server-side record of each console session (table ``console_sessions``).

The signed cookie (:mod:`dispatcher.console.session`) says who a session is; its row
says the session is still live. Sign-in inserts the row, sign-out deletes it, and each
page checks it by primary key: every API replica reads the same table, so a session
signed out on one is refused by all, a copied cookie included. Time is the database's
(``now()``), one clock for every replica.

The table stays bounded: each sign-in and sign-out also deletes up to
:data:`PURGE_BATCH` expired rows, oldest first through the ``expires_at`` index. A
sign-in adds one row and removes up to that many, so expired rows never pile up
beyond a batch or so of what expired since the last sign-in.
"""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import any_, delete, func, insert, select
from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher.console.session import Session
from dispatcher.db.tables import console_sessions

PURGE_BATCH = 100

_rows = console_sessions.c


async def start(db: AsyncSession, session: Session, *, seconds: int) -> None:
    """Record ``session`` as live for ``seconds`` (the cookie's own lifetime)."""
    async with db.begin():
        await _purge_expired(db)
        await db.execute(
            insert(console_sessions).values(
                session_hash=session.record_id,
                key_hash=session.key_hash,
                expires_at=func.now() + timedelta(seconds=seconds),
            )
        )


async def is_live(db: AsyncSession, session: Session) -> bool:
    """Whether ``session`` was started and neither ended nor expired: one primary-key
    lookup. The key hash must match too, so a row vouches only for its own key."""
    found = await db.execute(
        select(_rows.session_hash).where(
            _rows.session_hash == session.record_id,
            _rows.key_hash == session.key_hash,
            _rows.expires_at > func.now(),
        )
    )
    return found.first() is not None


async def end(db: AsyncSession, session: Session) -> None:
    """Delete ``session``'s row: from now on no replica lets its cookie in."""
    async with db.begin():
        await db.execute(delete(console_sessions).where(_rows.session_hash == session.record_id))
        await _purge_expired(db)


async def _purge_expired(db: AsyncSession) -> None:
    # SKIP LOCKED: two replicas signing people in at once each take their own batch
    # instead of the second waiting for the first's rows.
    expired = (
        select(_rows.session_hash)
        .where(_rows.expires_at <= func.now())
        .order_by(_rows.expires_at)
        .limit(PURGE_BATCH)
        .with_for_update(skip_locked=True)
        .scalar_subquery()
    )
    # "= ANY(ARRAY(...))", not "IN (...)": PostgreSQL runs the batch once and deletes
    # by primary key, where for IN it planned a join that scans the whole table.
    await db.execute(
        delete(console_sessions).where(_rows.session_hash == any_(func.array(expired)))
    )
