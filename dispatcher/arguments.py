"""Command-line parsing shared by the `tool-dispatcher` command and the sandbox."""

from __future__ import annotations

import argparse
from typing import NoReturn


class OneLineArgumentParser(argparse.ArgumentParser):
    """Bad input ends with exit code 2 and one line on stderr, not a usage dump."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")
