"""Hostile load: hypothesis draws hostile submissions (every kind of
:mod:`devtools.hostile`, around text from all of Unicode, invalid JSON
included) and hostile path ids, sent concurrently with valid submissions whose inputs
carry arbitrary Unicode, against the real API (uvicorn) and a real PostgreSQL.

Each example must end with: every valid submission 201 with exactly one dispatch
command in the outbox; every hostile request a 4xx problem+json; and no other row
changed (every row present before is unchanged, and the only new calls are the
valid ones).

The server runs in a thread with a loop of its own, so hypothesis can drive each
example synchronously (``asyncio.run``) without sharing the test's event loop.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from devtools.embedded import free_port
from devtools.hostile import KINDS, hostile_body, hostile_path_id, valid_body
from dispatcher.api.server import api_server
from dispatcher.capabilities import CapabilityRegistry
from dispatcher.db.engine import engine_for
from dispatcher.db.tables import approvals, execution_events, outbox, tool_calls
from dispatcher.settings import Settings
from dispatcher.tenancy import ordering_key
from tests.fixtures.api import ALICE, bearer, control_keys
from tests.fixtures.capabilities import approval_capability, plain_capability

pytestmark = pytest.mark.postgres

PLAIN, NEEDS_APPROVAL = "send", "refund-big"
TABLES = {
    tool_calls: "tool_call_id",
    execution_events: "event_id",
    outbox: "id",
    approvals: "approval_id",
}


@pytest.fixture
def registry() -> CapabilityRegistry:
    caps = [plain_capability(PLAIN), approval_capability(NEEDS_APPROVAL)]
    return CapabilityRegistry({c.id: c for c in caps})


@contextmanager
def api_in_thread(settings: Settings, registry: CapabilityRegistry) -> Iterator[str]:
    port = free_port(settings.http_host)
    server = api_server(settings, registry, port=port, install_signal_handlers=False)
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    try:
        while not server.started:  # the server's own flag, not a guessed time
            assert thread.is_alive(), "the API server stopped while starting"
            time.sleep(0.01)
        yield f"http://{settings.http_host}:{port}"
    finally:
        server.should_exit = True
        thread.join()


async def rows(engine: AsyncEngine) -> dict[str, dict[Any, dict[str, Any]]]:
    async with engine.connect() as conn:
        return {
            table.name: {
                r._mapping[key]: dict(r._mapping) for r in await conn.execute(select(table))
            }
            for table, key in TABLES.items()
        }


async def one_round(
    base_url: str, database_url: str, seed: int, kinds: list[str], texts: list[str]
) -> list[str]:
    """Send one example's requests concurrently; what went wrong, described."""
    rng = random.Random(seed)
    # Unique per example, even when hypothesis draws the same seed again.
    tag = f"{seed}-{uuid.uuid4().hex[:8]}"
    valid = {
        f"valid-{tag}-{i}": valid_body(
            f"{tag}-{i}", capability_id=PLAIN, run_id=f"run-{tag}", text=text
        )
        for i, text in enumerate(texts)
    }
    hostile = [
        hostile_body(
            rng,
            f"{tag}-{i}",
            capability_id=rng.choice([PLAIN, NEEDS_APPROVAL]),
            run_id=f"run-{tag}",
            kind=kind,
            text=texts[i % len(texts)],
        )
        for i, kind in enumerate(kinds)
    ]
    paths = [quote(hostile_path_id(rng, t), safe="") for t in texts[:2]]
    engine = engine_for(database_url)
    problems: list[str] = []
    try:
        before = await rows(engine)
        async with httpx.AsyncClient(base_url=base_url, headers=bearer(ALICE)) as client:
            headers = {"Content-Type": "application/json"}

            def post(raw: bytes) -> Any:
                return client.post("/v1/tool-calls", content=raw, headers=headers)

            answers = await asyncio.gather(
                *(post(raw) for raw in valid.values()),
                *(post(h.body) for h in hostile),
                *(client.get(f"/v1/tool-calls/{p}") for p in paths),
                return_exceptions=True,
            )
        after = await rows(engine)
    finally:
        await engine.dispose()

    valid_answers, rest = answers[: len(valid)], answers[len(valid) :]
    for call_id, answer in zip(valid, valid_answers, strict=True):
        if not isinstance(answer, httpx.Response) or answer.status_code != 201:
            problems.append(f"valid {call_id}: {_shown(answer)}")
    labels = [f"hostile {h.kind} {h.body[:120]!r}" for h in hostile]
    labels += [f"hostile path {p}" for p in paths]
    for label, answer in zip(labels, rest, strict=True):
        if not (
            isinstance(answer, httpx.Response)
            and 400 <= answer.status_code < 500
            and answer.headers.get("content-type", "").startswith("application/problem+json")
            and isinstance(answer.json().get("code"), str)
        ):
            problems.append(f"{label}: {_shown(answer)}")

    for table, old in before.items():
        changed = [k for k, row in old.items() if after[table].get(k) != row]
        if changed:
            problems.append(f"{table}: rows of earlier calls changed: {changed[:5]}")
    new_calls = set(after["tool_calls"]) - set(before["tool_calls"])
    if new_calls != set(valid):
        problems.append(f"new calls {sorted(new_calls ^ set(valid))[:5]} beyond the valid ones")
    commands = [
        r["key"]
        for k, r in after["outbox"].items()
        if k not in before["outbox"] and r["topic"].endswith(".commands")
    ]
    # Alice submits as acme: each command is keyed by acme's call.
    if sorted(commands) != sorted(ordering_key("acme", call_id) for call_id in valid):
        problems.append(f"dispatch commands {sorted(commands)[:8]} for {sorted(valid)[:8]}")
    return problems


def _shown(answer: object) -> str:
    if isinstance(answer, httpx.Response):
        return f"{answer.status_code} {answer.text[:160]}"
    return repr(answer)


# All of Unicode, surrogates (category Cs, excluded by default) included.
unicode_text = st.text(st.characters(exclude_categories=()), max_size=24)


def test_hostile_submissions_never_hurt_valid_ones(
    api_settings: Settings, registry: CapabilityRegistry, database_url: str
) -> None:
    settings_ = api_settings.model_copy(update={"api_keys": control_keys()})
    with api_in_thread(settings_, registry) as base_url:

        @settings(
            max_examples=60,
            deadline=None,
            # No shrinking: it would re-run the API round trips for minutes, and the
            # failure already lists every request that was answered wrong.
            phases=[Phase.explicit, Phase.reuse, Phase.generate],
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        )
        @given(
            seed=st.integers(0, 2**32 - 1),
            kinds=st.lists(st.sampled_from(KINDS), min_size=1, max_size=10),
            texts=st.lists(unicode_text, min_size=1, max_size=6),
        )
        def example(seed: int, kinds: list[str], texts: list[str]) -> None:
            problems = asyncio.run(one_round(base_url, database_url, seed, kinds, texts))
            assert not problems, "\n".join(problems)

        example()
