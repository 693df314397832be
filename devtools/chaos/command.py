"""`python -m devtools chaos` (its arguments are parsed by :mod:`devtools.__main__`).
Exit status: 0 when every invariant held, 1 on any violation (or a run that did not
settle), 2 on bad arguments."""

from __future__ import annotations

import argparse
import logging

from devtools.chaos.run import ChaosOptions, run_chaos
from dispatcher import runtime
from dispatcher.settings import Settings


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
    report = runtime.run(run_chaos(options, settings), settings)
    print(report.text(), flush=True)
    if args.report:
        report.write(args.report)
    return 0 if report.passed else 1
