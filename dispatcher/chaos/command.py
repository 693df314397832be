"""`tool-dispatcher chaos`, added through the ``tool_dispatcher.commands`` entry-point
group. Exit status: 0 when every invariant held, 1 on any violation (or a run that did
not settle), 2 on bad arguments."""

from __future__ import annotations

import argparse
import asyncio
import logging
from typing import Any

from dispatcher.chaos.run import PLANTS, ChaosOptions, run_chaos
from dispatcher.settings import Settings


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text}")
    return value


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
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
        choices=sorted(PLANTS),
        default=None,
        help="switch a defence off on purpose (the run must then fail)",
    )
    parser.add_argument("--keep", action="store_true", help="keep process logs of a passing run")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace, settings: Settings) -> int:
    # One line per HTTP request of the load would drown the harness's own log.
    for noisy in ("httpx", "httpcore", "aiokafka"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    options = ChaosOptions(
        duration=args.duration,
        seed=args.seed,
        rate=args.rate,
        plant=args.plant,
        settle_timeout=args.settle_timeout,
        keep=args.keep,
    )
    report = asyncio.run(run_chaos(options, settings))
    print(report.text(), flush=True)
    if args.report:
        report.write(args.report)
    return 0 if report.passed else 1
