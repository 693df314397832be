"""Schema migrations (Alembic), callable from the CLI, `up` and the tests."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, pool

from dispatcher.settings import to_sqlalchemy_url

MIGRATIONS_DIR = Path(__file__).parent / "migrations"


def alembic_config(database_url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", to_sqlalchemy_url(database_url).replace("%", "%%"))
    return cfg


def _run(database_url: str, action: str, revision: str) -> None:
    cfg = alembic_config(database_url)
    engine = create_engine(to_sqlalchemy_url(database_url), poolclass=pool.NullPool)
    try:
        with engine.begin() as connection:
            cfg.attributes["connection"] = connection
            getattr(command, action)(cfg, revision)
    finally:
        engine.dispose()


def upgrade(database_url: str, revision: str = "head") -> None:
    _run(database_url, "upgrade", revision)


def downgrade(database_url: str, revision: str = "base") -> None:
    _run(database_url, "downgrade", revision)


def schema_state(database_url: str) -> tuple[str | None, str | None, bool]:
    """The database's revision, this code's head, and whether the revision is one this
    code knows (read without changing anything; no ``alembic_version`` table is
    ``None``). An unknown revision is a newer release's: expand-then-contract keeps
    the schema it left usable by this one."""
    # A check is a gate run before every pod starts: its answer is its exit code (and a
    # line when it says no), not Alembic's chatter about its dialect.
    logging.getLogger("alembic.runtime.migration").setLevel(logging.WARNING)
    scripts = ScriptDirectory.from_config(alembic_config(database_url))
    engine = create_engine(to_sqlalchemy_url(database_url), poolclass=pool.NullPool)
    try:
        with engine.connect() as connection:
            current = MigrationContext.configure(connection).get_current_revision()
    finally:
        engine.dispose()
    known = current is None or current in {s.revision for s in scripts.walk_revisions()}
    return current, scripts.get_current_head(), known


async def upgrade_async(database_url: str, revision: str = "head") -> None:
    await asyncio.to_thread(upgrade, database_url, revision)
