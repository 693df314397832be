"""The async SQLAlchemy engine (psycopg 3)."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine

import telemetry
from dispatcher.db import jsonb
from dispatcher.settings import Settings, to_sqlalchemy_url


def create_engine(settings: Settings) -> AsyncEngine:
    engine = create_async_engine(
        settings.sqlalchemy_url(),
        pool_size=settings.db_pool_size,
        max_overflow=0,
        pool_pre_ping=settings.db_pool_pre_ping,
        json_serializer=jsonb.dumps,
    )
    if settings.traces_db and telemetry.enabled():
        # A CLIENT span per statement through SQLAlchemy (the intake statement goes
        # through psycopg directly, dispatcher.intake.statement, and has none).
        from opentelemetry.instrumentation.sqlalchemy import SQLAlchemyInstrumentor

        SQLAlchemyInstrumentor().instrument(engine=engine.sync_engine)
    return engine


def engine_for(url: str, pool_size: int = 5) -> AsyncEngine:
    return create_async_engine(
        to_sqlalchemy_url(url),
        pool_size=pool_size,
        pool_pre_ping=True,
        json_serializer=jsonb.dumps,
    )


def session_factory(engine: AsyncEngine) -> async_sessionmaker:  # type: ignore[type-arg]
    return async_sessionmaker(engine, expire_on_commit=False)
