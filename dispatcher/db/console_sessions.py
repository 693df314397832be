"""The ``console_sessions`` table: the console's signed-in sessions
(:mod:`dispatcher.console.session_rows`). A session is live while its row is, so
signing out on one API replica ends it on all of them. Expired rows are deleted a
bounded batch at a time, oldest first, at each sign-in and out."""

from __future__ import annotations

from sqlalchemy import Column, DateTime, Index, MetaData, Table, Text, func


def console_sessions_table(metadata: MetaData) -> Table:
    return Table(
        "console_sessions",
        metadata,
        # The SHA-256 of the cookie's session id, never the id itself.
        Column("session_hash", Text, primary_key=True),
        Column("key_hash", Text, nullable=False),
        Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
        Column("expires_at", DateTime(timezone=True), nullable=False),
        Index("ix_console_sessions_expires_at", "expires_at"),
    )
