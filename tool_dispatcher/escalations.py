"""`tool-dispatcher escalations list|ack|resolve`: the on-call queue from a shell.

Registered through the ``tool_dispatcher.commands`` entry-point group like any other
plugin command. Talks to the database directly (operators are not tenants: every
tenant's escalations are visible). Bad input, an unknown escalation or a missing
database setting exit 2 with one line on stderr; resolving a resolved escalation
exits 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from dispatcher import runtime
from dispatcher.control import escalations
from dispatcher.control.actor import Actor
from dispatcher.db.engine import create_engine, session_factory
from dispatcher.db.errors import DbErrorClass, classify
from dispatcher.errors import DispatcherError, EscalationAlreadyResolved
from dispatcher.schemas import EscalationView, Finding
from dispatcher.settings import Settings
from dispatcher.states import EscalationStatus
from dispatcher.views import queues
from kit.cli import OneLineArgumentParser, fail


def register(subparsers: Any) -> None:
    """Add the ``escalations`` command to the `tool-dispatcher` parser."""
    parser = subparsers.add_parser("escalations", help="the on-call escalation queue")
    sub = parser.add_subparsers(
        dest="escalations_command", required=True, parser_class=OneLineArgumentParser
    )
    listing = sub.add_parser(
        "list",
        help="escalations, open ones first, a page at a time",
        description="Escalations, open ones first, then acknowledged, then resolved; oldest "
        "first within each. When more follow, the last line is 'next: <cursor>' (on stderr "
        "with --json): pass it as --after for the next page.",
    )
    listing.add_argument("--status", choices=[s.value for s in EscalationStatus])
    listing.add_argument("--tenant")
    listing.add_argument("--limit", type=int, default=100)
    listing.add_argument("--after", help="the cursor a page before ended with (its 'next:')")
    listing.add_argument("--json", action="store_true", help="one JSON object per line")
    ack = sub.add_parser("ack", help="take ownership of an escalation")
    ack.add_argument("escalation_id")
    ack.add_argument("--by", default="operator", help="who is acknowledging")
    res = sub.add_parser("resolve", help="settle the escalated call by your finding")
    res.add_argument("escalation_id")
    res.add_argument("--finding", required=True, choices=[f.value for f in Finding])
    res.add_argument("--reason", required=True)
    res.add_argument("--by", default="operator", help="who is resolving")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace, settings: Settings) -> int:
    """Run one ``escalations`` subcommand."""
    if settings.database_url is None:
        fail("TOOL_DISPATCHER_DATABASE_URL is not set")
    if args.escalations_command == "resolve" and not args.reason.strip():
        fail("--reason must not be empty")
    if args.escalations_command == "list" and args.limit < 1:
        fail("--limit must be at least 1")
    try:
        return runtime.run(_run(args, settings), settings)
    except EscalationAlreadyResolved as exc:
        fail(exc.detail, 1)
    except DispatcherError as exc:
        fail(exc.detail)
    except Exception as exc:
        if classify(exc) is not DbErrorClass.UNAVAILABLE:
            raise
        fail(f"cannot reach the database: {type(exc).__name__}", 1)


async def _run(args: argparse.Namespace, settings: Settings) -> int:
    engine = create_engine(settings)
    sessions = session_factory(engine)
    actor = Actor(getattr(args, "by", "operator"), None, "cli")
    try:
        if args.escalations_command == "list":
            await _list(args, sessions)
            return 0
        async with sessions() as session, session.begin():
            if args.escalations_command == "ack":
                view = await escalations.acknowledge(
                    session, args.escalation_id, actor=actor, topics=settings.topics()
                )
            else:
                view = await escalations.resolve(
                    session,
                    args.escalation_id,
                    finding=Finding(args.finding),
                    reason=args.reason,
                    actor=actor,
                    topics=settings.topics(),
                )
        print(_line(view))
        return 0
    finally:
        await engine.dispose()


async def _list(args: argparse.Namespace, sessions: Any) -> None:
    """One page of the queue, then the cursor of the next one if there is one."""
    status = EscalationStatus(args.status) if args.status else None
    after = queues.parse_escalation_after(args.after) if args.after else None
    async with sessions() as session:
        # One more than the page: its presence says a next page exists, without a count.
        found = await queues.list_escalations(
            session, tenant=args.tenant, status=status, limit=args.limit + 1, after=after
        )
    page = found[: args.limit]
    for view in page:
        print(_json(view) if args.json else _line(view))
    if len(found) > args.limit:
        # Kept off stdout with --json, whose every line is an escalation.
        following = f"next: {queues.escalation_position(page[-1]).token()}"
        print(following, file=sys.stderr if args.json else sys.stdout)


def _line(view: EscalationView) -> str:
    outcome = f" finding={view.finding.value}" if view.finding else ""
    return (
        f"{view.escalation_id} {view.status.value} call={view.tool_call_id} "
        f"tenant={view.tenant} episode={view.episode}{outcome} reason={view.reason!r}"
    )


def _json(view: EscalationView) -> str:
    return json.dumps(view.model_dump(by_alias=True, mode="json"), separators=(",", ":"))
