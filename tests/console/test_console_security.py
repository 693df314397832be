"""What the console refuses, tried from a real browser session: a form post without
its CSRF token, any action of a read-only key (which sees no buttons either), another
tenant's call, and an input that would run as script if it were not escaped."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.async_api import APIResponse, Page

from tests.console.support import (
    APPROVER_BOB,
    OPS_ALICE,
    READ_ONLY,
    REFUND_APPROVED,
    TENANT_B,
    Console,
    csrf_of,
    new_run,
    post_buttons,
    text_of,
)
from tests.fixtures.browser import Pages, sign_in

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.postgres, pytest.mark.kafka]

HOSTILE = "<script>alert(1)</script>"


async def forge(page: Page, console: Console, action: str, **fields: Any) -> APIResponse:
    """POST ``fields`` to ``action`` with the page's session cookie and this site's
    Origin, as a script of another tab could: only the fields differ from the form's."""
    return await page.request.post(
        console.base_url + action,
        form=fields,
        headers={"Origin": console.base_url},
        max_redirects=0,
    )


async def decision_action(page: Page, approval_id: str) -> str:
    await page.goto(f"/console/approvals/{approval_id}")
    action = await page.locator("form[method=post]:has(button[value=approve])").get_attribute(
        "action"
    )
    assert action, "the approval page has no decision form"
    return action


async def pending_approval(console: Console) -> tuple[dict[str, Any], str]:
    view = await console.submit(REFUND_APPROVED, new_run())
    return view, (await console.approval_of(view["toolCallId"]))["approvalId"]


async def test_a_post_without_its_csrf_token_is_refused_and_changes_nothing(
    console: Console, pages: Pages
) -> None:
    view, approval_id = await pending_approval(console)
    page, _ = await pages.new()
    await sign_in(page, APPROVER_BOB)
    action = await decision_action(page, approval_id)

    refused = await forge(page, console, action, decision="approve", reason="no token")
    assert refused.status == 403
    wrong = await forge(page, console, action, decision="approve", csrf="0" * 64)
    assert wrong.status == 403
    assert (await console.approval_of(view["toolCallId"]))["status"] == "pending"
    assert (await console.call(view["toolCallId"]))["status"] == "proposed"

    # The same post with the session's token goes through: the token was all it lacked.
    token = await csrf_of(page)
    accepted = await forge(page, console, action, decision="reject", reason="ok", csrf=token)
    assert accepted.status == 303
    assert (await console.approval_of(view["toolCallId"]))["status"] == "rejected"


async def test_a_read_only_key_sees_no_actions_and_its_forged_posts_are_refused(
    console: Console, pages: Pages
) -> None:
    view, approval_id = await pending_approval(console)
    call_id, run_id = view["toolCallId"], view["runId"]
    bob, _ = await pages.new()
    await sign_in(bob, APPROVER_BOB)
    action = await decision_action(bob, approval_id)

    page, _ = await pages.new()
    await sign_in(page, READ_ONLY)
    for path in (
        "/console/",
        "/console/approvals",
        f"/console/approvals/{approval_id}",
        f"/console/calls/{call_id}",
        f"/console/runs/{run_id}",
        "/console/runs",
        "/console/outbox",
        "/console/webhooks",
        "/console/overview",
    ):
        await page.goto(path)
        assert await post_buttons(page) == [], path
    assert await page.get_by_role("button", name="Stop run").count() == 0

    token = await csrf_of(page)
    decided = await forge(page, console, action, decision="approve", reason="me", csrf=token)
    assert decided.status == 403
    stopped = await forge(page, console, f"/console/runs/{run_id}/stop", reason="me", csrf=token)
    assert stopped.status == 403
    assert (await console.approval_of(call_id))["status"] == "pending"
    assert (await console.get(f"/v1/runs/{run_id}"))["stopped"] is False


async def test_another_tenants_call_is_not_found(console: Console, pages: Pages) -> None:
    view = await console.submit(REFUND_APPROVED, new_run())
    page, guard = await pages.new()
    await sign_in(page, TENANT_B)
    async with guard.expect(404):
        reply = await page.goto(f"/console/calls/{view['toolCallId']}")
    assert reply is not None and reply.status == 404
    problem = page.locator("[data-testid=problem]")
    assert await problem.get_attribute("data-code") == "tool_call_not_found"
    # Nothing of the call is shown, its status included.
    assert await page.locator("[data-testid=call-status]").count() == 0


async def test_an_input_holding_a_script_renders_as_text(console: Console, pages: Pages) -> None:
    view = await console.submit(REFUND_APPROVED, new_run(), note=HOSTILE)
    approval_id = (await console.approval_of(view["toolCallId"]))["approvalId"]
    page, guard = await pages.new()
    await sign_in(page, OPS_ALICE)
    for path in (f"/console/calls/{view['toolCallId']}", f"/console/approvals/{approval_id}"):
        await page.goto(path)
        assert HOSTILE in await text_of(page, "input"), path
        # Only the console's own script file: nothing inline came from the input.
        inline = await page.locator("script:not([src])").count()
        assert inline == 0, path
    assert guard.dialogs == []
