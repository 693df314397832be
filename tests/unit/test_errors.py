"""The error tree: the public codes and statuses are pinned, the tree drawn in the
docstring of ``dispatcher.errors`` is the real one, and the HTTP client maps every code
back to its class."""

from __future__ import annotations

import inspect
import re

import httpx
import pytest

from dispatcher import errors
from dispatcher.client import ApiError
from dispatcher.client.problems import error_from
from dispatcher.errors import DispatcherError, IllegalTransition, InternalError

# Public: the README lists them and clients match on them.
CODES: dict[str, int] = {
    "validation_failed": 400,
    "payload_too_large": 413,
    "unauthenticated": 401,
    "forbidden": 403,
    "self_approval_forbidden": 403,
    "csrf_rejected": 403,
    "capability_not_found": 404,
    "tool_call_not_found": 404,
    "run_not_found": 404,
    "approval_not_found": 404,
    "escalation_not_found": 404,
    "dead_letter_not_found": 404,
    "operation_not_found": 404,
    "webhook_delivery_not_found": 404,
    "operation_finished": 409,
    "tool_call_id_conflict": 409,
    "transition_conflict": 409,
    "run_stopped": 409,
    "capability_unavailable": 409,
    "retry_not_allowed": 409,
    "approval_already_decided": 409,
    "approval_expired": 409,
    "approval_stale": 409,
    "escalation_already_resolved": 409,
    "idempotency_key_reused": 422,
    "rate_limited": 429,
    "request_timeout": 408,
    "service_unavailable": 503,
    "unreadable_record": 400,
    "tenant_mismatch": 403,
}

CLASSES = [
    cls
    for _, cls in inspect.getmembers(errors, inspect.isclass)
    if issubclass(cls, DispatcherError) and cls.__module__ == errors.__name__
]
LEAVES = [cls for cls in CLASSES if "code" in vars(cls) and cls is not DispatcherError]


def test_every_public_code_keeps_its_status() -> None:
    assert {cls.code: cls.status for cls in LEAVES} == CODES


def test_the_drawn_tree_is_the_class_tree() -> None:
    doc = errors.__doc__ or ""
    drawn: dict[str, str] = {}
    parents: list[tuple[int, str]] = []
    for line in doc.splitlines():
        # The drawing is the docstring's only indented block.
        found = re.match(r"^ {4}((?:[│ ] {3})*)([├└]── )?(\w+)", line)
        if found is None:
            continue
        prefix, branch, name = found.groups()
        depth = len(prefix) // 4 + (1 if branch else 0)
        while parents and parents[-1][0] >= depth:
            parents.pop()
        if parents:
            drawn[name] = parents[-1][1]
        parents.append((depth, name))

    actual = {
        cls.__name__: cls.__bases__[0].__name__ for cls in CLASSES if cls is not DispatcherError
    }
    assert drawn == actual


def test_an_illegal_transition_is_an_internal_error() -> None:
    exc = IllegalTransition("confirmed", "authorized", subject="a call")

    assert isinstance(exc, InternalError)
    assert (exc.code, exc.status, exc.retriable) == ("internal_error", 500, False)
    assert exc.detail == "a call in 'confirmed' cannot move to 'authorized'"


@pytest.mark.parametrize("cls", LEAVES, ids=lambda c: c.code)
def test_the_client_turns_each_code_back_into_its_class(cls: type[DispatcherError]) -> None:
    answer = httpx.Response(
        cls.status, json={"code": cls.code, "detail": "d", "status": cls.status, "runId": "r"}
    )

    exc = error_from(answer)

    assert type(exc) is cls
    assert (exc.detail, exc.extra) == ("d", {"runId": "r"})


def test_an_internal_error_answer_stays_an_api_error() -> None:
    exc = error_from(httpx.Response(500, json={"code": "internal_error", "detail": "d"}))

    assert isinstance(exc, ApiError)
    assert (exc.status, exc.code) == (500, "internal_error")
