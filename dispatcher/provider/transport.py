"""The one HTTP transport to providers: aiohttp, with failures classified exactly.

Why aiohttp directly, behind this module: measured against the sandbox at 64 requests
in flight, aiohttp costs about 175 µs of CPU a request, httpx in many pools of 2 about
776 µs and httpx over the ``httpx-aiohttp`` transport 437 µs. That transport
would also lose the one distinction this service lives by: it maps every
``aiohttp.ClientConnectionError`` to ``httpx.ConnectTimeout``, so a connection reset
*after the request was written* would read as "not sent" and be sent again. Our own
httpx transport would keep httpx's per-request cost; calling aiohttp here costs nothing
on top of it.

Every failure of a send is one of three exceptions, decided by :func:`failure` from the
exception's type alone, never its text (aiohttp 3.10 to 3.14)::

    before anything was sent: NotSent
        ClientConnectorError and its subclasses (refused, DNS,
        TLS handshake, certificate)                   the connection never opened
        ConnectionTimeoutError                        connecting (``connect`` budget)
    after the request may have been written: MaybeReceived
        ServerDisconnectedError, ClientOSError (any other, reset included),
        ClientPayloadError, SocketTimeoutError (read), asyncio.TimeoutError (the
        total backstop), any other aiohttp.ClientError, any other Exception
    never sendable, checked here before anything is sent: Unsendable
        a header name or value that is not ASCII or holds a control character (CR/LF),
        a body JSON cannot carry (NaN, a value of no JSON type), a URL that is not
        http(s) with a host

Connecting cannot run into the total timeout: the ``connect`` budget (which covers
opening the socket and the TLS handshake) always ends first, as ConnectionTimeoutError;
the total, a backstop for a write that never drains, is twice it plus a second.
Requests beyond ``max_in_flight`` wait on a semaphore here, not in aiohttp's pool, so
waiting for a free connection never spends the connect budget.

Nothing is sent twice behind the caller's back: redirects are not followed (a 307 would
re-send the body elsewhere), and aiohttp's silent retry of an idempotent method (GET,
PUT, DELETE...) after a dropped keep-alive connection is switched off (see
:meth:`Transport._open`).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from yarl import URL

from dispatcher.provider import spans
from kit import telemetry


class NotSent(Exception):
    """Provably no byte of the request was written: safe to send again."""


class MaybeReceived(Exception):
    """The request may have reached the provider: its outcome is unknown."""


class Unsendable(Exception):
    """The request cannot be put on the wire, so nothing was sent (and never will be).

    Its text is the type of what was wrong, never the value: a header value may be a
    credential."""

    def __init__(self, cause: Exception) -> None:
        super().__init__(type(cause).__name__)
        self.cause = cause


@dataclass(frozen=True, slots=True)
class Reply:
    """A provider's answer, read in full."""

    status: int
    headers: Mapping[str, str]
    """Case-insensitive, as the server sent them."""
    body: bytes


def failure(exc: Exception) -> NotSent | MaybeReceived:
    """What a failed send means, from the exception's type (the table above)."""
    name = type(exc).__name__
    # ConnectionTimeoutError is a ServerTimeoutError, hence an asyncio.TimeoutError:
    # it must be matched before any other timeout.
    if isinstance(exc, aiohttp.ClientConnectorError | aiohttp.ConnectionTimeoutError):
        return NotSent(f"not sent: {name}")
    return MaybeReceived(f"sent, no answer: {name}")


def json_body(value: Any) -> bytes:
    """``value`` as a JSON body; :class:`Unsendable` when JSON cannot carry it."""
    try:
        return json.dumps(value, allow_nan=False, separators=(",", ":")).encode()
    except (ValueError, TypeError, RecursionError) as exc:
        raise Unsendable(exc) from exc


# Anything but a tab among the control characters: CR or LF would end the header (or
# inject one), the others no server reads as intended.
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


def _check_headers(headers: Mapping[str, str]) -> None:
    for name, value in headers.items():
        # Non-ASCII raises UnicodeEncodeError here: aiohttp itself would send UTF-8.
        name.encode("ascii")
        value.encode("ascii")
        if _CONTROL.search(name) or _CONTROL.search(value) or not name:
            raise ValueError("a header holds a control character")


def _url(url: str) -> URL:
    parsed = URL(url)
    if parsed.scheme not in ("http", "https") or not parsed.raw_host:
        raise ValueError("not an http(s) URL with a host")
    return parsed


class Transport:
    """One aiohttp session (one pool of kept-alive connections) per process, shared by
    every sender: the worker's client, the reconciler's lookups, compensations and
    re-sends. Opened on first use (aiohttp wants a running loop); close it with
    :meth:`close` or ``async with``."""

    def __init__(self, max_in_flight: int = 64) -> None:
        self.max_in_flight = max(max_in_flight, 1)
        self._slots = asyncio.Semaphore(self.max_in_flight)
        self._session: aiohttp.ClientSession | None = None
        self._closed = False
        self._timeouts: dict[float, aiohttp.ClientTimeout] = {}

    async def __aenter__(self) -> Transport:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        self._closed = True
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _open(self) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(
            limit=self.max_in_flight,
            limit_per_host=0,
            # Shorter than a provider's idle timeout, so a pooled connection is not
            # reused just as the server closes it.
            keepalive_timeout=2.0,
        )
        session = aiohttp.ClientSession(
            connector=connector,
            # Providers' cookies must not travel from one call to the next.
            cookie_jar=aiohttp.DummyCookieJar(),
            trust_env=False,
        )
        # aiohttp re-sends a GET, PUT or DELETE once, silently, when a kept-alive
        # connection fails (aiohttp/client.py, ``retry_persistent_connection``); a PUT
        # may be a side effect and its first send may have been received. Only this
        # private attribute turns that off (aiohttp's own test client sets it too);
        # tests/worker/test_provider_transport.py proves no second request is sent.
        session._retry_connection = False
        return session

    def _timeout(self, seconds: float) -> aiohttp.ClientTimeout:
        timeout = self._timeouts.get(seconds)
        if timeout is None:
            # sock_read starts once the request is written; see the module's docstring
            # for why total can never end a connect.
            timeout = aiohttp.ClientTimeout(
                total=2 * seconds + 1, connect=seconds, sock_read=seconds
            )
            self._timeouts[seconds] = timeout
        return timeout

    async def send(
        self,
        method: str,
        url: str,
        *,
        headers: Mapping[str, str],
        body: bytes | None = None,
        timeout_seconds: float,
    ) -> Reply:
        """Send one request (``body`` is JSON, from :func:`json_body`) and read the
        whole answer. Raises :class:`Unsendable`, :class:`NotSent` or
        :class:`MaybeReceived` only."""
        try:
            _check_headers(headers)
            target = _url(url)
        except (ValueError, TypeError) as exc:
            raise Unsendable(exc) from exc
        if body is not None:
            headers = {**headers, "Content-Type": "application/json"}
        if self._session is None:
            if self._closed:
                # A caller's bug, not a transport failure: it is left unclassified.
                raise RuntimeError("the provider transport is closed")
            self._session = self._open()
        # Checked once a request: without an exporter no span is made at all.
        span = spans.client_span(method, target) if telemetry.enabled() else None
        if span is not None and span.is_recording():
            headers = {**headers, "traceparent": spans.traceparent_header(span) or ""}
        async with self._slots:
            try:
                async with self._session.request(
                    method,
                    target,
                    headers=headers,
                    data=body,
                    allow_redirects=False,
                    timeout=self._timeout(timeout_seconds),
                ) as response:
                    content = await response.read()
                    if span is not None:
                        spans.answered(span, response.status)
                    return Reply(response.status, response.headers, content)
            except Exception as exc:
                if span is not None:
                    spans.failed(span, exc)
                raise failure(exc) from exc
            finally:
                if span is not None:
                    span.end()
