"""Lane leases: which relay instance publishes which key-hash lanes.

Every live relay heartbeats a row in ``<table>_relays``; the lanes are shared out so
each holds about ``lanes / live relays``. A relay takes free or lapsed lanes at any
time, but gives lanes up only between batches (the caller decides when), so the next
owner never starts a lane while rows of it are still in flight elsewhere.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from psycopg import AsyncConnection, sql

from outbox_relay.queries import Queries


def fair_share(lanes: int, live_relays: int) -> int:
    """How many lanes one of ``live_relays`` relays should hold."""
    return math.ceil(lanes / max(live_relays, 1))


def excess_lanes(owned: set[int], share: int) -> list[int]:
    """The lanes to give up when holding more than ``share`` (the highest ones, so
    that successive rebalances move as few lanes as possible)."""
    return sorted(owned)[share:] if len(owned) > share else []


@dataclass(slots=True)
class LaneLeases:
    """One relay's view of its leases; every method runs one short transaction."""

    queries: Queries
    owner: str
    ttl: float
    owned: frozenset[int] = frozenset()
    excess: tuple[int, ...] = ()
    lanes: int = 0

    async def heartbeat(self, conn: AsyncConnection[Any]) -> frozenset[int]:
        """Prove liveness, renew held leases and take free ones up to the fair share."""
        params = {"owner": self.owner, "ttl": self.ttl}
        async with conn.transaction():
            await conn.execute(self.queries.heartbeat, params)
            renewed = {
                r[0] for r in await (await conn.execute(self.queries.renew, params)).fetchall()
            }
            live = await _scalar(conn, self.queries.live_relays)
            if not self.lanes:
                self.lanes = await _scalar(conn, self.queries.lane_count)
            share = fair_share(self.lanes, live)
            if len(renewed) < share:
                cur = await conn.execute(
                    self.queries.take_lanes, {**params, "limit": share - len(renewed)}
                )
                renewed |= {r[0] for r in await cur.fetchall()}
        self.owned = frozenset(renewed)
        self.excess = tuple(excess_lanes(renewed, share))
        return self.owned

    async def release_excess(self, conn: AsyncConnection[Any]) -> None:
        """Give up the lanes above the fair share; call only with no batch in flight."""
        if not self.excess:
            return
        await conn.execute(
            self.queries.release_lanes, {"owner": self.owner, "lanes": list(self.excess)}
        )
        self.owned = self.owned - set(self.excess)
        self.excess = ()

    async def release_all(self, conn: AsyncConnection[Any]) -> None:
        """Hand every lane back and leave, so others take over without waiting."""
        async with conn.transaction():
            await conn.execute(self.queries.release_all, {"owner": self.owner})
            await conn.execute(self.queries.leave, {"owner": self.owner})
        self.owned = frozenset()
        self.excess = ()


async def _scalar(conn: AsyncConnection[Any], query: sql.Composed) -> int:
    row = await (await conn.execute(query)).fetchone()
    return int(row[0]) if row else 0
