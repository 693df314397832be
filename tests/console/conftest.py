"""One real stack for the console's browser tests: the API (console included), a
worker, the relay, the reconciler loop and the approvals sweeper as processes, on a
database of their own, the session's broker and an in-process sandbox provider.

Started once for the folder (each start costs seconds of a 2-core machine); tests keep
out of each other's way with run ids and idempotency keys of their own, and only the
escalation test makes escalations, so the counts it reads are its own."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import httpx
import pytest
import pytest_asyncio

from devtools.databases import create_database, drop_database, unique_name
from devtools.embedded import free_port, wait_for_port
from devtools.sandbox import SandboxServer
from tests.console.support import Console, api_keys, console_registry
from tests.fixtures.capabilities import registry_file
from tests.fixtures.stack import ProcessStack


# Package scope: the stack stops once the folder's last test is done, not at the end
# of a whole run where its processes would compete with every later test for the CPU.
@pytest_asyncio.fixture(scope="package", loop_scope="session")
async def console(
    tmp_path_factory: pytest.TempPathFactory,
    pg_server_url: str,
    template_database: str,
    kafka_bootstrap: str,
) -> AsyncIterator[Console]:
    name = unique_name("td_console")
    database_url = create_database(pg_server_url, name, template=template_database)
    home = tmp_path_factory.mktemp("console-stack")
    # Not in home itself: the stack writes its default registry there.
    registry_dir = tmp_path_factory.mktemp("console-registry")
    try:
        async with SandboxServer() as sandbox:
            stack = ProcessStack(
                home,
                database_url=database_url,
                kafka_bootstrap=kafka_bootstrap,
                sandbox_url=sandbox.url,
                capabilities_file=registry_file(registry_dir, console_registry(sandbox.url)),
                http_port=free_port(),
                api_keys=json.dumps([k.model_dump() for k in api_keys()]),
                # Plain http in the tests: a Secure cookie would never be sent back.
                console_secure_cookie="false",
                # The reconciler's passes, short so that an escalation comes in seconds.
                reconcile_interval_seconds=0.3,
            )
            base_url = f"http://127.0.0.1:{stack.env['TOOL_DISPATCHER_HTTP_PORT']}"
            try:
                for command in ("serve", "worker", "relay", "reconcile"):
                    stack.start(command)
                stack.start("approvals", "expire", "--interval", "1", name="approvals")
                port = int(stack.env["TOOL_DISPATCHER_HTTP_PORT"])
                await asyncio.to_thread(wait_for_port, "127.0.0.1", port, timeout=60)
                async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
                    yield Console(base_url, sandbox.url, http, stack)
            finally:
                stack.close()
    finally:
        drop_database(pg_server_url, name)


@pytest.fixture
def browser_base_url(console: Console) -> str:
    return console.base_url
