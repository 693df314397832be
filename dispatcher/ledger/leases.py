"""The lease of a call (``lease_owner``, ``lease_expires_at``): taken, and released,
in one vocabulary for every holder, so its meaning cannot drift between them.

A worker takes it with its claim (``authorized -> dispatching``, through
:func:`dispatcher.ledger.transitions.move_many`), a reconciler with its claim of due
calls (:func:`follow_ups_claim`, which leaves the status as it is); each sets
:func:`take_lease`'s values. Every move out of a claim (an outcome, a settlement, an
escalation, the recovery of a dead worker's call, an operator's retry) sets
:data:`LEASE_RELEASED`. Every write decided under a claim is fenced by the lease's
owner and the version the claim left (:class:`dispatcher.ledger.transitions.Fence`).

Nothing extends a lease: a worker's lasts long enough for every attempt its retry
policy allows (:func:`dispatcher.worker.claims.lease_seconds`), and a reconciler's
covers one batch's lookups.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from types import MappingProxyType
from typing import Any

from sqlalchemy import ColumnElement, func, select, tuple_, update
from sqlalchemy.sql.dml import ReturningUpdate
from sqlalchemy.sql.selectable import CTE

from dispatcher.db.tables import tool_calls

LEASE_RELEASED: Mapping[str, None] = MappingProxyType(
    {"lease_owner": None, "lease_expires_at": None}
)
"""The column values of a call nobody holds: what every move out of a claim sets."""


def take_lease(owner: str, until: ColumnElement[Any]) -> dict[str, Any]:
    """The column values that give a call to ``owner`` until ``until`` (a SQL time:
    the database's clock decides when a lease has lapsed, not the holder's)."""
    return {"lease_owner": owner, "lease_expires_at": until}


def follow_ups_claim(
    candidates: CTE,
    *,
    owner: str,
    lease_seconds: float,
    returning: Sequence[ColumnElement[Any]],
) -> ReturningUpdate[Any]:
    """The statement that gives every call of ``candidates`` (a CTE of ``tenant`` and
    ``tool_call_id`` that locks what it picks, ``FOR UPDATE SKIP LOCKED``, so concurrent
    claims take different calls) to ``owner`` for ``lease_seconds``, returning
    ``returning`` of each claimed call; run it in a transaction of the caller's.

    The status stays as it is. The version is bumped, so a write decided under an
    earlier claim of the call is fenced out, and ``next_reconcile_at`` moves to the
    lease's end: no other reconciler sees the call as due while this one holds it,
    and it falls due again by itself should this one die.
    """
    lease_end = func.now() + timedelta(seconds=lease_seconds)
    return (
        update(tool_calls)
        .where(
            tuple_(tool_calls.c.tenant, tool_calls.c.tool_call_id).in_(
                select(candidates.c.tenant, candidates.c.tool_call_id)
            )
        )
        .values(
            **take_lease(owner, lease_end),
            next_reconcile_at=lease_end,
            version=tool_calls.c.version + 1,
        )
        .returning(*returning)
    )
