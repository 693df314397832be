"""What every console page stands on: the signed-in operator, form posts with their
CSRF token, rendering with the security headers, and errors shown as pages.

Errors come from the one tree (:mod:`dispatcher.errors`): a page shows the same
status, code, title and detail the HTTP API would send as problem+json.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any
from urllib.parse import parse_qsl, quote, urlsplit

from fastapi import Depends, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.routing import APIRoute
from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.console import formats, session_rows
from dispatcher.console.session import Session, SessionCodec
from dispatcher.control.principals import Keyring, Principal
from dispatcher.errors import CsrfRejected, DispatcherError, ValidationFailed
from dispatcher.schemas import check_identifier
from dispatcher.settings import Scope, Settings
from dispatcher.views import overview

# No inline script or style, nothing from another origin, no framing, and forms post
# only back here: an id or input that slipped past escaping still could not run.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    # Not "no-referrer": under it Chromium sends "Origin: null" with every form post,
    # which same_origin() rightly refuses, so no form of the console could be used.
    # "same-origin" still tells no other site which console page linked to it.
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
    "X-Frame-Options": "DENY",
}
_MAX_FIELDS = 20


@dataclass(frozen=True, slots=True)
class Console:
    """The console's parts, kept on ``app.state.console``."""

    codec: SessionCodec
    keyring: Keyring
    templates: Environment

    @classmethod
    def of(cls, settings: Settings, keyring: Keyring) -> Console:
        secret = settings.console_secret
        codec = SessionCodec(
            secret.get_secret_value().encode() if secret else secrets.token_bytes(32),
            max_age_seconds=settings.console_session_seconds,
            secure=settings.console_secure_cookie,
        )
        env = Environment(
            loader=PackageLoader("dispatcher.console", "templates"),
            autoescape=select_autoescape(default=True, default_for_string=True),
            undefined=StrictUndefined,
            enable_async=False,
        )
        env.filters.update(formats.FILTERS)
        env.globals["link"] = formats.link
        return cls(codec, keyring, env)


@dataclass(frozen=True, slots=True)
class Viewer:
    """The signed-in operator and what the page needs to know about them."""

    principal: Principal
    session: Session
    csrf: str
    counts: overview.NavCounts

    def may(self, scope: Scope) -> bool:
        return self.principal.may(scope)


class SignInRequired(Exception):
    """No valid session: the page answers with the sign-in form instead."""


def console_of(request: Request) -> Console:
    console: Console = request.app.state.console
    return console


def sessions_of(request: Request) -> async_sessionmaker[AsyncSession]:
    sessions: async_sessionmaker[AsyncSession] = request.app.state.sessions
    return sessions


def settings_of(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


async def _viewer(request: Request) -> Viewer:
    console = console_of(request)
    session = console.codec.read(request.cookies.get(console.codec.cookie_name))
    # The cookie's signature and the configured keys first: a forged cookie, or one of
    # a key removed from the configuration, costs no database round trip.
    principal = None if session is None else console.keyring.by_hash(session.key_hash)
    if session is None or principal is None:
        raise SignInRequired
    async with sessions_of(request)() as db:
        if not await session_rows.is_live(db, session):
            raise SignInRequired
        principal.require("read")
        counts = await overview.nav_counts(db, principal.tenant)
    viewer = Viewer(principal, session, console.codec.csrf_token(session), counts)
    request.state.viewer = viewer
    return viewer


Signed = Annotated[Viewer, Depends(_viewer)]


def same_origin(request: Request) -> bool:
    """A browser names the page a form came from in Origin (or at least Referer);
    either, when sent, must be this host."""
    sent = request.headers.get("origin") or request.headers.get("referer")
    if sent is None or sent == "null":
        return sent is None
    return urlsplit(sent).netloc == request.headers.get("host")


async def read_form(request: Request) -> dict[str, str]:
    """A urlencoded form's fields (last value wins), refused unless same-origin."""
    if not same_origin(request):
        raise CsrfRejected("this form was posted from another site")
    media = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if media != "application/x-www-form-urlencoded":
        raise ValidationFailed("a console form is sent as application/x-www-form-urlencoded")
    try:
        text = (await request.body()).decode("utf-8")
        return dict(parse_qsl(text, keep_blank_values=True, max_num_fields=_MAX_FIELDS))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ValidationFailed("the form could not be read") from exc


async def checked_form(request: Request, viewer: Viewer, scope: Scope) -> dict[str, str]:
    """The form of an action: same origin, the session's CSRF token, and ``scope``.
    Checked before anything is read from the database or written."""
    try:
        fields = await read_form(request)
    except ValidationFailed as exc:
        # No readable form means no token: refused as any tokenless post is.
        raise CsrfRejected(f"no form token could be read ({exc.detail})") from exc
    if not console_of(request).codec.csrf_ok(viewer.session, fields.get("csrf")):
        raise CsrfRejected("the form's token is missing or not this session's")
    viewer.principal.require(scope)
    return fields


def identifier(value: str, what: str) -> str:
    """A path id held to the identifier contract, as the API holds it (400, not 500)."""
    try:
        return check_identifier(value)
    except ValueError as exc:
        raise ValidationFailed(f"the {what} is not a valid identifier: {exc}", field=what) from exc


def secured(response: Response) -> Response:
    response.headers.update(_HEADERS)
    return response


def render(request: Request, template: str, *, status: int = 200, **context: Any) -> Response:
    page = console_of(request).templates.get_template(template)
    html = page.render(
        viewer=getattr(request.state, "viewer", None),
        now=datetime.now(UTC),
        path=request.url.path,
        query=dict(request.query_params),
        **context,
    )
    return secured(HTMLResponse(html, status_code=status))


def redirect(to: str, **query: str) -> Response:
    """303 See Other after an action, so a reload repeats the read, not the post."""
    if query:
        to += "?" + "&".join(f"{k}={quote(v, safe='')}" for k, v in query.items())
    return secured(RedirectResponse(to, status_code=303))


def error_page(request: Request, exc: DispatcherError) -> Response:
    return render(request, "problem.html", status=exc.status, problem=exc, back=_back(request))


def _back(request: Request) -> str:
    # Back to the page the action was on (same-origin only), else the home page.
    referer = request.headers.get("referer")
    if referer and urlsplit(referer).netloc == request.headers.get("host"):
        parts = urlsplit(referer)
        return parts.path + (f"?{parts.query}" if parts.query else "")
    return "/console/"


Handler = Callable[[Request], Coroutine[Any, Any, Response]]


class ConsoleRoute(APIRoute):
    """Every console route: no session sends the sign-in form, an error of the tree is
    shown as a page with its status, a malformed path or query id as a 400 page."""

    def get_route_handler(self) -> Handler:
        handler = super().get_route_handler()

        async def guarded(request: Request) -> Response:
            try:
                return await handler(request)
            except SignInRequired:
                target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
                return redirect("/console/login", next=target)
            except DispatcherError as exc:
                return error_page(request, exc)
            except RequestValidationError as exc:
                return error_page(request, ValidationFailed(_invalid(exc.errors())))

        return guarded


def _invalid(errors: Any) -> str:
    first: Mapping[str, Any] = errors[0] if errors else {}
    where = ".".join(str(p) for p in first.get("loc", ()))
    return f"{where}: {first.get('msg', 'not valid')}" if where else "the request is not valid"
