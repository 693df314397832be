"""A history for retention to work on: calls through the real intake and the real
worker path (against the sandbox), each with its real events, or inserted straight in
a state; aged by moving their clocks back; and the archive read back, by pyarrow and by
DuckDB, to count what it holds."""

from __future__ import annotations

import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import duckdb
from sqlalchemy import func, insert, select, text, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from devtools.registries import capability
from dispatcher.capabilities import CapabilityRegistry
from dispatcher.control.actor import Actor
from dispatcher.control.runs import stop_run
from dispatcher.db.tables import escalations, tool_calls
from dispatcher.intake.service import submit
from dispatcher.provider.client import ProviderClient
from dispatcher.provider.transport import Transport
from dispatcher.retention.archive import Archive
from dispatcher.schemas import SubmitRequest
from dispatcher.settings import Topics
from dispatcher.views.run_view import load_run_view
from dispatcher.worker.executor import Executor

Sessions = async_sessionmaker[AsyncSession]
DAY = 86400


def retention_registry(sandbox_url: str, window_seconds: float = 3600) -> CapabilityRegistry:
    """``refund``: side effects, a provider keeping keys ``window_seconds``."""
    refund = capability(
        "refund", sandbox_url, reconcile={"idempotencyWindowSeconds": window_seconds}
    )
    return CapabilityRegistry({refund.id: refund})


async def completed_calls(
    sessions: Sessions,
    registry: CapabilityRegistry,
    http: Transport,
    *,
    run_id: str,
    count: int,
    tenant: str = "acme",
) -> list[str]:
    """``count`` calls submitted through intake and completed by the worker path."""
    ids = []
    async with sessions() as session, session.begin():
        for n in range(count):
            submitted = await submit(
                session,
                SubmitRequest(
                    run_id=run_id, capability_id="refund", input={"n": n}, idempotency_key=None
                ),
                tenant=tenant,
                registry=registry,
            )
            ids.append(submitted.view.tool_call_id)
    executor = Executor(
        sessions, registry, ProviderClient(http), worker_id="retention-test", topics=Topics()
    )
    done = await executor.execute_many([(tenant, i) for i in ids])
    assert {s.value if s else None for s in done.values()} == {"completed"}, done
    return ids


async def inserted(
    sessions: Sessions,
    status: str,
    *,
    tenant: str = "acme",
    run_id: str = "run-live",
    **values: Any,
) -> str:
    """A call in ``status`` written straight into the table (no events)."""
    call_id = f"tc-{uuid.uuid4().hex[:12]}"
    row = {
        "tool_call_id": call_id,
        "tenant": tenant,
        "run_id": run_id,
        "capability_id": "refund",
        "input": {"n": 1},
        "idempotency_key": f"key-{call_id}",
        "provider_key": f"key-{call_id}",
        "request_fingerprint": b"direct",
        "status": status,
        **values,
    }
    async with sessions() as session, session.begin():
        await session.execute(insert(tool_calls).values(row))
    return call_id


async def open_escalation(sessions: Sessions, tenant: str, call_id: str) -> None:
    async with sessions() as session, session.begin():
        await session.execute(
            insert(escalations).values(
                escalation_id=f"esc-{call_id}",
                tool_call_id=call_id,
                tenant=tenant,
                episode=1,
                reason="lookups failed",
                evidence={},
            )
        )


async def stop(sessions: Sessions, registry: CapabilityRegistry, tenant: str, run_id: str) -> None:
    """The run stopped: a run-level event (``run.stopped``)."""
    async with sessions() as session, session.begin():
        await stop_run(
            session,
            tenant=tenant,
            run_id=run_id,
            actor=Actor(name="ops", tenant=tenant, via="test"),
            reason="done",
            registry=registry,
        )


async def age(sessions: Sessions, days: float, *, dispatched_days: float | None = None) -> None:
    """Every call last changed (and was created, and dispatched) ``days`` ago."""
    ago = func.make_interval(0, 0, 0, days)
    sent = func.make_interval(0, 0, 0, days if dispatched_days is None else dispatched_days)
    async with sessions() as session, session.begin():
        await session.execute(
            update(tool_calls).values(
                updated_at=func.now() - ago,
                created_at=func.now() - ago,
                dispatched_at=func.now() - sent,
            )
        )


async def live_ids(sessions: Sessions) -> set[tuple[str, str]]:
    async with sessions() as session:
        rows = await session.execute(select(tool_calls.c.tenant, tool_calls.c.tool_call_id))
        return {(r.tenant, r.tool_call_id) for r in rows}


async def run_view_json(sessions: Sessions, tenant: str, run_id: str) -> str:
    async with sessions() as session:
        return (await load_run_view(session, tenant, run_id)).model_dump_json(by_alias=True)


def archived(archive: Archive, table: str) -> list[dict[str, Any]]:
    """Every row of ``table`` in the archive, every tenant's, read as `archive show`
    reads its files (:meth:`Archive.read`)."""
    archive.fs.invalidate_cache()  # s3fs lists from its cache: another process wrote
    paths = archive.fs.glob(f"{archive.root}/**/{table}-*.parquet")
    rows: list[dict[str, Any]] = archive.read(paths).to_pylist()
    return rows


def duckdb_rows(root: Path, query: str) -> list[tuple[Any, ...]]:
    """``query`` over the local archive at ``root``, ``{root}`` in it replaced."""
    return duckdb.sql(query.replace("{root}", str(root))).fetchall()


def duplicates(values: list[Any]) -> dict[Any, int]:
    return {v: n for v, n in Counter(values).items() if n > 1}


async def partition_names(sessions: Sessions) -> set[str]:
    async with sessions() as session:
        rows = await session.execute(
            text(
                "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
                " WHERE i.inhparent = 'execution_events'::regclass"
            )
        )
        return set(rows.scalars())


async def past_run(sessions: Sessions, *, tenant: str = "acme", calls: int = 2) -> list[str]:
    """A stopped run of ``calls`` finished calls, all of it 40 days old, events included
    (written straight into the log, so they land in a day that has no partition yet)."""
    ids = [
        await inserted(sessions, "completed", tenant=tenant, run_id="run-past")
        for _ in range(calls)
    ]
    event = (
        "INSERT INTO execution_events (event_id, event_type, tenant, run_id, producer,"
        " tool_call_id, capability_id, schema_version, occurred_at, payload)"
        " VALUES (:id, :type, :tenant, 'run-past', 'tool-dispatcher.worker', :call, :cap, 1,"
        " now() - interval '40 days', CAST(:payload AS jsonb))"
    )
    async with sessions() as session, session.begin():
        for call in ids:
            for kind, to in (
                ("tool.call.requested", "proposed"),
                ("tool.call.completed", "completed"),
            ):
                await session.execute(
                    text(event),
                    {"id": f"evt-{uuid.uuid4().hex}", "type": kind, "tenant": tenant,
                     "call": call, "cap": "refund", "payload": f'{{"to": "{to}"}}'},
                )  # fmt: skip
        await session.execute(
            text(event),
            {"id": f"evt-{uuid.uuid4().hex}", "type": "run.stopped", "tenant": tenant,
             "call": None, "cap": None, "payload": '{"reason": "done"}'},
        )  # fmt: skip
        await session.execute(
            text(
                "UPDATE tool_calls SET updated_at = now() - interval '40 days',"
                " created_at = now() - interval '40 days' WHERE run_id = 'run-past'"
            )
        )
    return ids


async def assert_each_call_once(
    sessions: Sessions, archive: Archive, everything: set[tuple[str, str]], *, settled: bool = True
) -> None:
    """Every call is in the archive or live, never twice in the archive; once a pass
    ended (``settled``) never in both. The archive holds no row twice, and every event
    of an archived call."""
    live = await live_ids(sessions)
    calls = archived(archive, "calls")
    gone = [(c["tenant"], c["tool_call_id"]) for c in calls]
    assert duplicates(gone) == {}
    assert set(gone) | live == everything
    if settled:
        assert set(gone) & live == set()
    events = archived(archive, "events")
    assert duplicates([e["event_id"] for e in events]) == {}
    async with sessions() as session:
        stored = await session.execute(
            text("SELECT tenant, tool_call_id, count(*) FROM execution_events GROUP BY 1, 2")
        )
        counts = {(r[0], r[1]): r[2] for r in stored}
    kept = Counter((e["tenant"], e["tool_call_id"]) for e in events if e["tool_call_id"])
    for call in gone:
        # Archived with the call, whether or not its day is still in the database.
        assert kept[call] >= counts.get(call, 0) and kept[call] > 0, call
