"""`tool-dispatcher operations run|show|cancel`: bulk operations from a shell.

Talks to the database directly, as the other operator commands do (an operator at the
shell is not a tenant: ``--tenant`` names whose calls, ``--every-tenant`` all of them).
``run`` counts first (``--dry-run`` stops there), asks before it records the operation
unless ``--yes``, then follows its progress with a live bar until it finishes. The
workers do the work; ``--foreground`` has this process do it instead, under the same
lease, so a killed CLI is resumed by a worker. Bad input exits 2 with one line;
cancelling a finished operation exits 1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from pydantic import ValidationError
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from dispatcher import runtime
from dispatcher.control.actor import Actor
from dispatcher.db.engine import create_engine, session_factory
from dispatcher.db.errors import DbErrorClass, classify
from dispatcher.errors import DispatcherError, OperationFinished
from dispatcher.operations import service
from dispatcher.operations.models import (
    DeadLetterSample,
    DryRunView,
    OperationKind,
    OperationRequest,
    OperationView,
)
from dispatcher.operations.processor import claim, processor_of, work_through
from dispatcher.schemas import Finding
from dispatcher.settings import Settings
from dispatcher.states import ExecutionStatus, OperationState
from kit.cli import OneLineArgumentParser, fail
from tool_dispatcher.parsing import require_registry

POLL_SECONDS = 0.25
EVERY_TENANT = ""
"""The submitter tenant of an operation over every tenant's calls (its webhook then
goes to every tenant's subscribers)."""


def register(subparsers: Any) -> None:
    """Add the ``operations`` command to the `tool-dispatcher` parser."""
    parser = subparsers.add_parser("operations", help="bulk operations over filtered calls")
    sub = parser.add_subparsers(
        dest="operations_command", required=True, parser_class=OneLineArgumentParser
    )
    run_ = sub.add_parser("run", help="count, then run an operation and follow its progress")
    run_.add_argument("kind", choices=[k.value for k in OperationKind])
    run_.add_argument("--reason", required=True)
    whose = run_.add_mutually_exclusive_group(required=True)
    whose.add_argument("--tenant")
    whose.add_argument("--every-tenant", action="store_true")
    run_.add_argument("--capability")
    run_.add_argument("--status", action="append", choices=[s.value for s in ExecutionStatus])
    run_.add_argument("--last-error", help="the start of the calls' last error")
    run_.add_argument("--since", help="last changed at or after (ISO 8601 with offset)")
    run_.add_argument("--until", help="last changed before (ISO 8601 with offset)")
    run_.add_argument("--run", dest="run_id")
    run_.add_argument("--new-idempotency-key", action="store_true")
    run_.add_argument("--finding", choices=[f.value for f in Finding])
    run_.add_argument("--dry-run", action="store_true", help="count and show a sample only")
    run_.add_argument("--yes", action="store_true", help="do not ask before running")
    run_.add_argument("--foreground", action="store_true", help="do the work in this process")
    run_.add_argument("--no-wait", action="store_true", help="print the id and return")
    run_.add_argument("--by", default="operator", help="who is running it")
    show = sub.add_parser("show", help="an operation and its progress")
    show.add_argument("operation_id")
    show.add_argument("--json", action="store_true")
    show.add_argument("--follow", action="store_true", help="a live bar until it finishes")
    cancel = sub.add_parser("cancel", help="stop an operation after its batch in flight")
    cancel.add_argument("operation_id")
    cancel.add_argument("--by", default="operator")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace, settings: Settings) -> int:
    """Run one ``operations`` subcommand."""
    if settings.database_url is None:
        fail("TOOL_DISPATCHER_DATABASE_URL is not set")
    try:
        return runtime.run(_run(args, settings), settings)
    except OperationFinished as exc:
        fail(exc.detail, 1)
    except DispatcherError as exc:
        fail(exc.detail)
    except Exception as exc:
        if classify(exc) is not DbErrorClass.UNAVAILABLE:
            raise
        fail(f"cannot reach the database: {type(exc).__name__}", 1)


def request_of(args: argparse.Namespace, *, dry_run: bool) -> OperationRequest:
    """The API's body from the command line's flags (validated the same way)."""
    filter_ = {
        "tenant": args.tenant,
        "everyTenant": args.every_tenant,
        "capabilityId": args.capability,
        "status": args.status,
        "lastError": args.last_error,
        "since": args.since,
        "until": args.until,
        "runId": args.run_id,
    }
    body = {
        "kind": args.kind,
        "reason": args.reason,
        "filter": {k: v for k, v in filter_.items() if v not in (None, False)},
        "newIdempotencyKey": args.new_idempotency_key,
        "finding": args.finding,
        "dryRun": dry_run,
    }
    try:
        return OperationRequest.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        fail(f"bad operation: {'.'.join(str(p) for p in first['loc'])}: {first['msg']}")


async def _run(args: argparse.Namespace, settings: Settings) -> int:
    engine = create_engine(settings)
    sessions = session_factory(engine)
    actor = Actor(getattr(args, "by", "operator"), None, "cli")
    try:
        if args.operations_command == "show":
            return await _show(args, sessions)
        if args.operations_command == "cancel":
            async with sessions() as session, session.begin():
                view = await service.cancel(session, args.operation_id, tenant=None, actor=actor)
            print(_line(view))
            return 0
        return await _submit(args, settings, sessions, actor)
    finally:
        await engine.dispose()


async def _submit(args: argparse.Namespace, settings: Settings, sessions: Any, actor: Actor) -> int:
    tenant = EVERY_TENANT if args.every_tenant else args.tenant
    async with sessions() as session:
        dry = await service.dry_run(
            session, request_of(args, dry_run=True), tenant=tenant, admin=True
        )
    _print_dry_run(dry)
    if args.dry_run or dry.count == 0:
        return 0
    if not args.yes and not await asyncio.to_thread(_confirm, dry.count):
        print("nothing done")
        return 1
    async with sessions() as session, session.begin():
        made, _ = await service.submit(
            session, request_of(args, dry_run=False), tenant=tenant, admin=True, actor=actor
        )
    print(f"operation {made.operation_id}: {made.total} calls")
    if args.no_wait:
        return 0
    worker = None
    if args.foreground:
        p = processor_of(settings, require_registry(settings), sessions)
        if await claim(p, made.operation_id) is not None:
            worker = asyncio.create_task(work_through(p, made.operation_id))
    final = await follow(sessions, made.operation_id)
    if worker is not None:
        await worker
    print(_line(final))
    return 0 if final.state is OperationState.COMPLETED else 1


def _confirm(count: int) -> bool:
    if not sys.stdin.isatty():
        fail("not a terminal: pass --yes to run it")
    return input(f"touch {count} calls? [y/N] ").strip().lower() in ("y", "yes")


async def follow(sessions: Any, operation_id: str) -> OperationView:
    """A live bar of the operation's progress until it is finished; its last view."""
    console = Console(stderr=True)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task(operation_id, total=None)
        while True:
            async with sessions() as session:
                view = await service.show(session, operation_id, tenant=None)
            bar.update(task, total=view.total, completed=view.done + view.failed)
            if view.state is not OperationState.RUNNING:
                return view
            await asyncio.sleep(POLL_SECONDS)


async def _show(args: argparse.Namespace, sessions: Any) -> int:
    if args.follow:
        view = await follow(sessions, args.operation_id)
    else:
        async with sessions() as session:
            view = await service.show(session, args.operation_id, tenant=None)
    if args.json:
        print(json.dumps(view.model_dump(by_alias=True, mode="json"), separators=(",", ":")))
    else:
        print(_line(view))
    return 0


def _print_dry_run(view: DryRunView) -> None:
    print(f"{view.count} calls match")
    for c in view.sample:
        if isinstance(c, DeadLetterSample):
            print(f"  {c.tenant} dead letter {c.id} {c.topic} {c.key} {c.last_error}")
        else:
            print(
                f"  {c.tenant} {c.tool_call_id} {c.status.value} {c.capability_id} {c.last_error}"
            )


def _line(view: OperationView) -> str:
    return (
        f"{view.operation_id} {view.kind.value} {view.state.value} "
        f"done={view.done} refused={view.failed} total={view.total}"
    )
