"""``python -m devtools up|demo|chaos|sandbox``: the development commands, outside the
product (the wheel and the image hold none of this package; `make up`, `make demo` and
CI run it from the repository).

- ``up``: every part of the service on embedded defaults, in one process;
- ``demo``: ``up`` in-process plus the refund story, exit 0 when every step behaved;
- ``chaos``: the whole stack as processes under injected faults, its invariants checked;
- ``sandbox``: the reference provider, a real HTTP server (its own options: ``--help``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from dispatcher import runtime, tracing
from dispatcher.capabilities import CapabilityRegistry
from dispatcher.logs import configure_logging
from dispatcher.settings import Settings, load_settings
from kit import telemetry
from kit.cli import OneLineArgumentParser, fail
from tool_dispatcher.parsing import require_registry

PROG = "python -m devtools"
# The chaos harness's planted defects (devtools.chaos.run.PLANTS; a test keeps the two
# equal), listed here so that parsing the arguments imports no harness.
PLANTS = ("blind-retry", "stale-fence", "shared-keys", "eager-retention", "early-commit")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineArgumentParser(prog=PROG, description="the development commands")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineArgumentParser)
    # Listed for --help only: main() hands `sandbox ...` to the sandbox's own parser.
    sub.add_parser("sandbox", help="run the sandbox provider (--help for its options)")
    sub.add_parser("up", help="everything on embedded defaults: database, broker, API")
    sub.add_parser("demo", help="run the stack in-process and tell the story")
    _add_chaos_parser(sub)
    return parser


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text}")
    return value


def _add_chaos_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "chaos", help="run the whole stack under injected faults and check its invariants"
    )
    parser.add_argument("--duration", type=_positive, required=True, help="seconds of faults")
    parser.add_argument("--seed", type=int, required=True, help="derives the fault plan")
    parser.add_argument("--report", default=None, help="also write the report as JSON here")
    parser.add_argument("--rate", type=_positive, default=8.0, help="submissions a second")
    parser.add_argument(
        "--settle-timeout", type=_positive, default=90.0, help="seconds to wait for settling"
    )
    parser.add_argument(
        "--plant",
        choices=PLANTS,
        default=None,
        help="switch a defence off on purpose (the run must then fail)",
    )
    parser.add_argument("--keep", action="store_true", help="keep process logs of a passing run")


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["sandbox"]:
        from devtools.sandbox.command import main as sandbox

        return sandbox(argv[1:], prog=f"{PROG} sandbox")
    args = build_parser().parse_args(argv)
    try:
        settings = load_settings()
    except ValidationError as exc:
        first = exc.errors()[0]
        fail(f"bad setting {'.'.join(str(p) for p in first['loc'])}: {first['msg']}", prog=PROG)
    # The demo's story is its output; the services' own logging would drown it.
    configure_logging(settings, quiet=args.command == "demo")
    try:
        if args.command == "up":
            tracing.start(settings, "up")
    except ValueError as exc:
        fail(f"bad traces setting: {exc}", prog=PROG)
    try:
        return _run(args, settings)
    except KeyboardInterrupt:
        return 130
    finally:
        telemetry.shutdown()


def _run(args: argparse.Namespace, settings: Settings) -> int:
    if args.command == "chaos":
        from devtools.chaos.command import run as run_chaos

        return run_chaos(args, settings)
    if args.command == "demo":
        from devtools.demo import run_demo

        return runtime.run(run_demo(settings), settings)
    from devtools.local import run_up

    registry, sandbox = _dev_registry(settings)
    return runtime.run(run_up(settings, registry, sandbox=sandbox), settings)


def _dev_registry(settings: Settings) -> tuple[CapabilityRegistry, bool]:
    """The configured registry, else the sandbox's (and then the sandbox runs too)."""
    if settings.capabilities_file is not None:
        return require_registry(settings), False
    from devtools.registries import sandbox_registry

    return sandbox_registry(), True


if __name__ == "__main__":
    raise SystemExit(main())
