"""``python -m devtools.chaos.blind_worker``: a worker with one defence switched off
ON PURPOSE, for proving that the chaos checker catches a broken service
(`python -m devtools chaos --plant blind-retry`). Never run it against a real provider.

The defence: a side-effecting request whose answer was lost is never re-sent blindly
(it becomes ``result_unknown`` and the reconciler asks the provider). This worker
re-sends it at once under a fresh idempotency key, which is what a naive retry
wrapper does, so the provider applies the effect a second time.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

from dispatcher import runtime
from dispatcher.capabilities import Capability
from dispatcher.provider.client import (
    DispatchRequest,
    OutcomeKind,
    ProviderClient,
    ProviderOutcome,
)
from dispatcher.provider.transport import Transport
from dispatcher.settings import Settings, load_settings
from dispatcher.worker.consumer import run_worker
from kit.signals import until_signal
from tool_dispatcher.parsing import require_registry

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


async def _run(settings: Settings, stop: asyncio.Event) -> None:
    registry = require_registry(settings)
    async with Transport(settings.provider_max_connections) as transport:
        client = BlindRetryClient(transport, settings.provider_credentials())
        await run_worker(settings, registry, stop, provider=client)


def main() -> int:
    settings = load_settings()
    return runtime.run(until_signal(lambda stop: _run(settings, stop)), settings)


if __name__ == "__main__":
    raise SystemExit(main())
