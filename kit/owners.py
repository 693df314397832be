"""The name a process gives itself wherever it takes something: a relay's lane lease,
a worker's claim, a reconciler's claim. One format, so an operator reading
``lease_owner`` or ``outbox_lanes.owner`` knows which process, on which host, holds it.
"""

from __future__ import annotations

import os
import socket
import uuid


def owner_id(kind: str) -> str:
    """``<kind>:<host>:<pid>:<random>``: unique per process start (a restarted process
    with the same pid is another owner, so it never mistakes an old lease for its own)."""
    return f"{owner_prefix(kind, os.getpid())}{uuid.uuid4().hex[:6]}"


def owner_prefix(kind: str, pid: int) -> str:
    """What every owner id of process ``pid`` of ``kind`` on this host starts with: how
    a supervisor finds what one of its children holds (``LIKE prefix || '%'``)."""
    return f"{kind}:{socket.gethostname()}:{pid}:"
