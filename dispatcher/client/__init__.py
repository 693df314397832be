"""An HTTP client of the tool-dispatcher API, async (:class:`DispatcherClient`) and
blocking (:class:`SyncDispatcherClient`)::

    async with DispatcherClient("http://127.0.0.1:8780", api_key) as client:
        submission = await client.submit(
            SubmitRequest(run_id="run-1", capability_id="send-email",
                          tool_call_id="run-1.toolu_01", input={"to": "a@example.com"})
        )
        view = await client.wait(submission.view.tool_call_id, within=30)

Errors are the dispatcher's own exceptions, found by the problem+json ``code``.
"""

from dispatcher.client.asyncclient import DispatcherClient
from dispatcher.client.problems import ApiError, WaitTimedOut
from dispatcher.client.sync import SyncDispatcherClient
from dispatcher.schemas import StopResult

__all__ = [
    "ApiError",
    "DispatcherClient",
    "StopResult",
    "SyncDispatcherClient",
    "WaitTimedOut",
]
