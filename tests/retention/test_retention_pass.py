"""A retention pass on the real database: old terminal calls leave for the archive with
their events, approvals and escalations, readable by DuckDB and by ``archive show``;
what is not finished, still escalated, or still inside its provider's idempotency
window stays; a day of the event log is dropped only once nothing live is in it."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from devtools.registries import capability
from dispatcher.capabilities import CapabilityRegistry
from dispatcher.provider.transport import Transport
from dispatcher.retention.archive import Archive
from dispatcher.retention.crashpoints import crash_points
from dispatcher.retention.policy import RetentionPolicy
from dispatcher.retention.run import PassReport, run_pass
from dispatcher.retention.show import archived_run
from dispatcher.tenancy import provider_key
from tests.fixtures.cli import run_cli
from tests.retention.history import (
    Sessions,
    age,
    archived,
    completed_calls,
    duckdb_rows,
    duplicates,
    inserted,
    live_ids,
    open_escalation,
    partition_names,
    retention_registry,
    run_view_json,
    stop,
)

pytestmark = pytest.mark.postgres

UNFINISHED = ("escalated", "result_unknown", "accepted", "proposed", "authorized", "dispatching")


@pytest.fixture
def archive_root(tmp_path: Path) -> Path:
    return tmp_path / "archive"


@pytest.fixture
def archive(archive_root: Path) -> Archive:
    return Archive(f"file://{archive_root}")


async def one_pass(
    engine: AsyncEngine,
    archive: Archive,
    registry: CapabilityRegistry,
    *,
    now: datetime | None = None,
    by_tenant: dict[str, int] | None = None,
) -> PassReport:
    policy = RetentionPolicy(
        default_days=30,
        days_by_tenant=by_tenant or {},
        windows={c.id: c.reconcile.idempotency_window_seconds for c in registry},
        batch_size=3,
    )
    return await run_pass(
        engine,
        archive,
        policy,
        crash=crash_points(None),
        budget_seconds=120,
        ahead_days=3,
        now=now,
    )


async def test_old_terminal_calls_leave_for_the_archive_and_nothing_live_does(
    engine: AsyncEngine,
    sessions: Sessions,
    http: Transport,
    sandbox: object,
    archive: Archive,
    archive_root: Path,
    database_url: str,
) -> None:
    url = sandbox.url  # type: ignore[attr-defined]
    slow = capability("slow-keys", url, reconcile={"idempotencyWindowSeconds": 90 * 86400})
    registry = CapabilityRegistry({**{c.id: c for c in retention_registry(url)}, "slow-keys": slow})
    old = await completed_calls(sessions, registry, http, run_id="run-old", count=5)
    theirs = await completed_calls(
        sessions, registry, http, run_id="run-x", count=2, tenant="a=b%c"
    )
    before = await run_view_json(sessions, "acme", "run-old")
    stays = {status: await inserted(sessions, status) for status in UNFINISHED}
    stays["open escalation"] = await inserted(sessions, "confirmed")
    await open_escalation(sessions, "acme", stays["open escalation"])
    stays["in its window"] = await inserted(sessions, "completed", capability_id="slow-keys")
    await age(sessions, 40)

    report = await one_pass(engine, archive, registry)

    assert (report.calls, report.batches, report.due) == (7, 3, 0), report.line()
    assert await live_ids(sessions) == {("acme", i) for i in stays.values()}
    calls = archived(archive, "calls")
    assert sorted((c["tenant"], c["tool_call_id"]) for c in calls) == sorted(
        [("acme", i) for i in old] + [("a=b%c", i) for i in theirs]
    )
    # The live rows left the namespaced provider key implied; the archive names it.
    assert [c["provider_key"] for c in calls] == [
        provider_key(c["tenant"], c["idempotency_key"]) for c in calls
    ]
    assert {len(c["request_fingerprint"]) for c in calls} == {32}
    events = archived(archive, "events")
    assert duplicates([e["event_id"] for e in events]) == {}
    assert {e["tool_call_id"] for e in events} == set(old) | set(theirs)
    # DuckDB reads the dataset as it is: tenant and day from the files and the paths.
    by_tenant = duckdb_rows(
        archive_root,
        "SELECT tenant, count(*), count(DISTINCT day) FROM read_parquet("
        "'{root}/**/calls-*.parquet', hive_partitioning = true) GROUP BY tenant ORDER BY tenant",
    )
    assert by_tenant == [("a=b%c", 2, 1), ("acme", 5, 1)]
    # The archived run folds into the view the API served before.
    assert archived_run(archive, "acme", "run-old").model_dump_json(by_alias=True) == before
    shown = run_cli(
        "archive", "show", "run-old", "--tenant", "acme",
        TOOL_DISPATCHER_ARCHIVE_URL=f"file://{archive_root}",
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout) == json.loads(before)
    missing = run_cli(
        "archive", "show", "run-none", "--tenant", "acme",
        TOOL_DISPATCHER_ARCHIVE_URL=f"file://{archive_root}",
    )  # fmt: skip
    assert missing.returncode == 1 and missing.stderr.count("\n") == 1
    # The audit says what left, per tenant and day.
    async with engine.connect() as conn:
        logged = await conn.execute(
            text("SELECT tenant, sum(calls), sum(events_archived) FROM retention_log GROUP BY 1")
        )
        assert {r[0]: r[1] for r in logged} == {"acme": 5, "a=b%c": 2}
        # The runs whose calls all left are no longer summarised (the calls that stay
        # were written straight into the table, past the summaries).
        summarised = await conn.execute(text("SELECT tenant, run_id, calls FROM run_summaries"))
        assert list(summarised) == []
    # And the event log is still append-only for the service's role.
    with psycopg.connect(database_url, autocommit=True) as conn:
        for statement in (
            "UPDATE execution_events SET payload = '{}'",
            "DELETE FROM execution_events",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="append-only"):
                conn.execute(statement)


async def test_a_day_of_events_is_dropped_only_once_nothing_live_is_in_it(
    engine: AsyncEngine,
    sessions: Sessions,
    http: Transport,
    sandbox: object,
    archive: Archive,
) -> None:
    registry = retention_registry(sandbox.url)  # type: ignore[attr-defined]
    done = await completed_calls(sessions, registry, http, run_id="run-1", count=2)
    held = await completed_calls(sessions, registry, http, run_id="run-2", count=1)
    await stop(sessions, registry, "acme", "run-1")
    before = await run_view_json(sessions, "acme", "run-1")
    async with sessions() as session, session.begin():
        await session.execute(
            text("UPDATE tool_calls SET status = 'escalated' WHERE tool_call_id = :c"),
            {"c": held[0]},
        )
    later = datetime.now().astimezone() + timedelta(days=40)
    today = f"execution_events_p{datetime.now().astimezone():%Y%m%d}"

    first = await one_pass(engine, archive, registry, now=later)

    # run-1's calls left; the day still holds run-2's escalated call's events (the
    # empty days around it go).
    assert (first.calls, first.events_dropped) == (2, 0), first.line()
    assert today in await partition_names(sessions)
    async with sessions() as session, session.begin():
        await session.execute(
            text("UPDATE tool_calls SET status = 'confirmed' WHERE tool_call_id = :c"),
            {"c": held[0]},
        )

    second = await one_pass(engine, archive, registry, now=later)

    assert (second.calls, second.days_dropped) == (1, 1), second.line()
    assert today not in await partition_names(sessions)
    events = archived(archive, "events")
    assert duplicates([e["event_id"] for e in events]) == {}
    assert [e["event_type"] for e in events if e["tool_call_id"] is None] == ["run.stopped"]
    assert {e["tool_call_id"] for e in events} == {*done, *held, None}
    assert archived_run(archive, "acme", "run-1").model_dump_json(by_alias=True) == before
    async with engine.connect() as conn:
        dropped = await conn.scalar(text("SELECT sum(events_dropped) FROM retention_log"))
    assert dropped == len(events)
