"""`tool-dispatcher archive show RUN_ID --tenant T`: an archived run, read from the
archive alone and folded into the view ``GET /v1/runs/{runId}`` serves, as JSON.

Exits 1 when the archive holds no such run or cannot be reached, 2 on a bad setting.
"""

from __future__ import annotations

import argparse
from typing import Any

from dispatcher.errors import RunNotFound
from dispatcher.settings import Settings
from kit.cli import OneLineArgumentParser, fail


def register(subparsers: Any) -> None:
    """Add the ``archive`` command to the `tool-dispatcher` parser."""
    parser = subparsers.add_parser("archive", help="read the retention archive")
    sub = parser.add_subparsers(
        dest="archive_command", required=True, parser_class=OneLineArgumentParser
    )
    show = sub.add_parser(
        "show", help="an archived run as GET /v1/runs/{runId} shows it (JSON), from the archive"
    )
    show.add_argument("run_id")
    show.add_argument("--tenant", required=True)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace, settings: Settings) -> int:
    from dispatcher.retention.archive import Archive, ArchiveUnavailable
    from dispatcher.retention.show import archived_run

    try:
        archive = Archive(settings.archive_location(), settings.archive_storage_options)
    except ValueError as exc:
        fail(f"bad archive setting: {exc}", 2)
    try:
        view = archived_run(archive, args.tenant, args.run_id)
    except RunNotFound:
        fail(f"no run {args.run_id!r} of tenant {args.tenant!r} in the archive", 1)
    except ArchiveUnavailable as exc:
        fail(f"cannot reach the archive: {exc}", 1)
    print(view.model_dump_json(by_alias=True, indent=2))
    return 0
