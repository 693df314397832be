"""``python -m devtools.chaos.stale_fence_worker``: a worker with one defence
switched off ON PURPOSE, for proving that the chaos checker sees fencing
(`python -m devtools chaos --plant stale-fence`). Never run it against a real provider.

The defence: point B records an outcome only while this worker still holds the claim
it sent under, fenced by the lease owner and the claim's version. This worker's fence
is reduced to the status check (``status = 'dispatching'``), so a worker that stalled
past its lease records its stale answer over another worker's claim of the same call
once the call is ``dispatching`` again: a read-only call the recovery sweep re-dispatched,
or a side-effecting one the reconciler re-sent. (The real code is left untouched: the
name the recorder calls is rebound in this process only.)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher import runtime
from dispatcher.ledger.routed import RoutedMove, move_each
from dispatcher.ledger.transitions import Moved
from dispatcher.settings import load_settings
from dispatcher.worker import outcomes
from dispatcher.worker.consumer import run_worker
from kit.signals import until_signal
from tool_dispatcher.parsing import require_registry


async def status_only(
    session: AsyncSession, moves: Sequence[RoutedMove], *, lease_owner: str | None, **kw: Any
) -> list[Moved]:
    """:func:`move_each` without the owner and version fence of a move out of a claim.

    It is the recorder's ``dispatching ->`` step, the only one that names a lease
    owner; a re-send's settling step (``accepted -> confirmed``, in the same
    transaction) keeps its own version fence."""
    unfenced = [replace(r, move=replace(r.move, version=None)) for r in moves]
    return await move_each(session, unfenced, lease_owner=None, **kw)


def main() -> int:
    settings = load_settings()
    # The recorder's own name for the fenced UPDATE, rebound in this process only.
    outcomes.move_each = status_only  # type: ignore[attr-defined]
    registry = require_registry(settings)
    return runtime.run(until_signal(lambda stop: run_worker(settings, registry, stop)), settings)


if __name__ == "__main__":
    raise SystemExit(main())
