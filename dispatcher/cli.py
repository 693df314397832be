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
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
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
    if settings.kafka_bootstrap is None:
        _fail("TOOL_DISPATCHER_KAFKA_BOOTSTRAP is not set (or use `tool-dispatcher up`)")
    if args.command == "worker":
        from dispatcher.worker import run_worker

        return asyncio.run(_until_signal(lambda stop: run_worker(settings, registry, stop)))
    raise AssertionError(args.command)


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
    from dispatcher.serving import api_server
    from dispatcher.stack import local_stack

    async with local_stack(settings) as stack:
        s = stack.settings
        print("tool-dispatcher is up")
        for line in stack.started:
            print(f"  {line}")
        print(f"  database              {s.database_url}")
        print(f"  kafka                 {s.kafka_bootstrap}")
        print(f"  API                   http://{s.http_host}:{s.http_port}")
        if stack.dev_api_key:
            print(f"  dev API key (tenant 'dev'): {stack.dev_api_key}")
        print("Ctrl-C stops everything.", flush=True)
        await api_server(s, registry).serve()
    print("stopped")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
