"""The retention job's named crash points, for the kill -9 tests: armed by the setting
``crash_at`` as the worker's are (:mod:`kit.crashpoints`), e.g. ``after-verify:2``.

- ``after-plan``: a batch is in the manifest, none of its files written yet;
- ``after-write``: its files are in the archive, not yet verified;
- ``after-verify``: the manifest says verified, nothing removed yet;
- ``mid-delete``: inside the removal's transaction, approvals and escalations deleted,
  the calls not yet (the transaction dies with the process).
"""

from __future__ import annotations

from kit.crashpoints import CrashPoints

LABELS = frozenset({"after-plan", "after-write", "after-verify", "mid-delete"})


def crash_points(spec: str | None) -> CrashPoints:
    return CrashPoints(spec, LABELS)
