"""Facts that no transaction of this package's callers writes, found by a sweep and
reported once: an outbox dead letter (the relay writes it, and ``outbox_relay`` knows
nothing above it) and an approval about to expire (a fact of the clock).

Each is reported by inserting its mark in ``webhook_reported`` with ON CONFLICT DO
NOTHING, in the transaction of its notification: a mark another sweeper inserted first
(or earlier) returns nothing, so two sweepers never report one fact twice, and no
watermark can skip a dead letter whose transaction committed late. The marks of facts
that are gone (a dead letter retried or discarded, an approval closed) are deleted,
so the table stays as small as the live set it shadows.
"""

from __future__ import annotations

from sqlalchemy import and_, delete, exists, func, literal, select, text
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher.db.tables import approvals, outbox, webhook_reported
from dispatcher.states import ApprovalStatus
from dispatcher.webhooks.events import APPROVAL_EXPIRING, DEAD_LETTER_WRITTEN, approval_data
from dispatcher.webhooks.notify import notify

DEAD_LETTER = "dead_letter"
EXPIRING = "approval_expiring"


async def _mark(session: AsyncSession, kind: str, ref: str) -> bool:
    """True when ``kind, ref`` was not reported before (it is now, in this transaction)."""
    inserted = await session.execute(
        pg_insert(webhook_reported)
        .values(kind=kind, ref=ref)
        .on_conflict_do_nothing()
        .returning(webhook_reported.c.ref)
    )
    return inserted.first() is not None


def _dead_ref(row_id: int, at: object) -> str:
    return f"{row_id}@{at}"


async def report_dead_letters(session: AsyncSession, *, limit: int = 200) -> int:
    """``dead_letter.written`` for each outbox dead letter not reported yet, to its
    tenant's subscribers (a row without a tenant is nobody's, and is not reported)."""
    tenant = outbox.c.payload["tenant"].astext
    ref = func.concat(outbox.c.id, literal("@"), outbox.c.dead_lettered_at)
    rows = (
        await session.execute(
            select(
                outbox.c.id,
                outbox.c.topic,
                outbox.c.headers["ce_id"].astext.label("message_id"),
                outbox.c.attempts,
                outbox.c.dead_lettered_at,
                tenant.label("tenant"),
            )
            # Dead letters are few by construction (ix_outbox_dead_letters is partial).
            .where(outbox.c.dead_lettered_at.is_not(None), tenant.is_not(None))
            .where(
                ~exists().where(
                    and_(webhook_reported.c.kind == DEAD_LETTER, webhook_reported.c.ref == ref)
                )
            )
            .order_by(outbox.c.id)
            .limit(limit)
        )
    ).all()
    reported = 0
    for row in rows:
        if not await _mark(session, DEAD_LETTER, _dead_ref(row.id, row.dead_lettered_at)):
            continue
        await notify(
            session,
            event_type=DEAD_LETTER_WRITTEN,
            tenant=row.tenant,
            data={
                "outboxId": row.id,
                "topic": row.topic,
                "messageId": row.message_id,
                "attempts": row.attempts,
                "deadLetteredAt": row.dead_lettered_at,
            },
        )
        reported += 1
    return reported


async def forget_gone_dead_letters(session: AsyncSession) -> None:
    """Delete the marks of dead letters no longer dead (retried or discarded)."""
    ref = func.concat(outbox.c.id, literal("@"), outbox.c.dead_lettered_at)
    await session.execute(
        delete(webhook_reported).where(
            webhook_reported.c.kind == DEAD_LETTER,
            ~exists().where(
                and_(outbox.c.dead_lettered_at.is_not(None), ref == webhook_reported.c.ref)
            ),
        )
    )


async def report_expiring(session: AsyncSession, *, within: float, limit: int = 500) -> int:
    """``approval.expiring`` once for each pending approval that expires within
    ``within`` seconds (and has not expired yet), to its tenant's subscribers."""
    pending = approvals.c.status == ApprovalStatus.PENDING.value
    rows = (
        await session.execute(
            select(approvals)
            # ix_approvals_pending_expiry: the pending ones, by expiry.
            .where(pending, approvals.c.expires_at > func.now())
            .where(approvals.c.expires_at <= func.now() + text("make_interval(secs => :w)"))
            .where(
                ~exists().where(
                    and_(
                        webhook_reported.c.kind == EXPIRING,
                        webhook_reported.c.ref == approvals.c.approval_id,
                    )
                )
            )
            .order_by(approvals.c.expires_at)
            .limit(limit),
            {"w": within},
        )
    ).all()
    reported = 0
    for row in rows:
        if not await _mark(session, EXPIRING, row.approval_id):
            continue
        await notify(
            session,
            event_type=APPROVAL_EXPIRING,
            tenant=row.tenant,
            data=approval_data(row._mapping),
        )
        reported += 1
    # An approval closed since it was reported needs no mark: its id never comes back.
    await session.execute(
        delete(webhook_reported).where(
            webhook_reported.c.kind == EXPIRING,
            ~exists().where(and_(pending, approvals.c.approval_id == webhook_reported.c.ref)),
        )
    )
    return reported
