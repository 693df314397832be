"""``python -m dispatcher.testing.sandbox`` (and ``tool-dispatcher sandbox``): run the sandbox
provider until SIGTERM or Ctrl-C. Reads its arguments only, never the environment."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Sequence

import psycopg

from dispatcher import runtime
from dispatcher.cli.parsing import OneLineArgumentParser
from dispatcher.testing.sandbox.server import SandboxServer

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
        "--database-url",
        type=_database_url,
        default=None,
        help="keep state in PostgreSQL (schema 'sandbox') instead of memory",
    )


def build_parser(prog: str = "python -m dispatcher.testing.sandbox") -> argparse.ArgumentParser:
    parser = OneLineArgumentParser(
        prog=prog, description="The sandbox provider (reference HTTP provider)."
    )
    add_arguments(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    """Serve with parsed arguments (``host``, ``port``, ``database_url``); 0 on SIGTERM."""
    try:
        return runtime.run(_serve(args.host, args.port, args.database_url))
    except KeyboardInterrupt:
        return 130
    except (OSError, psycopg.Error) as exc:  # the port is taken, the database unreachable
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"sandbox: error: {message}", file=sys.stderr)
        return 1


def main(
    argv: Sequence[str] | None = None, prog: str = "python -m dispatcher.testing.sandbox"
) -> int:
    """Parse ``argv`` and serve until stopped."""
    return run(build_parser(prog).parse_args(argv))


async def _serve(host: str, port: int, database_url: str | None) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    server = SandboxServer(host, port, database_url=database_url)
    await server.start()
    try:
        # Never print the URL itself: it may carry a password.
        print(f"sandbox provider on {server.url} (store: {server.store.name})", flush=True)
        await stop.wait()
    finally:
        await server.stop()
    print("sandbox provider stopped", flush=True)
    return 0
