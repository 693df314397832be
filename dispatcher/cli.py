"""The `tool-dispatcher` command."""

from __future__ import annotations

import argparse
import asyncio
import logging
import secrets
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from importlib.metadata import entry_points
from typing import NoReturn

from pydantic import ValidationError

import outbox_relay
from dispatcher import migrate
from dispatcher.arguments import OneLineArgumentParser
from dispatcher.capabilities import CapabilityRegistry, load_registry
from dispatcher.sandbox import command as sandbox_command
from dispatcher.settings import Settings, hash_api_key, load_settings

# Packages above the dispatcher (the reconciler) add subcommands through this
# entry-point group, so the dispatcher never imports them. Each entry point is a
# callable taking the subparsers action; the parser it adds sets ``handler``.
COMMANDS_GROUP = "tool_dispatcher.commands"
PluginHandler = Callable[[argparse.Namespace, Settings], int]


def _fail(message: str) -> NoReturn:
    print(f"tool-dispatcher: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineArgumentParser(prog="tool-dispatcher", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineArgumentParser)
    m = sub.add_parser("migrate", help="apply (or revert) schema migrations")
    m.add_argument("--revision", default="head")
    m.add_argument("--downgrade", action="store_true", help="revert to --revision (e.g. base)")
    sub.add_parser("serve", help="serve the HTTP API (needs a configured database)")
    sub.add_parser("worker", help="consume dispatch commands and call providers")
    sub.add_parser("relay", help="publish outbox rows to Kafka")
    o = sub.add_parser("outbox", help="operate the outbox: dead letters and retention")
    o_sub = o.add_subparsers(
        dest="outbox_command", required=True, parser_class=OneLineArgumentParser
    )
    o_sub.add_parser("dead-letters", help="list dead-lettered rows and what waits behind them")
    for name, what in (
        ("retry", "publish a dead letter again"),
        ("discard", "give up a dead letter (releases its key)"),
    ):
        o_sub.add_parser(name, help=what).add_argument("row_id", type=int)
    o_sub.add_parser("purge", help="delete published rows past the retention period now")
    r = sub.add_parser("recover", help="apply the crash-recovery rule to expired claims")
    r.add_argument("--once", action="store_true", required=True, help="one sweep, then exit")
    sandbox_command.add_arguments(sub.add_parser("sandbox", help="run the sandbox provider"))
    sub.add_parser("up", help="everything on embedded defaults: database, broker, API")
    sub.add_parser("demo", help="run the stack in-process and tell the story")
    sub.add_parser("api-key", help="print a new API key and the settings line for its hash")
    for plugin in entry_points(group=COMMANDS_GROUP):
        plugin.load()(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # The demo's story is its output; the services' own logging would drown it.
    quiet = args.command in ("demo", "api-key")
    logging.basicConfig(
        level=logging.WARNING if quiet else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    if args.command == "sandbox":
        return sandbox_command.run(args)
    try:
        settings = load_settings()
    except ValidationError as exc:
        first = exc.errors()[0]
        _fail(f"bad setting {'.'.join(str(p) for p in first['loc'])}: {first['msg']}")
    try:
        return _run(args, settings)
    except KeyboardInterrupt:
        return 130


def _run(args: argparse.Namespace, settings: Settings) -> int:
    plugin_handler: PluginHandler | None = getattr(args, "handler", None)
    if plugin_handler is not None:
        return plugin_handler(args, settings)
    if args.command == "api-key":
        key = "tdk_" + secrets.token_urlsafe(32)
        print(key)
        print(
            f'TOOL_DISPATCHER_API_KEYS=\'[{{"sha256":"{hash_api_key(key)}",'
            f'"tenant":"<tenant>","scopes":["submit","read"]}}]\''
        )
        return 0
    try:
        registry = load_registry(settings.capabilities_file)
    except ValueError as exc:
        _fail(str(exc).splitlines()[0])
    if args.command == "demo":
        from dispatcher.demo import run_demo

        return asyncio.run(run_demo(settings))
    if args.command == "up":
        return asyncio.run(_up(settings, registry))
    if settings.database_url is None:
        _fail("TOOL_DISPATCHER_DATABASE_URL is not set (or use `tool-dispatcher up`)")
    if args.command == "migrate":
        action = migrate.downgrade if args.downgrade else migrate.upgrade
        action(settings.database_url, args.revision)
        print(f"migrated to {args.revision}")
        return 0
    if args.command == "serve":
        from dispatcher.serving import api_server

        asyncio.run(api_server(settings, registry).serve())
        return 0
    if args.command == "recover":
        return asyncio.run(_recover_once(settings, registry))
    if args.command == "outbox":
        return asyncio.run(_outbox(args, settings.database_url))
    if settings.kafka_bootstrap is None:
        _fail("TOOL_DISPATCHER_KAFKA_BOOTSTRAP is not set (or use `tool-dispatcher up`)")
    if args.command == "worker":
        from dispatcher.worker import run_worker

        return asyncio.run(_until_signal(lambda stop: run_worker(settings, registry, stop)))
    if args.command == "relay":
        from dispatcher.services import relay_config, run_relay_process

        config = relay_config(settings)
        return asyncio.run(_until_signal(lambda stop: run_relay_process(settings, config, stop)))
    raise AssertionError(args.command)


async def _outbox(args: argparse.Namespace, database_url: str) -> int:
    if args.outbox_command == "dead-letters":
        letters = await outbox_relay.list_dead_letters(database_url)
        for letter in letters:
            print(letter.describe())
        print(f"{len(letters)} dead letter(s)")
        return 0
    if args.outbox_command == "purge":
        print(f"purged {await outbox_relay.purge_published(database_url)} published row(s)")
        return 0
    act = (
        outbox_relay.retry_dead_letter
        if args.outbox_command == "retry"
        else outbox_relay.discard_dead_letter
    )
    if not await act(database_url, args.row_id):
        _fail(f"no dead letter with id {args.row_id}")
    print(f"dead letter {args.row_id}: {args.outbox_command} done")
    return 0


async def _until_signal(run: Callable[[asyncio.Event], Awaitable[None]]) -> int:
    """Run until SIGTERM/SIGINT sets the stop event; work in flight finishes first."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await run(stop)
    return 0


async def _recover_once(settings: Settings, registry: CapabilityRegistry) -> int:
    from dispatcher.db import create_engine, session_factory
    from dispatcher.recovery import recover_expired

    engine = create_engine(settings)
    try:
        report = await recover_expired(
            session_factory(engine),
            registry,
            dispatch_topic=settings.dispatch_topic,
            events_topic=settings.events_topic,
        )
    finally:
        await engine.dispose()
    print(
        f"recovered {report.total}: {len(report.redispatched)} re-dispatched, "
        f"{len(report.marked_unknown)} marked result_unknown"
    )
    return 0


async def _up(settings: Settings, registry: CapabilityRegistry) -> int:
    from dispatcher.sandbox import SandboxServer
    from dispatcher.services import all_services
    from dispatcher.stack import local_stack

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    async with local_stack(settings) as stack:
        s = stack.settings
        sandbox = None
        if settings.capabilities_file is None:
            # The packaged registry's capabilities call the sandbox on its default port.
            sandbox = SandboxServer(port=sandbox_command.DEFAULT_PORT)
            await sandbox.start()
        try:
            async with all_services(s, registry) as lines:
                print("tool-dispatcher is up")
                for line in stack.started:
                    print(f"  {line}")
                if sandbox is not None:
                    print(f"  sandbox provider      {sandbox.url}")
                print(f"  database              {s.database_url}")
                print(f"  kafka                 {s.kafka_bootstrap}")
                for line in lines:
                    print(f"  {line}")
                if stack.dev_api_key:
                    print(f"  dev API key (tenant 'dev'): {stack.dev_api_key}")
                print("Ctrl-C stops everything.", flush=True)
                await stop.wait()
        finally:
            if sandbox is not None:
                await sandbox.stop()
    print("stopped")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
