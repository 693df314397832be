"""Every SQL statement the relay runs, for one outbox table name.

Why the relay reads the way it does -- commit-order gaps:
ids come from a sequence when a row is *inserted*, but the row becomes visible when
its transaction *commits*. A transaction that took id 10 may commit after one that
took id 11, so a reader that remembers "published up to 11" and then asks for
``id > 11`` never sees 10. This relay keeps no high-water mark: every read asks
again for *all* unpublished rows of its lanes (``published_at IS NULL``, served by a
partial index that holds only those), so a late-committing lower id is simply found
by the next read and published then -- after the higher ids it committed after,
which is commit order.
"""

from __future__ import annotations

from dataclasses import dataclass

from psycopg import AsyncConnection, sql

from outbox_relay.table import lanes_table_name, listeners_table_name, relays_table_name

# Each statement by name; ``{t}``, ``{lanes}``, ``{relays}`` and ``{listeners}`` stand
# for the outbox's table and its lane, relay and listener tables.
_STATEMENTS: dict[str, str] = {
    # Rows of the lanes this relay holds an unexpired lease on, in id order.
    # The lease test sits in the same statement as the read, so a relay whose
    # lease lapsed reads nothing. No row locks: a lane has one owner, and a
    # second owner during a lease overlap only duplicates, in the same order.
    # A key with a dead-lettered row publishes nothing until an operator
    # retries or discards it, so the key's order survives the failure.
    #
    # Meant as an index scan of the unpublished rows in id order that stops at
    # the limit. Expecting few rows, the planner took a bitmap scan and a sort
    # instead, and a bitmap scan never marks the index entries of rows
    # published since as dead: every read visited each of them in the heap
    # until vacuum ran (11 ms a read behind 40,000 in bench.dispatch). So the
    # relay's connections turn bitmap scans off (plain_index_scans, below).
    "claim": (
        """
        SELECT o.id, o.topic, o.key, o.payload::text, o.headers, o.created_at
        FROM {t} o
        WHERE o.published_at IS NULL
          AND o.dead_lettered_at IS NULL
          AND o.lane = ANY (ARRAY(
              SELECT l.lane FROM {lanes} l
              WHERE l.owner = %(owner)s AND l.expires_at > now()))
          AND NOT EXISTS (
              SELECT 1 FROM {t} d
              WHERE d.key = o.key AND d.dead_lettered_at IS NOT NULL)
        ORDER BY o.id
        LIMIT %(limit)s
        """
    ),
    "mark_published": (
        "UPDATE {t} SET published_at = now() WHERE id = ANY(%(ids)s) AND published_at IS NULL"
    ),
    "dead_letter": (
        "UPDATE {t} SET dead_lettered_at = now(), attempts = attempts + 1, "
        "last_error = %(error)s WHERE id = %(id)s AND published_at IS NULL"
    ),
    "record_failure": (
        "UPDATE {t} SET attempts = attempts + 1, last_error = %(error)s "
        "WHERE id = %(id)s AND published_at IS NULL"
    ),
    "heartbeat": (
        """
        INSERT INTO {relays} (relay_id, heartbeat_at, expires_at)
        VALUES (%(owner)s, now(), now() + make_interval(secs => %(ttl)s))
        ON CONFLICT (relay_id) DO UPDATE
        SET heartbeat_at = excluded.heartbeat_at, expires_at = excluded.expires_at
        """
    ),
    "leave": (
        "DELETE FROM {relays} WHERE relay_id = %(owner)s OR expires_at < now() - interval '1 hour'"
    ),
    # Renewing a lapsed lease is safe as long as nobody took the lane meanwhile:
    # then nobody else published from it either.
    "renew": (
        """
        UPDATE {lanes}
        SET expires_at = now() + make_interval(secs => %(ttl)s), heartbeat_at = now()
        WHERE owner = %(owner)s
        RETURNING lane
        """
    ),
    "live_relays": "SELECT count(*) FROM {relays} WHERE expires_at > now()",
    # An idle relay listening, until the given time unless renewed; and no longer.
    "listening": (
        """
        INSERT INTO {listeners} (relay_id, until)
        VALUES (%(relay)s, now() + make_interval(secs => %(ttl)s))
        ON CONFLICT (relay_id) DO UPDATE SET until = excluded.until
        """
    ),
    "not_listening": "DELETE FROM {listeners} WHERE relay_id = %(relay)s",
    "lane_count": "SELECT count(*) FROM {lanes}",
    "take_lanes": (
        """
        UPDATE {lanes}
        SET owner = %(owner)s, epoch = epoch + 1, heartbeat_at = now(),
            expires_at = now() + make_interval(secs => %(ttl)s)
        WHERE lane IN (
            SELECT lane FROM {lanes}
            WHERE owner IS NULL OR expires_at <= now()
            ORDER BY lane
            LIMIT %(limit)s
            FOR UPDATE SKIP LOCKED)
          AND (owner IS NULL OR expires_at <= now())
        RETURNING lane
        """
    ),
    "release_lanes": (
        "UPDATE {lanes} SET owner = NULL, expires_at = NULL "
        "WHERE owner = %(owner)s AND lane = ANY(%(lanes)s)"
    ),
    "release_all": ("UPDATE {lanes} SET owner = NULL, expires_at = NULL WHERE owner = %(owner)s"),
    "backlog": (
        """
        SELECT count(*) FILTER (WHERE dead_lettered_at IS NULL),
               min(created_at) FILTER (WHERE dead_lettered_at IS NULL),
               count(*) FILTER (WHERE dead_lettered_at IS NOT NULL)
        FROM {t} WHERE published_at IS NULL
        """
    ),
    # Each key's oldest dead letter, with the rows it holds back: from the dead
    # letters (a small partial index), then each key's unpublished rows.
    # Joined from the unpublished side instead, the planner's estimate put the
    # statement above the JIT threshold: 60 ms of compiling every refresh.
    "blocked": (
        """
        SELECT d.id, d.key, b.n
        FROM (SELECT DISTINCT ON (x.key) x.id, x.key
              FROM {t} x
              WHERE x.dead_lettered_at IS NOT NULL
              ORDER BY x.key, x.id) d
        CROSS JOIN LATERAL (
            SELECT count(*) AS n FROM {t} o
            WHERE o.key = d.key
              AND o.published_at IS NULL AND o.dead_lettered_at IS NULL) b
        WHERE b.n > 0
        ORDER BY d.id
        """
    ),
    # Bounded batches, oldest first; SKIP LOCKED lets several relays purge at once.
    "purge": (
        """
        DELETE FROM {t} WHERE id IN (
            SELECT id FROM {t}
            WHERE published_at IS NOT NULL AND published_at < now() - %(age)s
            ORDER BY published_at
            LIMIT %(limit)s
            FOR UPDATE SKIP LOCKED)
        """
    ),
    "list_dead": (
        """
        SELECT d.id, d.topic, d.key, d.headers ->> 'ce_id', d.attempts, d.last_error,
               d.dead_lettered_at, d.created_at,
               (SELECT count(*) FROM {t} o
                WHERE o.key = d.key AND o.published_at IS NULL
                  AND o.dead_lettered_at IS NULL)
        FROM {t} d
        WHERE d.dead_lettered_at IS NOT NULL
        ORDER BY d.id
        LIMIT %(limit)s
        """
    ),
    "retry_dead": (
        "UPDATE {t} SET dead_lettered_at = NULL, attempts = 0 "
        "WHERE id = %(id)s AND dead_lettered_at IS NOT NULL RETURNING id"
    ),
    "discard_dead": (
        "DELETE FROM {t} WHERE id = %(id)s AND dead_lettered_at IS NOT NULL RETURNING id"
    ),
}


@dataclass(frozen=True, slots=True)
class Queries:
    """The statements, with the outbox's table names filled in."""

    claim: sql.Composed
    mark_published: sql.Composed
    dead_letter: sql.Composed
    record_failure: sql.Composed
    heartbeat: sql.Composed
    leave: sql.Composed
    renew: sql.Composed
    live_relays: sql.Composed
    listening: sql.Composed
    not_listening: sql.Composed
    lane_count: sql.Composed
    take_lanes: sql.Composed
    release_lanes: sql.Composed
    release_all: sql.Composed
    backlog: sql.Composed
    blocked: sql.Composed
    purge: sql.Composed
    list_dead: sql.Composed
    retry_dead: sql.Composed
    discard_dead: sql.Composed

    @classmethod
    def for_table(cls, table: str) -> Queries:
        """Statements for outbox ``table``."""
        fields = {
            "t": sql.Identifier(table),
            "lanes": sql.Identifier(lanes_table_name(table)),
            "relays": sql.Identifier(relays_table_name(table)),
            "listeners": sql.Identifier(listeners_table_name(table)),
        }
        return cls(
            **{name: sql.SQL(text).format(**fields) for name, text in _STATEMENTS.items()},
        )


async def relay_session(conn: AsyncConnection[object]) -> None:
    """Set up a relay connection: plain index scans (below), and commits that return
    before their WAL reaches the disk.

    A server crash may lose the last of the relay's writes without breaking a promise:
    a lost mark means its rows are sent again (at least once; consumers drop the copy
    by ``ce_id``), in the same order, since WAL is flushed in order and what a crash
    loses is a suffix of the relay's commits; a lost lease renewal or failure count is
    made again. Waiting for the flush costs every batch a disk flush: little on a fast
    local disk, milliseconds on a network one.
    """
    await plain_index_scans(conn)
    await conn.execute("SET synchronous_commit = off")


async def plain_index_scans(conn: AsyncConnection[object]) -> None:
    """Set up a relay connection: its statements go through their indexes, as plain
    index scans, and are never JIT-compiled.

    Every statement here is written for an index (see "claim"); where the outbox's
    statistics lag its contents (a new table, a burst), the planner's other choices
    read every row: a seq scan for the dead letters that an empty partial index holds,
    or a bitmap scan that never marks dead entries. And the same bad estimates put
    "blocked" above the JIT threshold, 60 ms of compiling a statement that finds no
    row. Session settings, on the relay's own connections only: the relay needs a
    session-mode connection anyway (it LISTENs).
    """
    for setting in ("enable_bitmapscan", "enable_seqscan", "jit"):
        await conn.execute(sql.SQL("SET {} = off").format(sql.Identifier(setting)))
