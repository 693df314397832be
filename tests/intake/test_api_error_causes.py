"""Answers by cause over the real API: what the database refuses because of the
request is a 400, a 405 says which methods the path has, and a client that hangs up
mid-body is one log line, not a server error."""

from __future__ import annotations

import asyncio
import logging
import secrets
from urllib.parse import urlsplit

import httpx
import pytest
from prometheus_client import REGISTRY

from dispatcher.api import problems
from tests.fixtures.api import OPERATOR, READER, bearer
from tests.fixtures.waiting import eventually

pytestmark = pytest.mark.postgres


def _server_errors() -> float:
    """Requests the API answered 5xx so far, every route (the metric is process-wide)."""
    total = 0.0
    for family in REGISTRY.collect():
        if family.name == "tool_dispatcher_http_request_seconds":
            for sample in family.samples:
                if sample.name.endswith("_count") and sample.labels.get("status") == "5xx":
                    total += sample.value
    return total


async def test_a_run_id_over_the_index_limit_is_refused_as_bad_input(
    api: httpx.AsyncClient,
) -> None:
    # Finding 7: the btree row-size limit (54000) is the request's fault, not an outage.
    # Random hex, so that PostgreSQL cannot compress the index entry under the limit.
    run_id = secrets.token_hex(4000)
    response = await api.post(f"/v1/runs/{run_id}/stop", json={}, headers=bearer(OPERATOR))

    assert response.status_code == 400, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    problem = response.json()
    assert problem["code"] == "validation_failed"
    assert "not reachable" not in problem["detail"]


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        pytest.param("PUT", "/v1/tool-calls", {"POST"}, id="tool-calls"),
        pytest.param("DELETE", "/v1/tool-calls/tc-1", {"GET"}, id="one-call"),
        pytest.param("GET", "/v1/runs/run-1/stop", {"POST"}, id="stop"),
        pytest.param("DELETE", "/v1/approvals", {"GET"}, id="approvals"),
    ],
)
async def test_405_names_every_method_of_the_path(
    api: httpx.AsyncClient, method: str, path: str, allowed: set[str]
) -> None:
    response = await api.request(method, path, headers=bearer(READER))

    assert response.status_code == 405
    assert response.headers["content-type"].startswith("application/problem+json")
    assert response.json()["code"] == "method_not_allowed"
    assert {m.strip() for m in response.headers["allow"].split(",")} == allowed


async def test_an_aborted_upload_is_one_log_line_and_no_server_error(
    api_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    where = urlsplit(api_url)
    before = _server_errors()
    with caplog.at_level(logging.INFO):
        _reader, writer = await asyncio.open_connection(where.hostname, where.port)
        writer.write(
            b"POST /v1/tool-calls HTTP/1.1\r\n"
            + f"Host: {where.netloc}\r\n".encode()
            + f"Authorization: Bearer {READER}\r\n".encode()
            + b"Content-Type: application/json\r\nContent-Length: 400\r\n\r\n"
            + b'{"runId": "run-1", "capabilityId": '
        )
        await writer.drain()
        writer.close()
        await writer.wait_closed()

        async def logged() -> bool:
            return any(r.name == problems.__name__ or r.exc_info for r in caplog.records)

        await eventually(logged, within=30, what="the server's log of the aborted upload")

    mine = [r for r in caplog.records if r.name == problems.__name__]
    assert [r.getMessage() for r in mine] == [
        "client closed POST /v1/tool-calls before sending its body"
    ]
    assert all(r.exc_info is None for r in caplog.records), "no traceback is logged"
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert _server_errors() == before
