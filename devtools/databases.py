"""Scratch databases on a PostgreSQL server, for the tests and the benchmarks: each run
gets databases of its own, so runs on one server never see each other's rows."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg import sql
from sqlalchemy.engine import make_url

from dispatcher.db import migrate


def with_database(url: str, database: str) -> str:
    """The same server URL, naming another database (libpq form, no driver)."""
    parsed = make_url(url).set(drivername="postgresql", database=database)
    return parsed.render_as_string(hide_password=False)


def unique_name(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


def create_database(server_url: str, name: str, *, template: str | None = None) -> str:
    """Create ``name`` (a copy of ``template`` if given); returns its URL."""
    statement = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
    if template is not None:
        statement = sql.SQL("{} TEMPLATE {}").format(statement, sql.Identifier(template))
    # CREATE DATABASE cannot run inside a transaction block.
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(statement)
    return with_database(server_url, name)


def drop_database(server_url: str, name: str) -> None:
    """Drop ``name`` even while clients are still connected to it."""
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


@contextmanager
def scratch_database(server_url: str, prefix: str) -> Iterator[str]:
    """A fresh, migrated database for the block; yields its URL and drops it after."""
    name = unique_name(prefix)
    url = create_database(server_url, name)
    try:
        migrate.upgrade(url)
        yield url
    finally:
        drop_database(server_url, name)
