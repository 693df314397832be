"""The database and broker of a chaos run: owned (embedded, so they can be restarted)
or borrowed (configured; the run gets a fresh database of its own and never restarts
the server)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from psycopg import sql

from devtools.chaos.topics import restore_topics
from devtools.databases import with_database
from devtools.embedded import EmbeddedPostgres, Tansu
from dispatcher.db import migrate
from dispatcher.settings import Settings


@dataclass
class Infrastructure:
    database_url: str
    kafka_bootstrap: str
    pg: EmbeddedPostgres | None
    broker: Tansu | None
    database_down: bool = False
    topics: Settings | None = None
    """Whose topics to create again after a broker restart (see :meth:`start_broker`)."""
    on_broker_restart: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    """Called once the restarted broker has the run's topics again."""

    @property
    def owns_database(self) -> bool:
        return self.pg is not None

    @property
    def owns_broker(self) -> bool:
        return self.broker is not None

    async def kill_broker(self) -> None:
        if self.broker is not None:
            await asyncio.to_thread(self.broker.stop, True)

    async def start_broker(self) -> None:
        # Same port: every client keeps its bootstrap address.
        if self.broker is not None and self.broker.pid is None:
            await asyncio.to_thread(self.broker.start)
            if self.topics is not None:
                # A real broker keeps its topics through a restart; this one forgets
                # them, so they are provisioned again as an operator would.
                await restore_topics(self.topics)
            for restarted in self.on_broker_restart:
                await restarted()

    async def stop_database(self) -> None:
        if self.pg is not None:
            self.database_down = True
            await asyncio.to_thread(self.pg.stop)

    async def start_database(self) -> None:
        if self.pg is not None and self.database_down:
            await asyncio.to_thread(self.pg.start)
            self.database_down = False

    async def terminate_connections(self) -> int:
        """``pg_terminate_backend`` of every other connection to the run's database."""
        async with await psycopg.AsyncConnection.connect(
            self.database_url, autocommit=True
        ) as conn:
            cur = await conn.execute(
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            row = await cur.fetchone()
        return int(row[0]) if row else 0


@asynccontextmanager
async def infrastructure(
    settings: Settings, work: Path, seed: int
) -> AsyncIterator[Infrastructure]:
    """A migrated database and a broker for one run, removed afterwards."""
    pg: EmbeddedPostgres | None = None
    broker: Tansu | None = None
    created: tuple[str, str] | None = None
    try:
        if settings.database_url is None:
            pg = EmbeddedPostgres(work / "pgdata")
            database_url = await asyncio.to_thread(pg.start)
        else:
            name = f"chaos_{seed}_{os.getpid()}"
            await _admin(settings.database_url, sql.SQL("CREATE DATABASE {}"), name)
            created = (settings.database_url, name)
            database_url = with_database(settings.database_url, name)
        if settings.kafka_bootstrap is None:
            broker = Tansu(log_file=work / "tansu.log")
            kafka_bootstrap = await asyncio.to_thread(broker.start)
        else:
            kafka_bootstrap = settings.kafka_bootstrap
        await migrate.upgrade_async(database_url)
        yield Infrastructure(database_url, kafka_bootstrap, pg, broker)
    finally:
        if broker is not None:
            await asyncio.to_thread(broker.stop, True)
        if pg is not None:
            await asyncio.to_thread(pg.stop)
        if created is not None:
            await _admin(created[0], sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)"), created[1])


async def _admin(url: str, statement: sql.SQL, name: str) -> None:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute(statement.format(sql.Identifier(name)))
