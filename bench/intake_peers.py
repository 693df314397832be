"""The outbox library a Python user would otherwise pick, measured as ``bench.intake``
measures the library: faststream-outbox 0.19's ``OutboxBroker.publish(body, queue=...,
session=session)`` in the caller's ``AsyncSession`` (the same engine settings and pool
size), one transaction per call.

It writes less than ``submit()``: one outbox row holding the request's JSON, against
intake's call row, its two events and its outbox rows (and the idempotency check). What
the ratio says is what a producer pays per submission for either, in its own session.
"""

from __future__ import annotations

from typing import Any

import psutil  # type: ignore[import-untyped]
from sqlalchemy import MetaData
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from bench.harness import Call, Cell, drive, postgres_meter
from bench.intake_rows import CAPABILITY, INPUT
from dispatcher.db.engine import session_factory

QUEUE = "tool-calls"


def faststream_client(broker: Any, sessions: async_sessionmaker[AsyncSession], run: str) -> Call:
    """One client's call: the submission as one faststream-outbox row, in a transaction
    of its own on the caller's session."""
    body = {"runId": run, "capabilityId": CAPABILITY, "input": INPUT}

    async def call() -> None:
        async with sessions() as session, session.begin():
            await broker.publish(body, queue=QUEUE, session=session)

    return call


async def run_faststream(url: str, clients: int, seconds: float, warmup: float) -> Cell:
    # Imported here: bench.intake_modes imports this module (and its engine is the one
    # to share); faststream-outbox is the bench extra's, not the test extra's, and the
    # benchmarks' own tests import bench.intake_modes.
    from faststream_outbox import OutboxBroker, make_outbox_table

    from bench.intake_modes import library_engine

    engine = library_engine(url, clients)
    metadata = MetaData()
    table = make_outbox_table(metadata, table_name="faststream_outbox")
    async with engine.begin() as conn:
        await conn.run_sync(metadata.create_all)
    broker = OutboxBroker(engine, outbox_table=table)
    sessions = session_factory(engine)
    try:
        return await drive(
            Cell("faststream", clients),
            [faststream_client(broker, sessions, f"run-{i}") for i in range(clients)],
            seconds=seconds,
            warmup=warmup,
            cpu=postgres_meter(url, client=psutil.Process()),
        )
    finally:
        await engine.dispose()
