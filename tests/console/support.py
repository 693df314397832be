"""What the console's tests share: the keys and capabilities of their stack, the stack
as a test reaches it over HTTP, and reading what a page shows."""

from __future__ import annotations

import os
import re
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from playwright.async_api import Page

from devtools.registries import capability, registry_of
from dispatcher.capabilities import CapabilityRegistry
from dispatcher.settings import ApiKey, hash_api_key
from tests.fixtures.capabilities import approval_capability
from tests.fixtures.stack import ProcessStack
from tests.fixtures.waiting import eventually

# Tenant A ("acme"): an operator, an approver, a reader and the agent that submits.
OPS_ALICE = "tdk_console_acme_ops_alice"
APPROVER_BOB = "tdk_console_acme_approver_bob"
READ_ONLY = "tdk_console_acme_read_only"
AGENT = "tdk_console_acme_agent"
# Tenant B ("globex"), every scope.
TENANT_B = "tdk_console_globex_all"

# Executes at once; its lookups (by key) give up after half a second, and two failed
# ones escalate the call.
REFUND = "refund"
# Needs a human's approval, and not that of the key that submitted it.
REFUND_APPROVED = "refund-approved"


def api_keys() -> list[ApiKey]:
    def key(raw: str, tenant: str, scopes: list[Any], name: str) -> ApiKey:
        return ApiKey(sha256=hash_api_key(raw), tenant=tenant, scopes=scopes, name=name)

    every = ["submit", "read", "approve", "operate"]
    return [
        key(OPS_ALICE, "acme", every, "ops-alice"),
        key(APPROVER_BOB, "acme", ["read", "approve"], "approver-bob"),
        key(READ_ONLY, "acme", ["read"], "reader"),
        key(AGENT, "acme", ["submit", "read"], "agent"),
        key(TENANT_B, "globex", every, "globex-ops"),
    ]


def console_registry(sandbox_url: str) -> CapabilityRegistry:
    return registry_of(
        capability(
            REFUND,
            sandbox_url,
            attempts=2,
            lookup_timeout=0.5,
            by_key=True,
            reconcile={"maxAttempts": 2},
        ),
        approval_capability(REFUND_APPROVED, sandbox_url, forbidSelfApproval=True),
    )


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def new_run() -> str:
    return f"run-{uuid.uuid4().hex[:10]}"


def new_key(prefix: str = "console") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


@dataclass
class Console:
    """The running stack as the tests reach it: the API's URL (the console's too), the
    sandbox's, and an HTTP client of the API (each request names its key)."""

    base_url: str
    sandbox_url: str
    http: httpx.AsyncClient
    stack: ProcessStack

    async def submit(
        self,
        capability_id: str,
        run_id: str,
        *,
        idempotency_key: str | None = None,
        key: str = AGENT,
        **input_: Any,
    ) -> dict[str, Any]:
        """Submit a call over HTTP (as the agent); returns its view."""
        body = {
            "runId": run_id,
            "capabilityId": capability_id,
            "idempotencyKey": idempotency_key or new_key(),
            "input": input_ or {"orderId": "o-1"},
        }
        reply = await self.http.post("/v1/tool-calls", json=body, headers=bearer(key))
        assert reply.status_code == 201, reply.text
        view: dict[str, Any] = reply.json()
        return view

    async def get(self, path: str, key: str = OPS_ALICE, **params: Any) -> Any:
        reply = await self.http.get(path, headers=bearer(key), params=params)
        assert reply.status_code == 200, f"{path}: {reply.status_code} {reply.text}"
        return reply.json()

    async def call(self, tool_call_id: str) -> dict[str, Any]:
        view: dict[str, Any] = await self.get(f"/v1/tool-calls/{tool_call_id}")
        return view

    async def approval_of(self, tool_call_id: str) -> dict[str, Any]:
        found = await self.get("/v1/approvals", APPROVER_BOB, limit=1000)
        (approval,) = (a for a in found["approvals"] if a["toolCallId"] == tool_call_id)
        return dict(approval)

    async def wait_for_status(self, tool_call_id: str, *statuses: str) -> dict[str, Any]:
        """The call's view once its status is one of ``statuses``."""
        seen: dict[str, Any] = {}

        async def reached() -> bool:
            seen.update(await self.call(tool_call_id))
            return seen["status"] in statuses

        await eventually(reached, within=30, what=f"call {tool_call_id} to be {statuses}")
        return seen


async def text_of(page: Page, testid: str) -> str:
    return (await page.locator(f"[data-testid={testid}]").first.inner_text()).strip()


async def texts(page: Page, *shown: str) -> dict[str, list[str]]:
    """The texts of every element of each of ``shown``: a test id, or a CSS selector."""
    found = {}
    for what in shown:
        selector = what if re.search(r"[\[\] .#>:]", what) else f"[data-testid={what}]"
        found[what] = [t.strip() for t in await page.locator(selector).all_inner_texts()]
    return found


async def reload_shows_the_same(page: Page, *shown: str) -> dict[str, list[str]]:
    """Reload the page (a GET) and check that each of ``shown`` (test ids or CSS
    selectors, none of them a ticking age) reads as before, and is there at all."""
    before = await texts(page, *shown)
    await page.reload()
    after = await texts(page, *shown)
    assert after == before, f"{page.url} changed on reload"
    assert all(after.values()), f"{page.url} shows none of some of {shown}: {after}"
    return after


async def shows_after_reloads(page: Page, testid: str, wanted: str) -> None:
    """Reload until ``testid`` reads ``wanted`` (the pages are server-rendered, so a
    state reached in the background shows only on the next load)."""

    async def shown() -> bool:
        await page.reload()
        return await text_of(page, testid) == wanted

    if await text_of(page, testid) != wanted:
        await eventually(shown, within=30, every=0.3, what=f"{testid} to read {wanted!r}")


async def screenshot(page: Page, name: str) -> None:
    """Save a screenshot for the docs, only when TOOL_DISPATCHER_TEST_SCREENSHOTS names
    a directory to save it in."""
    directory = os.environ.get("TOOL_DISPATCHER_TEST_SCREENSHOTS")
    if directory:
        # Playwright creates the directory itself.
        await page.screenshot(path=str(Path(directory) / name), full_page=True)


async def csrf_of(page: Page) -> str:
    """The session's CSRF token, as the sign-out form of every page carries it."""
    sign_out = page.locator('form:has(button:text-is("Sign out")) input[name=csrf]')
    token = await sign_out.first.get_attribute("value")
    assert token, "the sign-out form carries no csrf token"
    return token


async def post_buttons(page: Page) -> list[str]:
    """The labels of the buttons of the page's POST forms, sign-out left out."""
    labels = await page.locator("form[method=post] button").all_inner_texts()
    return [label.strip() for label in labels if label.strip() != "Sign out"]
