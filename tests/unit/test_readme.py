"""The README's examples stay true: its capability registry parses and validates."""

from __future__ import annotations

import tomllib

from dispatcher.capabilities import Capability
from tests.fixtures.paths import REPO

README = REPO / "README.md"


def test_readme_capability_example_is_a_valid_registry() -> None:
    text = README.read_text()
    block = text.split("### Capability registry")[1].split("```toml")[1].split("```")[0]
    [raw] = tomllib.loads(block)["capability"]
    capability = Capability.model_validate(raw)
    assert capability.side_effects
    assert capability.reconcile.idempotency_window_seconds == 86400
    assert capability.lookup_by_key is not None
