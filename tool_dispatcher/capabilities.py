"""`tool-dispatcher capabilities list|pause|resume`: hold a capability's calls while its
provider is down, from a shell.

Talks to the database directly, as an operator of every tenant: ``--tenant`` names whose
calls a pause holds, ``--every-tenant`` holds them all. A pause of a paused scope (or a
resume of an active one) changes nothing and says so. Bad input, an unknown capability
or a missing setting exit 2 with one line on stderr; an unreachable database 1.
"""

from __future__ import annotations

import argparse
from typing import Any

from dispatcher import runtime
from dispatcher.capabilities import CapabilityRegistry
from dispatcher.capability_views import CapabilityView, PauseRequest
from dispatcher.control import pauses
from dispatcher.control.actor import Actor
from dispatcher.db.engine import create_engine, session_factory
from dispatcher.db.errors import DbErrorClass, classify
from dispatcher.errors import DispatcherError
from dispatcher.settings import Settings
from dispatcher.states import CapabilityStatus
from kit.cli import OneLineArgumentParser, fail
from tool_dispatcher.parsing import require_registry


def register(subparsers: Any) -> None:
    """Add the ``capabilities`` command to the `tool-dispatcher` parser."""
    parser = subparsers.add_parser("capabilities", help="pause and resume capabilities")
    sub = parser.add_subparsers(
        dest="capabilities_command", required=True, parser_class=OneLineArgumentParser
    )
    listing = sub.add_parser("list", help="the registry, paused or active, for one tenant")
    listing.add_argument("--tenant", required=True, help="as this tenant sees them")
    for verb, text in (
        ("pause", "hold the capability's calls in authorized until it is resumed"),
        ("resume", "send the capability's calls again (those that waited go at once)"),
    ):
        command = sub.add_parser(verb, help=text)
        command.add_argument("capability_id")
        whose = command.add_mutually_exclusive_group(required=True)
        whose.add_argument("--tenant", help="only this tenant's calls")
        whose.add_argument("--every-tenant", action="store_true", help="every tenant's calls")
        command.add_argument("--reason", required=True)
        command.add_argument("--by", default="operator", help="who is acting")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace, settings: Settings) -> int:
    """Run one ``capabilities`` subcommand."""
    if settings.database_url is None:
        fail("TOOL_DISPATCHER_DATABASE_URL is not set")
    if getattr(args, "reason", "x").strip() == "":
        fail("--reason must not be empty")
    registry = require_registry(settings)
    try:
        return runtime.run(_run(args, settings, registry), settings)
    except DispatcherError as exc:
        fail(exc.detail)
    except Exception as exc:
        if classify(exc) is not DbErrorClass.UNAVAILABLE:
            raise
        fail(f"cannot reach the database: {type(exc).__name__}", 1)


async def _run(args: argparse.Namespace, settings: Settings, registry: CapabilityRegistry) -> int:
    engine = create_engine(settings)
    sessions = session_factory(engine)
    try:
        if args.capabilities_command == "list":
            async with sessions() as session:
                found = await pauses.list_capabilities(session, registry, tenant=args.tenant)
            for view in found.capabilities:
                print(_line(view))
            return 0
        target = (
            CapabilityStatus.PAUSED
            if args.capabilities_command == "pause"
            else CapabilityStatus.ACTIVE
        )
        request = PauseRequest(reason=args.reason, every_tenant=args.every_tenant)
        async with sessions() as session, session.begin():
            change = await pauses.change_capability(
                session,
                args.capability_id,
                request,
                target,
                # For every tenant, the view shows the scope itself.
                tenant=args.tenant or "",
                actor=Actor(args.by, None, "cli"),
                registry=registry,
                topics=settings.topics(),
            )
        await pauses.after_change(sessions, change, target)
        verb = "paused" if target is CapabilityStatus.PAUSED else "resumed"
        print(f"{args.capability_id} {verb}" if change.changed else f"unchanged: already {verb}")
        return 0
    finally:
        await engine.dispose()


def _line(view: CapabilityView) -> str:
    held = "; ".join(
        f"{'every tenant' if p.every_tenant else 'this tenant'} since {p.since:%Y-%m-%d %H:%M:%S}"
        f" by {p.by.get('name')}: {p.reason!r}"
        for p in view.pauses
    )
    return f"{view.capability_id} {view.status.value} waiting={view.waiting}" + (
        f" ({held})" if held else ""
    )
