"""The `tool-dispatcher` command."""

from __future__ import annotations

import argparse
import asyncio
import secrets
import sys
from collections.abc import Sequence
from typing import NoReturn

from pydantic import ValidationError

from dispatcher import migrate
from dispatcher.capabilities import load_registry
from dispatcher.settings import Settings, hash_api_key, load_settings


class _Parser(argparse.ArgumentParser):
    """Bad input ends with exit code 2 and one line, not a usage dump."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _fail(message: str) -> NoReturn:
    print(f"tool-dispatcher: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tool-dispatcher", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    m = sub.add_parser("migrate", help="apply (or revert) schema migrations")
    m.add_argument("--revision", default="head")
    m.add_argument("--downgrade", action="store_true", help="revert to --revision (e.g. base)")
    sub.add_parser("serve", help="serve the HTTP API (needs a configured database)")
    sub.add_parser("up", help="everything on embedded defaults: database, broker, API")
    sub.add_parser("demo", help="run the stack in-process and tell the intake story")
    sub.add_parser("api-key", help="print a new API key and the settings line for its hash")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
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
        return asyncio.run(_up(settings))
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
    raise AssertionError(args.command)


async def _up(settings: Settings) -> int:
    from dispatcher.serving import api_server
    from dispatcher.stack import local_stack

    registry = load_registry(settings.capabilities_file)
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
