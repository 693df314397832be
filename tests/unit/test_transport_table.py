"""The transport's classification table, exception by exception, and what it refuses
before sending: the one place "not sent" is decided (dispatcher/provider/transport.py).
The real-socket side is tests/worker/test_provider_transport.py."""

from __future__ import annotations

import math
import ssl

import aiohttp
import pytest
from aiohttp.client_reqrep import ConnectionKey

from dispatcher.provider.transport import (
    MaybeReceived,
    NotSent,
    Transport,
    Unsendable,
    _check_headers,
    _url,
    failure,
    json_body,
)

KEY = ConnectionKey("provider.test", 443, True, True, None, None, None)
REFUSED = ConnectionRefusedError(111, "Connection refused")

BEFORE_SENDING = [
    aiohttp.ClientConnectorError(KEY, REFUSED),
    aiohttp.ClientConnectorDNSError(KEY, OSError(-2, "Name or service not known")),
    aiohttp.ClientConnectorSSLError(KEY, ssl.SSLError(1, "handshake failure")),
    aiohttp.ClientConnectorCertificateError(KEY, ssl.CertificateError("bad cert")),
    aiohttp.ConnectionTimeoutError("Connection timeout to host"),
]
AFTER_SENDING_STARTED = [
    aiohttp.ServerDisconnectedError(),
    aiohttp.ClientOSError(104, "Connection reset by peer"),
    aiohttp.ClientConnectionResetError("Cannot write to closing transport"),
    aiohttp.ClientPayloadError("Response payload is not completed"),
    aiohttp.SocketTimeoutError("Timeout on reading data from socket"),
    aiohttp.ServerTimeoutError("timeout"),
    TimeoutError(),
    aiohttp.ClientConnectionError("Connector is closed."),
    aiohttp.ClientError("anything else"),
    RuntimeError("a bug after the request may have left"),
]


@pytest.mark.parametrize("exc", BEFORE_SENDING, ids=lambda e: type(e).__name__)
def test_only_connector_errors_and_connect_timeouts_are_not_sent(exc: Exception) -> None:
    result = failure(exc)
    assert type(result) is NotSent
    assert str(result) == f"not sent: {type(exc).__name__}"


@pytest.mark.parametrize("exc", AFTER_SENDING_STARTED, ids=lambda e: type(e).__name__)
def test_everything_after_connecting_may_have_been_received(exc: Exception) -> None:
    result = failure(exc)
    assert type(result) is MaybeReceived
    assert str(result) == f"sent, no answer: {type(exc).__name__}"


@pytest.mark.parametrize(
    ("value", "cause"),
    [({"n": math.nan}, "ValueError"), ({"n": math.inf}, "ValueError"), ({"s": {1}}, "TypeError")],
)
def test_a_body_json_cannot_carry_is_unsendable(value: object, cause: str) -> None:
    with pytest.raises(Unsendable, match=f"^{cause}$"):
        json_body(value)


def test_a_body_is_compact_json() -> None:
    assert json_body({"a": [1, "é"]}) == b'{"a":[1,"\\u00e9"]}'


@pytest.mark.parametrize(
    ("headers", "cause"),
    [
        ({"Authorization": "Bearer sécret"}, UnicodeEncodeError),
        ({"Idempotency-Key": "ключ"}, UnicodeEncodeError),
        ({"Authorization": "Bearer s\r\nX-Injected: 1"}, ValueError),
        ({"Authorization": "Bearer s\nX: 1"}, ValueError),
        ({"X-Nul": "a\x00b"}, ValueError),
        ({"X-Bad\r\nName": "v"}, ValueError),
        ({"": "v"}, ValueError),
    ],
)
def test_a_header_no_request_can_carry_is_refused(
    headers: dict[str, str], cause: type[Exception]
) -> None:
    with pytest.raises(cause):
        _check_headers(headers)


def test_ordinary_headers_pass() -> None:
    _check_headers({"Idempotency-Key": "refund:o-1", "traceparent": "00-ab-cd-01", "X": "a\tb"})


@pytest.mark.parametrize("url", ["ftp://provider.test/x", "http:///no-host", "/relative"])
def test_a_url_that_is_not_http_with_a_host_is_refused(url: str) -> None:
    with pytest.raises(ValueError):
        _url(url)


async def test_an_unsendable_request_names_only_the_cause_type() -> None:
    async with Transport() as transport:
        with pytest.raises(Unsendable) as raised:
            await transport.send(
                "POST", "http://127.0.0.1:1/x", headers={"A": "Bearer sécret"}, timeout_seconds=1
            )
    assert str(raised.value) == "UnicodeEncodeError"
    assert isinstance(raised.value.cause, UnicodeEncodeError)


def test_connecting_always_ends_before_the_total_backstop() -> None:
    timeout = Transport()._timeout(10.0)
    assert (timeout.connect, timeout.sock_read) == (10.0, 10.0)
    assert timeout.total is not None and timeout.total > timeout.connect + 1
    assert timeout.sock_connect is None


async def test_one_pool_as_large_as_the_requests_in_flight_and_no_silent_retry() -> None:
    transport = Transport(7)
    session = transport._open()
    try:
        assert isinstance(session.connector, aiohttp.TCPConnector)
        assert session.connector.limit == 7
        assert session._retry_connection is False
    finally:
        await session.close()
