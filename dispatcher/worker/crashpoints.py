"""The worker's named crash points at its commit boundaries, for the kill -9 tests.

Armed by the setting ``crash_at`` (env ``TOOL_DISPATCHER_CRASH_AT``), e.g.
``after-send:3`` kills the process with SIGKILL the third time ``after-send`` is
reached. Unarmed, :meth:`CrashPoints.hit` is a single attribute test
(:mod:`kit.crashpoints`).
"""

from __future__ import annotations

from kit import crashpoints

LABELS = frozenset({"after-claim", "after-send", "after-record"})


class CrashPoints(crashpoints.CrashPoints):
    def __init__(self, spec: str | None = None) -> None:
        super().__init__(spec, LABELS)
