"""``python -m dispatcher.chaos.blind_worker``: a worker with one defence switched off
ON PURPOSE, for proving that the chaos checker catches a broken service
(`tool-dispatcher chaos --plant blind-retry`). Never run it against a real provider.

The defence: a side-effecting request whose answer was lost is never re-sent blindly
(it becomes ``result_unknown`` and the reconciler asks the provider). This worker
re-sends it at once under a fresh idempotency key, which is what a naive retry
wrapper does, so the provider applies the effect a second time.
"""

from __future__ import annotations

from dataclasses import replace

from dispatcher import cli, worker
from dispatcher.capabilities import Capability
from dispatcher.provider import DispatchRequest, OutcomeKind, ProviderClient, ProviderOutcome

BLIND_RETRIES = 3


class BlindRetryClient(ProviderClient):
    async def dispatch(self, capability: Capability, request: DispatchRequest) -> ProviderOutcome:
        outcome = await super().dispatch(capability, request)
        for attempt in range(1, BLIND_RETRIES + 1):
            if outcome.kind is not OutcomeKind.UNKNOWN:
                break
            fresh = replace(request, idempotency_key=f"{request.idempotency_key}#blind-{attempt}")
            outcome = await super().dispatch(capability, fresh)
        return outcome


def main() -> int:
    # run_worker builds its provider client from this name.
    worker.ProviderClient = BlindRetryClient  # type: ignore[attr-defined]
    return cli.main(["worker"])


if __name__ == "__main__":
    raise SystemExit(main())
