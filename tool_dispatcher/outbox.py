"""`tool-dispatcher outbox ...`: dead letters and retention."""

from __future__ import annotations

import argparse
from typing import Any

import outbox_relay
from kit.cli import OneLineArgumentParser, fail


def add_parser(sub: Any) -> None:
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


async def run(args: argparse.Namespace, database_url: str) -> int:
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
        fail(f"no dead letter with id {args.row_id}")
    print(f"dead letter {args.row_id}: {args.outbox_command} done")
    return 0
