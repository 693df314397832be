"""Problem+json answers turned back into the dispatcher's own exceptions.

A caller of the HTTP client catches the same classes as a caller of the library
(``except ToolCallNotFound``), found by the problem's stable ``code``.
"""

from __future__ import annotations

from typing import Any

import httpx

from dispatcher import errors
from dispatcher.errors import DispatcherError
from dispatcher.schemas import ToolCallView


class ApiError(DispatcherError):
    """An error answer whose ``code`` this client does not know (a newer server), or one
    that is not problem+json at all (a proxy's page); ``status`` is the HTTP status."""

    def __init__(self, status: int, code: str, detail: str, **extra: Any) -> None:
        super().__init__(detail, **extra)
        self.status = status
        self.code = code


class WaitTimedOut(DispatcherError):
    """The call was not settled when the wait ran out; ``view`` is its last state."""

    code, title = "wait_timed_out", "The call was not settled in time"

    def __init__(self, view: ToolCallView, within: float) -> None:
        super().__init__(
            f"tool call {view.tool_call_id!r} is still {view.status} after {within:g} s",
            toolCallId=view.tool_call_id,
            status=view.status,
        )
        self.view = view


def _by_code() -> dict[str, type[DispatcherError]]:
    found: dict[str, type[DispatcherError]] = {}
    pending: list[type[DispatcherError]] = [DispatcherError]
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        # Only the leaves name a code; a branch (NotFound, InternalError...) inherits the
        # root's, and an internal_error stays an ApiError.
        if cls is not DispatcherError and cls.__module__ == errors.__name__ and "code" in vars(cls):
            found[cls.code] = cls
    return found


_CLASSES = _by_code()
_RESERVED = frozenset({"type", "title", "status", "code", "detail"})


def error_from(response: httpx.Response) -> DispatcherError:
    """The exception an error ``response`` stands for."""
    try:
        body: Any = response.json()
    except ValueError:
        body = None
    if not isinstance(body, dict) or not isinstance(body.get("code"), str):
        text = response.text[:200]
        return ApiError(response.status_code, "http_error", f"HTTP {response.status_code}: {text}")
    code: str = body["code"]
    detail = str(body.get("detail", ""))
    extra = {k: v for k, v in body.items() if k not in _RESERVED}
    cls = _CLASSES.get(code)
    if cls is None:
        return ApiError(response.status_code, code, detail, **extra)
    # The server-side classes take typed constructor arguments (an id, a status...);
    # the problem already carries their rendered detail and members, so the instance
    # is rebuilt from those through the root's constructor.
    exc = cls.__new__(cls)
    DispatcherError.__init__(exc, detail, **extra)
    return exc
