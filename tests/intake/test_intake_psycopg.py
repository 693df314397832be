"""Library intake in a caller's own psycopg transaction (``submit(conn, ...)`` with a
psycopg ``AsyncConnection``): the same rows, replays and refusals as in a SQLAlchemy
session, committed or rolled back by the caller, with psycopg's own errors."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from psycopg.types.json import set_json_dumps
from sqlalchemy import func, select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from dispatcher.capabilities import CapabilityRegistry
from dispatcher.control.actor import Actor
from dispatcher.control.runs import stop_run
from dispatcher.db.tables import approvals as approvals_table
from dispatcher.db.tables import execution_events, outbox, tool_calls
from dispatcher.errors import IdempotencyKeyReused, RunStopped
from dispatcher.intake.service import submit, submit_many
from dispatcher.schemas import Submission, SubmitRequest
from tests.intake.test_intake_library import email

pytestmark = pytest.mark.postgres

OPS = Actor("ops", "acme", "test")


@pytest.fixture
async def conn(database_url: str) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """A caller's own connection, not in autocommit: its first statement opens the
    caller's transaction, which the caller commits."""
    connection = await psycopg.AsyncConnection.connect(database_url)
    yield connection
    await connection.close()


async def _counts(engine: AsyncEngine) -> dict[str, int]:
    async with engine.connect() as c:
        return {
            t.name: (await c.execute(select(func.count()).select_from(t))).scalar_one()
            for t in (tool_calls, execution_events, outbox)
        }


NOTHING = {"tool_calls": 0, "execution_events": 0, "outbox": 0}
ONE_CALL = {"tool_calls": 1, "execution_events": 2, "outbox": 3}


async def test_the_domain_write_and_the_submission_commit_together(
    conn: psycopg.AsyncConnection[Any], engine: AsyncEngine, registry: CapabilityRegistry
) -> None:
    await conn.execute("CREATE TABLE orders (order_id text PRIMARY KEY)")
    await conn.commit()

    await conn.execute("INSERT INTO orders VALUES ('o-1')")
    submission = await submit(conn, email(), tenant="acme", registry=registry)
    assert submission.created and submission.view.status == "authorized"
    assert await _counts(engine) == NOTHING  # nobody sees it before the caller commits
    await conn.commit()

    assert await _counts(engine) == ONE_CALL
    assert await (await conn.execute("SELECT order_id FROM orders")).fetchall() == [("o-1",)]
    row = await (
        await conn.execute(
            "SELECT tool_call_id, status, idempotency_key FROM tool_calls WHERE tenant = 'acme'"
        )
    ).fetchone()
    assert row == (submission.view.tool_call_id, "authorized", "email-1")


async def test_a_rollback_discards_the_submission(
    conn: psycopg.AsyncConnection[Any], engine: AsyncEngine, registry: CapabilityRegistry
) -> None:
    assert (await submit(conn, email(), tenant="acme", registry=registry)).created
    await conn.rollback()

    assert await _counts(engine) == NOTHING


async def test_a_call_recorded_in_a_session_replays_on_a_connection(
    conn: psycopg.AsyncConnection[Any],
    engine: AsyncEngine,
    sessions: async_sessionmaker[AsyncSession],
    registry: CapabilityRegistry,
) -> None:
    # Recorded through a session, replayed and refused through a psycopg connection.
    async with sessions() as session, session.begin():
        first = await submit(session, email(), tenant="acme", registry=registry)
    approval = SubmitRequest(
        run_id="run-1",
        capability_id="refund-order-approved",
        input={"orderId": "o-9", "amountCents": 900_000},
        idempotency_key="refund-9",
    )
    asked = await submit(conn, approval, tenant="acme", registry=registry)
    await conn.commit()

    again, refused, asked_again = await submit_many(
        conn,
        [(email(), "acme"), (email(to="eve@example.com"), "acme"), (approval, "acme")],
        registry=registry,
    )
    await conn.commit()

    assert isinstance(again, type(first)) and not again.created and again.view == first.view
    assert isinstance(refused, IdempotencyKeyReused)
    assert isinstance(asked_again, type(asked)) and not asked_again.created
    assert asked_again.view == asked.view and asked.view.approval is not None
    assert (await _counts(engine))["tool_calls"] == 2


async def test_a_stopped_run_refuses_a_psycopg_callers_call(
    conn: psycopg.AsyncConnection[Any],
    sessions: async_sessionmaker[AsyncSession],
    registry: CapabilityRegistry,
) -> None:
    async with sessions() as session, session.begin():
        await stop_run(
            session, tenant="acme", run_id="run-1", actor=OPS, reason="", registry=registry
        )
    with pytest.raises(RunStopped):
        await submit(conn, email(), tenant="acme", registry=registry)


async def test_the_callers_json_settings_do_not_change_what_is_written(
    conn: psycopg.AsyncConnection[Any], engine: AsyncEngine, registry: CapabilityRegistry
) -> None:
    def refuse(value: Any) -> str:
        raise AssertionError("intake encoded a parameter with the connection's dumps")

    set_json_dumps(refuse, conn)
    await submit(conn, email(), tenant="acme", registry=registry)
    await conn.commit()

    assert await _counts(engine) == ONE_CALL


async def test_errors_come_as_each_callers_own_kind(
    conn: psycopg.AsyncConnection[Any],
    sessions: async_sessionmaker[AsyncSession],
    registry: CapabilityRegistry,
) -> None:
    # A transaction the caller already broke: intake's statement is refused in it.
    with pytest.raises(psycopg.errors.UndefinedTable):
        await conn.execute("SELECT * FROM nowhere")
    with pytest.raises(psycopg.errors.InFailedSqlTransaction):
        await submit(conn, email(), tenant="acme", registry=registry)

    async with sessions() as session:
        with pytest.raises(DBAPIError):
            await session.execute(select(func.count()).select_from(func.nowhere()))
        with pytest.raises(DBAPIError) as info:
            await submit(session, email(), tenant="acme", registry=registry)
    assert isinstance(info.value.orig, psycopg.errors.InFailedSqlTransaction)


async def test_a_connection_of_another_kind_is_refused_before_anything_is_sent(
    database_url: str, engine: AsyncEngine, registry: CapabilityRegistry
) -> None:
    with psycopg.connect(database_url) as sync_conn:
        with pytest.raises(TypeError, match="AsyncSession or a psycopg AsyncConnection"):
            await submit(sync_conn, email(), tenant="acme", registry=registry)  # type: ignore[arg-type]
        assert sync_conn.info.transaction_status is psycopg.pq.TransactionStatus.IDLE
    assert await _counts(engine) == NOTHING


async def test_the_intake_statement_is_parsed_once_per_process(
    conn: psycopg.AsyncConnection[Any], registry: CapabilityRegistry
) -> None:
    """psycopg converts a statement's placeholders through a cache that refuses texts
    over 4,096 characters; a statement outside it is re-parsed on every execute (11%
    of a call's client instructions). The second submission's statement is a hit."""
    from psycopg import _queries

    await submit(conn, email("parsed-1"), tenant="acme", registry=registry)
    await conn.commit()
    before = _queries._query2pg.cache_info()
    await submit(conn, email("parsed-2"), tenant="acme", registry=registry)
    after = _queries._query2pg.cache_info()
    await conn.commit()

    assert (after.hits - before.hits, after.misses - before.misses) == (1, 0)


async def test_the_run_guard_keeps_one_plan_and_leaves_the_callers_alone(
    conn: psycopg.AsyncConnection[Any], registry: CapabilityRegistry
) -> None:
    """The run guard's read (``stopped_runs_locked``) was planned again on every call,
    a sixth of the server's CPU per submission: the function forces its generic plan.
    A setting of the function's own, restored when it returns: the caller's session
    keeps the plan_cache_mode it had."""
    await submit(conn, email("guarded"), tenant="acme", registry=registry)
    mode = await (await conn.execute("SHOW plan_cache_mode")).fetchone()
    config = await (
        await conn.execute("SELECT proconfig FROM pg_proc WHERE proname = 'stopped_runs_locked'")
    ).fetchone()
    await conn.commit()

    assert mode == ("auto",)
    assert config == (["plan_cache_mode=force_generic_plan"],)


def test_both_intake_statements_fit_the_parse_cache() -> None:
    """With and without the approvals' INSERT, and with the count of the runs'
    summaries, each statement is under the cache's limit, with room to spare."""
    from psycopg import _queries

    from dispatcher.intake.statement import _INTAKE_SQL

    limit = _queries.MAX_CACHED_STATEMENT_LENGTH
    assert limit == 4096
    assert {approvals: len(sql) < limit - 100 for approvals, sql in _INTAKE_SQL.items()} == {
        True: True,
        False: True,
    }, {approvals: len(sql) for approvals, sql in _INTAKE_SQL.items()}


def _approved_refund(order: str) -> SubmitRequest:
    return SubmitRequest(
        run_id="run-1",
        capability_id="refund-order-approved",
        input={"orderId": order, "amountCents": 900_000},
    )


async def _prepared_intakes(conn: psycopg.AsyncConnection[Any]) -> list[bool]:
    """Whether each intake statement this connection prepared inserts approvals."""
    rows = await (
        await conn.execute(
            "SELECT statement FROM pg_prepared_statements"
            " WHERE statement LIKE 'WITH stopped%' ORDER BY prepare_time"
        )
    ).fetchall()
    return ["INSERT INTO approvals" in statement for (statement,) in rows]


async def test_a_batch_without_approvals_goes_without_their_insert(
    conn: psycopg.AsyncConnection[Any], engine: AsyncEngine, registry: CapabilityRegistry
) -> None:
    """The approvals' INSERT costs PostgreSQL about 4% of a call even when it has no
    rows: a batch that asks for no approval is written by the statement without it,
    and one that does (with calls that do not beside it) by the whole one."""
    await submit(conn, email("plain-1"), tenant="acme", registry=registry)
    await conn.commit()
    assert await _prepared_intakes(conn) == [False]

    mixed = [email("plain-2"), _approved_refund("o-1"), email("plain-3")]
    results = await submit_many(conn, [(r, "acme") for r in mixed], registry=registry)
    await conn.commit()

    views = [r.view for r in results if isinstance(r, Submission)]
    assert [v.status for v in views] == ["authorized", "proposed", "authorized"]
    assert await _prepared_intakes(conn) == [False, True]
    async with engine.connect() as c:
        approvals = (await c.execute(select(func.count()).select_from(approvals_table))).scalar()
    assert approvals == 1
