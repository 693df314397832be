"""No secret reaches a webhook or a log line: not a subscription's signing secret, not a
token in its URL, not an API key, not a provider credential, not what a call's input
or an escalation's evidence holds (the secret canary of
tests/worker/test_provider_credentials.py and tests/process/test_json_logs.py, for
webhooks). Failures are included: their log lines are where a URL or a body would leak.

The sender runs in the test (caplog at DEBUG, every logger) and as the real
``tool-dispatcher webhooks --once`` process (JSON logs at DEBUG), against real receivers."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.capabilities import CapabilityRegistry
from dispatcher.control.escalations import escalate
from dispatcher.db.tables import webhook_deliveries
from dispatcher.ledger.messages import Producer
from dispatcher.settings import ApiKey, hash_api_key
from dispatcher.states import ExecutionStatus as S
from dispatcher.webhooks import notify
from tests.fixtures.calls import insert_unknown_calls, submit_call
from tests.fixtures.capabilities import approval_capability, plain_capability
from tests.fixtures.cli import run_cli
from tests.fixtures.waiting import eventually
from tests.webhooks.conftest import FAST, sending, webhook_settings
from tests.webhooks.receiver import Receiver, new_secret

pytestmark = pytest.mark.postgres

PROVIDER = "sk_live_webhook-canary-5e1d"
API_KEY = "tdk_webhook_canary_key_0b7c"
URL_TOKEN = "urltoken-canary-93af"
EVENTS = ["escalation.opened", "approval.pending", "breaker.opened", "dead_letter.written"]


@pytest.fixture
def registry() -> CapabilityRegistry:
    caps = [approval_capability("refund-big"), plain_capability("refund-order-v2")]
    return CapabilityRegistry({c.id: c for c in caps})


async def _facts(sessions: async_sessionmaker[AsyncSession], registry: CapabilityRegistry) -> None:
    """An escalation whose evidence, and an approval whose call's input, hold the canary."""
    [call] = await insert_unknown_calls(sessions, ["k-1"], "refund-order-v2")
    async with sessions() as session, session.begin():
        await escalate(
            session,
            call,
            tenant="acme",
            expected=S.RESULT_UNKNOWN,
            reason="lookups kept timing out",
            evidence={"request": {"authorization": f"Bearer {PROVIDER}"}},
            producer=Producer.RECONCILER,
        )
        await notify(session, event_type="breaker.opened", tenant=None, data={"c": "refund"})
    await submit_call(sessions, registry, "refund-big", {"note": PROVIDER}, key="k-2")


def _subscriptions(good: Receiver, down_port: int) -> list[dict[str, object]]:
    return [
        {"id": "ops", "tenant": "acme", "url": f"{good.url}?token={URL_TOKEN}", "events": EVENTS},
        # A receiver that is not there: its failures are logged too.
        {
            "id": "gone",
            "tenant": "acme",
            "url": f"http://127.0.0.1:{down_port}/hook?token={URL_TOKEN}",
            "events": EVENTS,
        },
    ]


def _canaries(*signing: str) -> list[str]:
    return [PROVIDER, API_KEY, URL_TOKEN, "Bearer", *signing, *(s[6:] for s in signing)]


async def test_no_secret_in_any_payload_or_log_line_of_the_sender(
    database_url: str,
    sessions: async_sessionmaker[AsyncSession],
    registry: CapabilityRegistry,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    async with Receiver(new_secret()) as good, Receiver(new_secret()) as gone:
        await gone.down()
        gone_secret = new_secret()
        settings = webhook_settings(
            database_url,
            _subscriptions(good, gone.port),
            {"ops": good.secret, "gone": gone_secret},
            max_attempts=2,
        ).model_copy(
            update={
                "provider_secrets": {"refund-order-v2": PROVIDER},
                "api_keys": [ApiKey(sha256=hash_api_key(API_KEY), tenant="acme")],
            }
        )
        await _facts(sessions, registry)
        good.answer = 500  # a failed attempt first: its log line is checked too
        async with sending(settings):
            await eventually(lambda: _true(len(good.seen) >= 1), what="a failed attempt")
            good.answer = 0
            await eventually(lambda: _true(len(good.accepted) == 3), what="three deliveries")
            await eventually(lambda: _dead(sessions, 3), what="the gone receiver's dead ones")
    assert {r.payload["type"] for r in good.accepted} == {
        "escalation.opened", "approval.pending", "breaker.opened",
    }  # fmt: skip
    assert "webhook delivery" in caplog.text, "the sender's lines were captured"
    sent = [r.raw.decode() + json.dumps(r.headers) for r in good.accepted]
    for canary in _canaries(good.secret, gone_secret):
        assert canary not in caplog.text, canary
        assert all(canary not in text for text in sent), canary
        assert canary not in await _stored_bodies(sessions), canary


async def test_no_secret_in_the_sender_process_output(
    database_url: str,
    sessions: async_sessionmaker[AsyncSession],
    registry: CapabilityRegistry,
    tmp_path: Path,
) -> None:
    async with Receiver(new_secret()) as good, Receiver(new_secret()) as gone:
        await gone.down()
        secrets = tmp_path / "secrets"
        secrets.mkdir()
        (secrets / "ops").write_text(good.secret + "\n")
        (secrets / "gone").write_text(new_secret())
        env = {
            "TOOL_DISPATCHER_DATABASE_URL": database_url,
            "TOOL_DISPATCHER_LOG_FORMAT": "json",
            "TOOL_DISPATCHER_LOG_LEVEL": "DEBUG",
            "TOOL_DISPATCHER_EVENT_LOOP": "asyncio",
            "TOOL_DISPATCHER_PROVIDER_SECRETS": json.dumps({"refund-order-v2": PROVIDER}),
            "TOOL_DISPATCHER_API_KEYS": json.dumps(
                [{"sha256": hash_api_key(API_KEY), "tenant": "acme"}]
            ),
            "TOOL_DISPATCHER_WEBHOOKS__SUBSCRIPTIONS": json.dumps(_subscriptions(good, gone.port)),
            "TOOL_DISPATCHER_WEBHOOKS__SECRETS_DIR": str(secrets),
            **{f"TOOL_DISPATCHER_WEBHOOKS__{k.upper()}": str(v) for k, v in FAST.items()},
        }
        await _facts(sessions, registry)
        # The receiver runs in this event loop: the process is waited for in a thread.
        done = await asyncio.to_thread(run_cli, "webhooks", "--once", **env)
    assert done.returncode == 0, done.stderr
    assert len(good.accepted) == 3 and good.refused == []
    assert '"webhook delivery' in done.stderr, "the sender's lines were captured"
    output = done.stdout + done.stderr
    for canary in _canaries(good.secret, (secrets / "gone").read_text()):
        assert canary not in output, canary


async def _stored_bodies(sessions: async_sessionmaker[AsyncSession]) -> str:
    async with sessions() as session:
        return "".join(await session.scalars(select(webhook_deliveries.c.body)))


async def _dead(sessions: async_sessionmaker[AsyncSession], count: int) -> bool:
    async with sessions() as session:
        found = await session.scalars(
            select(webhook_deliveries.c.status).where(webhook_deliveries.c.status == "dead")
        )
        return len(list(found)) == count


async def _true(value: object) -> bool:
    return bool(value)
