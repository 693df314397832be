"""CPU of the status-transition lines (dispatcher.ledger.transitions.log_moves) on a
worker's hot path: a batch of moved calls logged with the transitions logger off, as
text lines and as JSON lines, each written to /dev/null, one after the other in one run.

    .venv/bin/python -m bench.log_lines [--calls 500] [--rounds 40]

A call moves twice in a worker (claim, outcome), so it pays twice the per-line figure.
The best round of each is taken (``time.process_time()`` of this process).
"""

from __future__ import annotations

import argparse
import logging
import os
import time

from dispatcher.ledger.transitions import Moved, log_moves
from dispatcher.logs import TRANSITIONS_LOGGER, current_context
from dispatcher.states import ExecutionStatus as S
from kit.logs import TEXT_FORMAT, JsonLines

# JSON costs more than text (a dict, orjson, the span lookup): a ceiling on how much.
JSON_VS_TEXT_CEILING = 2.5


def _batch(calls: int) -> list[Moved]:
    return [
        Moved(
            None,  # type: ignore[arg-type]  # the row is not read by log_moves
            {
                "tenant": "acme",
                "tool_call_id": f"tc-{i}",
                "run_id": "run-1",
                "capability_id": "refund",
                "payload": {"from": ["authorized"], "to": "dispatching"},
            },
        )
        for i in range(calls)
    ]


def _per_line(moved: list[Moved], rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        started = time.process_time()
        log_moves([S.AUTHORIZED], moved)
        best = min(best, time.process_time() - started)
    return best / len(moved)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=40)
    args = parser.parse_args()
    moved = _batch(args.calls)
    logger = logging.getLogger(TRANSITIONS_LOGGER)
    logger.propagate = False
    with open(os.devnull, "w") as sink:
        handler = logging.StreamHandler(sink)
        logger.addHandler(handler)
        logger.setLevel(logging.WARNING)
        off = _per_line(moved, args.rounds)
        logger.setLevel(logging.INFO)
        handler.setFormatter(logging.Formatter(TEXT_FORMAT))
        text = _per_line(moved, args.rounds)
        handler.setFormatter(JsonLines(current_context))
        as_json = _per_line(moved, args.rounds)
    print(f"per transition line, {args.calls} calls a batch:")
    print(f"  logger off    {off * 1e6:7.2f} µs")
    print(f"  text lines    {text * 1e6:7.2f} µs")
    print(f"  JSON lines    {as_json * 1e6:7.2f} µs")
    ratio = as_json / text
    verdict = "met" if ratio <= JSON_VS_TEXT_CEILING else "missed"
    print(f"JSON vs text: {ratio:.2f}x (ceiling {JSON_VS_TEXT_CEILING}x): {verdict}")


if __name__ == "__main__":
    main()
