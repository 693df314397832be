"""Named crash points at commit boundaries, for the kill -9 tests of any process.

A process names its points (``labels``) and is armed by a spec, e.g. ``after-send:3``
kills it with SIGKILL the third time ``after-send`` is reached. Unarmed,
:meth:`CrashPoints.hit` is a single attribute test. The worker's points are
:mod:`dispatcher.worker.crashpoints`, the retention job's
:mod:`dispatcher.retention.crashpoints`; both are armed by the setting ``crash_at``.
"""

from __future__ import annotations

import os
import signal
from collections import Counter
from collections.abc import Iterable


class CrashPoints:
    def __init__(self, spec: str | None, labels: Iterable[str]) -> None:
        known = frozenset(labels)
        self._targets: dict[str, int] = {}
        self._seen: Counter[str] = Counter()
        for part in (spec or "").split(","):
            if not part.strip():
                continue
            label, _, count = part.strip().partition(":")
            if label not in known or not (count or "1").isdigit() or int(count or "1") < 1:
                raise ValueError(
                    f"crash point {part!r}: expected LABEL[:N] with LABEL in {sorted(known)}"
                )
            self._targets[label] = int(count or "1")
        self.armed = bool(self._targets)

    def hit(self, label: str) -> None:
        if not self.armed or label not in self._targets:
            return
        self._seen[label] += 1
        if self._seen[label] == self._targets[label]:
            # SIGKILL, not an exception: nothing in this process gets to clean up,
            # exactly like a real crash.
            os.kill(os.getpid(), signal.SIGKILL)
