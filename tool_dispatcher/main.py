"""The `tool-dispatcher` command: the one place its subcommands are put together.

It sits above every package of the service (:mod:`dispatcher`, :mod:`reconciler`,
:mod:`outbox_relay`) and imports each subcommand directly. The development commands
(sandbox, up, demo, chaos) are not here: they are ``python -m devtools ...``, outside
the product."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import secrets
import sys
from collections.abc import Callable, Sequence

from pydantic import ValidationError

from dispatcher import runtime, tracing
from dispatcher.capabilities import CapabilityRegistry
from dispatcher.db import migrate
from dispatcher.db.errors import DbErrorClass, classify
from dispatcher.logs import configure_logging
from dispatcher.settings import Settings, hash_api_key, load_settings
from kit import telemetry
from kit.cli import OneLineArgumentParser, fail
from kit.heap import prepare_service_heap
from kit.signals import until_signal
from tool_dispatcher import (
    approvals,
    archive,
    capabilities,
    escalations,
    operations,
    outbox,
    reconcile,
    retention,
    runs,
    webhooks,
)
from tool_dispatcher.ops_server import process_ops
from tool_dispatcher.parsing import require_registry

# A subcommand with a module of its own adds its parser there, which sets ``handler``.
Handler = Callable[[argparse.Namespace, Settings], int]

# The service's processes: each exports traces (when the settings turn them on), with
# the process name its spans carry (service.name tool-dispatcher-<name>), and prepares
# its heap for a long life (kit.heap).
TRACED = {
    "serve": "api",
    "worker": "worker",
    "bus-intake": "bus-intake",
    "relay": "relay",
    "reconcile": "reconciler",
    "approvals": "approvals",
    "recover": "recovery",
    "webhooks": "webhooks",
}


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineArgumentParser(prog="tool-dispatcher", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineArgumentParser)
    m = sub.add_parser("migrate", help="apply (or revert) schema migrations")
    m.add_argument("--revision", default="head")
    m.add_argument("--downgrade", action="store_true", help="revert to --revision (e.g. base)")
    m.add_argument(
        "--check", action="store_true", help="exit 0 if the schema is at head, 1 if not; no change"
    )
    sub.add_parser("serve", help="serve the HTTP API (needs a configured database)")
    sub.add_parser("worker", help="consume dispatch commands and call providers")
    sub.add_parser("bus-intake", help="record tool calls submitted on the request topics")
    sub.add_parser("relay", help="publish outbox rows to Kafka")
    outbox.add_parser(sub)
    r = sub.add_parser("recover", help="apply the crash-recovery rule to expired claims")
    r.add_argument("--once", action="store_true", required=True, help="one sweep, then exit")
    sub.add_parser("api-key", help="print a new API key and the settings line for its hash")
    for command in (
        reconcile, escalations, approvals, retention, archive, runs, capabilities, operations
    ):  # fmt: skip
        command.register(sub)
    webhooks.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    try:
        settings = load_settings()
    except ValidationError as exc:
        first = exc.errors()[0]
        fail(f"bad setting {'.'.join(str(p) for p in first['loc'])}: {first['msg']}")
    # The key and its settings line are the output; log lines would only get between.
    configure_logging(settings, quiet=args.command == "api-key")
    try:
        if args.command in TRACED:
            tracing.start(settings, TRACED[args.command])
    except ValueError as exc:
        fail(f"bad traces setting: {exc}")
    if args.command in TRACED:
        prepare_service_heap()
    try:
        return _run(args, settings)
    except KeyboardInterrupt:
        return 130
    finally:
        # The spans still queued leave before the process does (SIGTERM included: every
        # service stops through its stop event and returns here).
        telemetry.shutdown()


def _run(args: argparse.Namespace, settings: Settings) -> int:
    handler: Handler | None = getattr(args, "handler", None)
    if handler is not None:
        return handler(args, settings)
    if args.command == "api-key":
        return _api_key()
    if settings.database_url is None:
        fail("TOOL_DISPATCHER_DATABASE_URL is not set (or run `make up` for a local stack)")
    if args.command == "migrate" and args.check:
        return _migrate_check(settings.database_url)
    if args.command == "migrate":
        action = migrate.downgrade if args.downgrade else migrate.upgrade
        action(settings.database_url, args.revision)
        print(f"migrated to {args.revision}")
        return 0
    if args.command == "outbox":
        return runtime.run(outbox.run(args, settings.database_url), settings)
    if args.command == "relay":
        return _relay(settings)
    registry = require_registry(settings)
    if args.command == "serve":
        from dispatcher.api.server import api_server

        runtime.run(api_server(settings, registry).serve(), settings)
        return 0
    if args.command == "recover":
        return runtime.run(_recover_once(settings, registry), settings)
    if settings.kafka_bootstrap is None:
        fail("TOOL_DISPATCHER_KAFKA_BOOTSTRAP is not set (or run `make up` for a local stack)")
    if args.command == "worker":
        return runtime.run(until_signal(lambda stop: _worker(settings, registry, stop)), settings)
    if args.command == "bus-intake":
        if not settings.bus.topics:
            fail(
                "no request topics: set TOOL_DISPATCHER_BUS__TOPICS (a JSON object, topic: tenant)"
            )
        return runtime.run(until_signal(lambda stop: _bus(settings, registry, stop)), settings)
    raise AssertionError(args.command)


async def _worker(settings: Settings, registry: CapabilityRegistry, stop: asyncio.Event) -> None:
    """The worker inside its ops endpoints, up before it waits for the broker: alive
    (/healthz) while it waits, ready (/readyz) only once it joined its group."""
    from dispatcher.operations.processor import serve_operations
    from dispatcher.worker.consumer import run_worker

    async with process_ops(settings, "worker", broker=True) as ops:
        # Bulk operations are worked beside the consumer, each batch under a lease any
        # worker may take over (dispatcher.operations.processor). On a stop the batch in
        # flight finishes; should the consumer fail, the loop is cancelled (its batch
        # rolls back) and the consumer's own error is what the process reports.
        bulk = asyncio.create_task(serve_operations(settings, registry, stop))
        try:
            await run_worker(settings, registry, stop, ops=ops)
        finally:
            if not stop.is_set():
                bulk.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await bulk


async def _bus(settings: Settings, registry: CapabilityRegistry, stop: asyncio.Event) -> None:
    """Bus intake inside its ops endpoints: ready once it joined its group and while the
    database answers (it pauses its partitions when it does not)."""
    from dispatcher.bus.consumer import run_bus_intake

    async with process_ops(settings, "bus-intake", broker=True) as ops:
        await run_bus_intake(settings, registry, stop, ops=ops)


def _relay(settings: Settings) -> int:
    """The relay knows outbox rows and Kafka, nothing about tool calls: no registry."""
    from dispatcher.relay_process import relay_config, run_relay_process

    if settings.kafka_bootstrap is None:
        fail("TOOL_DISPATCHER_KAFKA_BOOTSTRAP is not set (or run `make up` for a local stack)")
    try:
        config = relay_config(settings)
    except ValueError as exc:
        fail(f"bad relay setting: {exc}")

    async def relay(stop: asyncio.Event) -> None:
        async with process_ops(settings, "relay", broker=True):
            await run_relay_process(settings, config, stop)

    return runtime.run(until_signal(relay), settings)


async def _recover_once(settings: Settings, registry: CapabilityRegistry) -> int:
    from dispatcher.db.engine import create_engine, session_factory
    from dispatcher.worker.recovery import recover_expired

    engine = create_engine(settings)
    try:
        report = await recover_expired(session_factory(engine), registry, topics=settings.topics())
    finally:
        await engine.dispose()
    print(
        f"recovered {report.total}: {len(report.redispatched)} re-dispatched, "
        f"{len(report.marked_unknown)} marked result_unknown"
    )
    return 0


def _migrate_check(database_url: str) -> int:
    """The init containers' gate: pods wait (exit 1, one line) until the schema is at
    head, so no process runs against a schema older than its code. A schema a newer
    release migrated (a revision this code does not know) passes: during a rolling
    upgrade the old pods keep running on the expanded schema (deploy/README.md)."""
    try:
        current, head, known = migrate.schema_state(database_url)
    except Exception as exc:
        if classify(exc) is not DbErrorClass.UNAVAILABLE:
            raise
        fail(f"cannot reach the database: {type(exc).__name__}", 1)
    if not known:
        print(f"the schema is at {current}, newer than this release's head {head}", file=sys.stderr)
    elif current != head:
        fail(f"the schema is at {current or 'no revision'}, not at head {head}", 1)
    return 0


def _api_key() -> int:
    key = "tdk_" + secrets.token_urlsafe(32)
    print(key)
    print(
        f'TOOL_DISPATCHER_API_KEYS=\'[{{"sha256":"{hash_api_key(key)}",'
        f'"tenant":"<tenant>","scopes":["submit","read"]}}]\''
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
