"""The transport's classification table, exception by exception, and what it refuses
before sending: the one place "not sent" is decided (dispatcher/provider/transport.py).
The real-socket side is tests/worker/test_provider_transport.py."""

from __future__ import annotations

import math
import ssl

import aiohttp
import pytest
from aiohttp.client_reqrep import ConnectionKey
from yarl import URL

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


HEADER_REFUSAL = "a header holds a control character"
URL_REFUSAL = "not an http(s) URL with a host"


@pytest.mark.parametrize("headers", [{"X": "a\rb"}, {"X\x7f": "v"}, {"": "v"}, {"X": "\x1f"}])
def test_a_refused_header_says_why_without_its_value(headers: dict[str, str]) -> None:
    with pytest.raises(ValueError) as raised:
        _check_headers(headers)
    assert str(raised.value) == HEADER_REFUSAL


@pytest.mark.parametrize(
    "url", ["ftp://provider.test/x", "http:///no-host", "/relative", "", "mailto:a@b.test"]
)
def test_a_refused_url_says_why(url: str) -> None:
    with pytest.raises(ValueError) as raised:
        _url(url)
    assert str(raised.value) == URL_REFUSAL


@pytest.mark.parametrize(
    "url", ["https://provider.test", "HTTP://Provider.test:8080/x?q=1", "http://[::1]:9/x"]
)
def test_an_http_url_with_a_host_is_accepted_as_given(url: str) -> None:
    assert _url(url) == URL(url)


def test_each_budget_is_one_timeout_built_once() -> None:
    transport = Transport()
    timeout = transport._timeout(1.5)
    assert timeout == aiohttp.ClientTimeout(total=4.0, connect=1.5, sock_read=1.5)
    # Built once per budget: no allocation per request.
    assert transport._timeout(1.5) is timeout
    assert transport._timeout(3.0) == aiohttp.ClientTimeout(total=7.0, connect=3.0, sock_read=3.0)


def test_the_pool_holds_64_requests_by_default_and_never_none() -> None:
    assert (Transport().max_in_flight, Transport(0).max_in_flight) == (64, 1)


async def test_pooled_connections_idle_out_before_a_providers_do() -> None:
    """What no server can observe quickly: the idle expiry of a pooled connection. The
    rest (cookies, proxies, per-host limit) is observed on the wire in
    tests/worker/test_transport_wire.py."""
    session = Transport(3)._open()
    try:
        assert isinstance(session.connector, aiohttp.TCPConnector)
        assert session.connector._keepalive_timeout == 2.0
    finally:
        await session.close()
