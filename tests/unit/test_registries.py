"""A registry written by ``registry_toml`` is the registry a process loads back: the
process tests and the benchmarks hand their workers exactly what the test built."""

from __future__ import annotations

from pathlib import Path

import pytest

from devtools.registries import capability, refund_and_lookup, registry_of
from dispatcher.capabilities import CapabilityRegistry, load_registry
from tests.fixtures.capabilities import (
    approval_capability,
    cron_capability,
    reconcile_capability,
    registry_file,
)

URL = "http://127.0.0.1:8790"

REGISTRIES = {
    "refund-and-lookup": refund_and_lookup(URL, timeout=5.0, attempts=2),
    "every-shape": registry_of(
        capability("plain", URL, side_effects=False, path="/v1/other"),
        approval_capability("approve", URL, forbidSelfApproval=True, approvalTtlSeconds=0.2),
        reconcile_capability("undo", URL, reconcile={"onNotFound": "confirm_failure"}).model_copy(
            update={"on_run_stopped": "compensate"}
        ),
        cron_capability(URL),
        capability("keyed", URL, idempotencyKeyTemplate='refund:{input.orderId}:"q"'),
    ),
}


@pytest.mark.parametrize("registry", REGISTRIES.values(), ids=REGISTRIES.keys())
def test_a_written_registry_loads_back_equal(registry: CapabilityRegistry, tmp_path: Path) -> None:
    loaded = load_registry(registry_file(tmp_path, registry))

    assert list(loaded) == list(registry)
