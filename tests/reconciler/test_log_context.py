"""The lines written while the reconciler looks a call up or sends it again carry
that call's ``tool_call_id``, ``run_id`` and ``capability_id``, each call's own though
a batch's lookups are in flight together (real PostgreSQL, the real sandbox; a lookup
and a provider client that log a line before they send)."""

from __future__ import annotations

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from devtools.registries import registry_of
from devtools.sandbox import SandboxServer
from dispatcher.capabilities import CapabilityRegistry
from dispatcher.provider.transport import Transport
from tests.fixtures.calls import unknown_call
from tests.fixtures.capabilities import reconcile_capability
from tests.fixtures.log_lines import LoggingLookup, LoggingProvider, ids_of, json_lines
from tests.fixtures.reconciling import new_reconciler
from tests.fixtures.sandbox import at_provider

pytestmark = pytest.mark.postgres

Sessions = async_sessionmaker[AsyncSession]


@pytest.fixture
def registry(sandbox: SandboxServer) -> CapabilityRegistry:
    return registry_of(
        reconcile_capability("refund", sandbox.url), reconcile_capability("lookup", sandbox.url)
    )


async def test_the_reconciler_s_lookups_and_re_sends_carry_their_call(
    sessions: Sessions, registry: CapabilityRegistry, sandbox: SandboxServer, http: Transport
) -> None:
    # Never arrived: looked up by key, not found, sent again.
    resent = await unknown_call(
        sessions, registry, http, sandbox.url, "refund", "ctx:resend", {"kind": "drop_before_apply"}
    )
    # Applied, its answer lost: looked up by key, confirmed.
    found = await unknown_call(
        sessions, registry, http, sandbox.url, "lookup", "ctx:found", {"kind": "drop_after_apply"}
    )
    reconciler = new_reconciler(sessions, registry, http)
    reconciler._lookup = LoggingLookup(http)
    reconciler._executor._provider = LoggingProvider(http)

    with json_lines("tests.spy") as lines:
        await reconciler.run_pass()

    by_message = {line["message"]: ids_of(line) for line in lines}
    assert by_message == {
        f"looking up {at_provider('ctx:resend')}": (resent, "run-1", "refund"),
        f"looking up {at_provider('ctx:found')}": (found, "run-1", "lookup"),
        f"sending {resent}": (resent, "run-1", "refund"),
    }
