"""``python -m devtools sandbox`` (and ``python -m devtools.sandbox``): run the sandbox
provider until SIGTERM or Ctrl-C. Reads its arguments only, never the environment."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence

import psycopg

from devtools.sandbox.server import SandboxServer
from dispatcher import runtime
from dispatcher.db.engine import engine_for
from dispatcher.ops import SANDBOX_PORT, Ops, database_check, serve_ops
from kit.cli import OneLineArgumentParser
from kit.signals import stop_on_signals

DEFAULT_PORT = 8790


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port out of range: {port}")
    return port


def _database_url(text: str) -> str:
    if not text.startswith(("postgresql://", "postgres://", "postgresql+psycopg://")):
        raise argparse.ArgumentTypeError("--database-url must be a postgresql:// URL")
    return text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The sandbox's options, for this module's parser or a ``sandbox`` subcommand."""
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument(
        "--port", type=_port, default=DEFAULT_PORT, help=f"0 picks a free port ({DEFAULT_PORT})"
    )
    parser.add_argument(
        "--ops-port",
        type=_port,
        default=SANDBOX_PORT,
        help=f"/healthz, /readyz, /metrics on this port; 0: off ({SANDBOX_PORT})",
    )
    parser.add_argument("--ops-host", default="127.0.0.1", help="address of the ops endpoints")
    parser.add_argument(
        "--database-url",
        type=_database_url,
        default=None,
        help="keep state in PostgreSQL (schema 'sandbox') instead of memory",
    )


def build_parser(prog: str = "python -m devtools.sandbox") -> argparse.ArgumentParser:
    parser = OneLineArgumentParser(
        prog=prog, description="The sandbox provider (reference HTTP provider)."
    )
    add_arguments(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    """Serve with parsed arguments (``host``, ``port``, ``database_url``, ``ops_host``,
    ``ops_port``); 0 on SIGTERM."""
    try:
        return runtime.run(_serve(args))
    except KeyboardInterrupt:
        return 130
    except (OSError, psycopg.Error) as exc:  # the port is taken, the database unreachable
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"sandbox: error: {message}", file=sys.stderr)
        return 1


def main(argv: Sequence[str] | None = None, prog: str = "python -m devtools.sandbox") -> int:
    """Parse ``argv`` and serve until stopped."""
    return run(build_parser(prog).parse_args(argv))


async def _serve(args: argparse.Namespace) -> int:
    with stop_on_signals(asyncio.Event()) as stop:
        return await _serve_until(args, stop)


async def _serve_until(args: argparse.Namespace, stop: asyncio.Event) -> int:
    server = SandboxServer(args.host, args.port, database_url=args.database_url)
    await server.start()
    ops = Ops()
    # A memory store has no dependency to check: ready as soon as it serves.
    engine = None if args.database_url is None else engine_for(args.database_url, pool_size=1)
    if engine is not None:
        ops.add_check("database", database_check(engine))
    try:
        # The default port, if taken (a second sandbox), is skipped, not fatal.
        required = args.ops_port != SANDBOX_PORT
        async with serve_ops(ops, args.ops_host, args.ops_port, required=required) as ops_url:
            # Never print the URL itself: it may carry a password.
            print(f"sandbox provider on {server.url} (store: {server.store.name})", flush=True)
            if ops_url is not None:
                print(f"sandbox ops endpoints on {ops_url}", flush=True)
            await stop.wait()
    finally:
        await server.stop()
        if engine is not None:
            await engine.dispose()
    print("sandbox provider stopped", flush=True)
    return 0
