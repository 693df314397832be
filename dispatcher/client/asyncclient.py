"""The async HTTP client of tool-dispatcher's API."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Literal
from urllib.parse import quote

import httpx

from dispatcher.client.problems import WaitTimedOut, error_from
from dispatcher.errors import RateLimited
from dispatcher.schemas import ApprovalView, StopResult, Submission, SubmitRequest, ToolCallView
from dispatcher.states import SETTLED_STATES

# The server holds one long-poll at most this long (dispatcher.api.tool_calls.MAX_WAIT_SECONDS);
# a longer wait is several polls in a row.
POLL_SECONDS = 20.0


def _segment(value: str) -> str:
    # An id may hold "?", "#" or "%" (printable ASCII without "/"): as a path segment
    # it is encoded, or the URL would end, or mean another id, where the id goes on.
    return quote(value, safe="")


class DispatcherClient:
    """Submit, read, wait for and command tool calls over the HTTP API.

    Every error answer is raised as the dispatcher's own exception for its problem
    ``code`` (:mod:`dispatcher.errors`), or :class:`~dispatcher.client.ApiError`;
    transport failures are httpx's (``httpx.ConnectError`` means the request never left,
    a ``ReadTimeout`` on a submit means it may have been recorded: submit again with the
    same ``tool_call_id`` or ``idempotency_key`` and the first one is replayed).

    Pass ``http`` to share a pool (it is not closed by :meth:`aclose`).
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float = 10.0,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        self._base = base_url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {api_key}"}
        self._timeout = timeout
        self._owned = http is None
        self._http = http or httpx.AsyncClient(timeout=timeout)

    async def __aenter__(self) -> DispatcherClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._owned:
            await self._http.aclose()

    async def submit(self, request: SubmitRequest) -> Submission:
        """Record a call; the same ``toolCallId`` or idempotency key again replays the
        first (``created`` is False) and runs nothing twice."""
        response = await self._request(
            "POST",
            "/v1/tool-calls",
            json=request.model_dump(by_alias=True, exclude_none=True, mode="json"),
        )
        return Submission(
            ToolCallView.model_validate_json(response.content), response.status_code == 201
        )

    async def get(self, tool_call_id: str) -> ToolCallView:
        response = await self._request("GET", f"/v1/tool-calls/{_segment(tool_call_id)}")
        return ToolCallView.model_validate_json(response.content)

    async def wait(self, tool_call_id: str, *, within: float) -> ToolCallView:
        """The call once it is settled (final, or escalated to a human): long-polls
        the API until then. Raises :class:`WaitTimedOut` (with the last view) after
        ``within`` seconds, ``ToolCallNotFound`` if there is no such call."""
        deadline = time.monotonic() + within
        while True:
            hold = min(max(deadline - time.monotonic(), 0.0), POLL_SECONDS)
            try:
                response = await self._request(
                    "GET",
                    f"/v1/tool-calls/{_segment(tool_call_id)}",
                    params={"waitSeconds": f"{hold:.3f}"},
                    read_for=hold + self._timeout,
                )
            except RateLimited as exc:
                # The tenant holds as many long-polls as the server allows: back off
                # as told (never past the deadline), then poll again.
                left = deadline - time.monotonic()
                if left <= 0:
                    raise
                await asyncio.sleep(min(float(exc.extra.get("retryAfterSeconds", 1)), left))
                continue
            view = ToolCallView.model_validate_json(response.content)
            if view.status in SETTLED_STATES:
                return view
            if time.monotonic() >= deadline:
                raise WaitTimedOut(view, within)

    async def approve(self, approval_id: str, reason: str = "") -> ApprovalView:
        return await self._decide(approval_id, "approve", reason)

    async def reject(self, approval_id: str, reason: str = "") -> ApprovalView:
        return await self._decide(approval_id, "reject", reason)

    async def stop_run(self, run_id: str, reason: str = "") -> StopResult:
        """Stop a run: calls not yet dispatched are cancelled, new ones refused."""
        response = await self._request(
            "POST", f"/v1/runs/{_segment(run_id)}/stop", json={"reason": reason}
        )
        return StopResult.model_validate_json(response.content)

    async def retry(
        self, tool_call_id: str, reason: str, *, new_idempotency_key: bool = False
    ) -> ToolCallView:
        """Run a ``failed`` or ``escalated`` call again (an operator's command)."""
        response = await self._request(
            "POST",
            f"/v1/tool-calls/{_segment(tool_call_id)}/retry",
            json={"reason": reason, "newIdempotencyKey": new_idempotency_key},
        )
        return ToolCallView.model_validate_json(response.content)

    async def _decide(
        self, approval_id: str, decision: Literal["approve", "reject"], reason: str
    ) -> ApprovalView:
        response = await self._request(
            "POST",
            f"/v1/approvals/{_segment(approval_id)}/decision",
            json={"decision": decision, "reason": reason},
        )
        return ApprovalView.model_validate_json(response.content)

    async def _request(
        self, method: str, path: str, *, read_for: float | None = None, **kwargs: Any
    ) -> httpx.Response:
        response = await self._http.request(
            method,
            self._base + path,
            headers=self._headers,
            timeout=read_for if read_for is not None else self._timeout,
            **kwargs,
        )
        if response.is_error:
            raise error_from(response)
        return response
