"""Command-line errors that read as one line: a bad invocation ends with exit code 2 and
one line on stderr, not a usage dump; a world that is not ready (a database down) with
exit code 1. Every command of the service and of its dev tooling uses these."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn


class OneLineArgumentParser(argparse.ArgumentParser):
    """Bad input ends with exit code 2 and one line on stderr, not a usage dump."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def fail(message: str, code: int = 2, *, prog: str = "tool-dispatcher") -> NoReturn:
    """One line on stderr, then exit (2: the invocation is wrong; 1: the world is)."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    raise SystemExit(code)
