from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from dispatcher.worker.crashpoints import CrashPoints


def test_unarmed_points_do_nothing() -> None:
    points = CrashPoints(None)
    assert not points.armed
    for _ in range(100):
        points.hit("after-send")


@pytest.mark.parametrize("spec", ["nowhere:1", "after-send:0", "after-send:x", "after-send:-1"])
def test_bad_specs_are_refused(spec: str) -> None:
    with pytest.raises(ValueError, match="crash point"):
        CrashPoints(spec)


def test_the_nth_hit_kills_the_process_with_sigkill() -> None:
    script = (
        "from dispatcher.worker.crashpoints import CrashPoints\n"
        "p = CrashPoints('after-claim:1,after-send:3')\n"
        "p.hit('after-record')\n"
        "for i in range(5):\n"
        "    print(i, flush=True)\n"
        "    p.hit('after-send')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == -signal.SIGKILL
    assert done.stdout.split() == ["0", "1", "2"]
