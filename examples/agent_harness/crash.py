"""Simulated kills at named moments, armed by ``CRASH_AFTER=<label>:<turn>``.

A kill is ``os._exit(137)``: no ``finally`` block, no buffered write and no connection
close runs after it, as after a real SIGKILL (whose shell exit status is 137 too).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

LABELS = ("after-save-a", "after-submit", "after-effect-write", "after-save-b")
"""The lesson's crash moments, in turn order: (1) point A saved, the tool not handed
over yet; (2) handed to tool-dispatcher, which may be running it, no result here yet;
the lesson's demo moment, the outcome recorded in the ledger (tool-dispatcher) and read
back, point B not saved; (3) point B saved."""


class CrashSpecError(ValueError):
    """``CRASH_AFTER`` is not ``<label>:<turn>``."""


@dataclass(frozen=True)
class CrashPlan:
    """Where to die; ``label`` None means never."""

    label: str | None = None
    turn: int = 0

    @classmethod
    def parse(cls, spec: str | None) -> CrashPlan:
        if not spec:
            return cls()
        label, _, turn = spec.partition(":")
        if label not in LABELS or not turn.isdigit() or int(turn) < 1:
            raise CrashSpecError(
                f"CRASH_AFTER={spec!r}: expected <label>:<turn> with a label in "
                f"{', '.join(LABELS)} and a turn >= 1"
            )
        return cls(label, int(turn))

    def point(self, label: str, turn: int) -> None:
        """Die here if this is the armed moment."""
        if label == self.label and turn == self.turn:
            print(f"[kill] simulated kill at {label}:{turn}", flush=True)
            sys.stderr.flush()
            os._exit(137)
