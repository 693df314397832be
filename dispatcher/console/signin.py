"""Signing in with an API key and out again."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from dispatcher.console import session_rows
from dispatcher.console.web import (
    ConsoleRoute,
    Signed,
    checked_form,
    console_of,
    read_form,
    redirect,
    render,
    sessions_of,
    settings_of,
)

router = APIRouter(route_class=ConsoleRoute, include_in_schema=False)


def _next(value: str | None) -> str:
    # Only a console path: an open redirect would let a link sign you in elsewhere.
    if value and value.startswith("/console/") and not value.startswith("//"):
        return value
    return "/console/"


@router.get("/console/login")
async def sign_in_form(request: Request) -> Response:
    return _form(request, request.query_params.get("next"))


def _form(request: Request, target: str | None, refused: str = "") -> Response:
    minutes = settings_of(request).console_session_seconds // 60
    return render(
        request,
        "login.html",
        status=401 if refused else 200,
        next=_next(target),
        refused=refused,
        session_minutes=minutes,
    )


@router.post("/console/login")
async def sign_in(request: Request) -> Response:
    # No session yet, so no CSRF token: read_form still refuses another site's post,
    # which would otherwise sign the victim in as the attacker.
    fields = await read_form(request)
    console = console_of(request)
    found = console.keyring.by_key(fields.get("key", "").strip())
    if found is None:
        return _form(request, fields.get("next"), "That API key is not valid.")
    digest, principal = found
    if not principal.may("read"):
        return _form(request, fields.get("next"), "That API key lacks the 'read' scope.")
    session, value = console.codec.issue(digest)
    async with sessions_of(request)() as db:
        await session_rows.start(db, session, seconds=console.codec.max_age_seconds)
    response = redirect(_next(fields.get("next")))
    response.set_cookie(**console.codec.cookie(value))
    return response


@router.post("/console/logout")
async def sign_out(request: Request, viewer: Signed) -> Response:
    await checked_form(request, viewer, "read")
    # Deleting the row is what signs out: clearing the cookie below only tidies this
    # browser, and a copy of the cookie held elsewhere would still be valid without it.
    async with sessions_of(request)() as db:
        await session_rows.end(db, viewer.session)
    response = redirect("/console/login")
    codec = console_of(request).codec
    response.delete_cookie(
        codec.cookie_name, path="/", secure=codec.secure, httponly=True, samesite="strict"
    )
    return response
