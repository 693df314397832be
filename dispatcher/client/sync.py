"""A blocking wrapper of :class:`~dispatcher.client.DispatcherClient` for code without
an event loop (scripts, notebooks, synchronous frameworks)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from dispatcher.client.asyncclient import DispatcherClient
from dispatcher.schemas import ApprovalView, StopResult, Submission, SubmitRequest, ToolCallView

T = TypeVar("T")


class SyncDispatcherClient:
    """The same methods as :class:`DispatcherClient`, blocking. Each call runs on one
    private event loop, which also owns the connection pool; do not call it from
    inside a running event loop."""

    def __init__(self, base_url: str, api_key: str, *, timeout: float = 10.0) -> None:
        self._runner = asyncio.Runner()
        self._client = DispatcherClient(base_url, api_key, timeout=timeout)

    def __enter__(self) -> SyncDispatcherClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._run(self._client.aclose())
        self._runner.close()

    def submit(self, request: SubmitRequest) -> Submission:
        return self._run(self._client.submit(request))

    def get(self, tool_call_id: str) -> ToolCallView:
        return self._run(self._client.get(tool_call_id))

    def wait(self, tool_call_id: str, *, within: float) -> ToolCallView:
        return self._run(self._client.wait(tool_call_id, within=within))

    def approve(self, approval_id: str, reason: str = "") -> ApprovalView:
        return self._run(self._client.approve(approval_id, reason))

    def reject(self, approval_id: str, reason: str = "") -> ApprovalView:
        return self._run(self._client.reject(approval_id, reason))

    def stop_run(self, run_id: str, reason: str = "") -> StopResult:
        return self._run(self._client.stop_run(run_id, reason))

    def retry(
        self, tool_call_id: str, reason: str, *, new_idempotency_key: bool = False
    ) -> ToolCallView:
        return self._run(
            self._client.retry(tool_call_id, reason, new_idempotency_key=new_idempotency_key)
        )

    def _run(self, call: Coroutine[Any, Any, T]) -> T:
        return self._runner.run(call)
