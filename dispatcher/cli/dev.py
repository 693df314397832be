"""The development commands: `sandbox`, `up`, `demo` and `chaos`. They are the only
product code that reaches :mod:`dispatcher.testing`, and only inside their handlers, so
a production command never loads the sandbox or the chaos harness."""

from __future__ import annotations

import argparse
from typing import Any

from dispatcher import runtime
from dispatcher.capabilities import CapabilityRegistry
from dispatcher.cli.parsing import require_registry
from dispatcher.settings import Settings

COMMANDS = ("up", "demo", "chaos")
# The chaos harness's planted defects (dispatcher.testing.chaos.run.PLANTS; a test
# keeps the two equal).
PLANTS = ("blind-retry", "stale-fence", "shared-keys")


def add_parsers(sub: Any) -> None:
    # Listed for --help only: main() hands `sandbox ...` to the sandbox's own parser
    # before this parser runs, so the sandbox is not imported to parse other commands.
    sub.add_parser("sandbox", help="run the sandbox provider (--help for its options)")
    sub.add_parser("up", help="everything on embedded defaults: database, broker, API")
    sub.add_parser("demo", help="run the stack in-process and tell the story")
    _add_chaos_parser(sub)


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


def run_sandbox(argv: list[str]) -> int:
    from dispatcher.testing.sandbox.command import main

    return main(argv, prog="tool-dispatcher sandbox")


def run(args: argparse.Namespace, settings: Settings) -> int:
    if args.command == "chaos":
        from dispatcher.testing.chaos.command import run as run_chaos

        return run_chaos(args, settings)
    if args.command == "demo":
        from dispatcher.testing.demo import run_demo

        return runtime.run(run_demo(settings), settings)
    from dispatcher.testing.local import run_up

    registry, sandbox = _dev_registry(settings)
    return runtime.run(run_up(settings, registry, sandbox=sandbox), settings)


def _dev_registry(settings: Settings) -> tuple[CapabilityRegistry, bool]:
    """The configured registry, else the sandbox's (and then the sandbox runs too)."""
    if settings.capabilities_file is not None:
        return require_registry(settings), False
    from dispatcher.testing.registries import sandbox_registry

    return sandbox_registry(), True
