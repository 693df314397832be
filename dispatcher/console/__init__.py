"""The operator console: server-rendered pages under ``/console`` in the API's own app.

Every action calls the same control functions as the HTTP API (the console writes no
facts of its own) and every page reads the recorded rows, so a reload never loses or
invents state. See docs/console.md for the pages and their safety rules.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from dispatcher.console import (
    approvals,
    calls,
    capabilities,
    escalations,
    operations,
    outbox,
    overview,
    runs,
    signin,
    webhooks,
)
from dispatcher.console.web import Console
from dispatcher.control.principals import Keyring
from dispatcher.settings import Settings

PAGES = (
    signin, escalations, approvals, runs, calls, outbox, capabilities, operations, webhooks,
    overview,
)  # fmt: skip


def install(app: FastAPI, settings: Settings, keyring: Keyring) -> None:
    """Mount the console's pages and static files on ``app``."""
    app.state.console = Console.of(settings, keyring)
    for pages in PAGES:
        app.include_router(pages.router)
    static = StaticFiles(packages=[("dispatcher.console", "static")])
    app.mount("/console/static", static, name="console-static")
