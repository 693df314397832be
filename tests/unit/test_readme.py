"""The front door stays short and its pages' examples stay true: the README is at most
200 lines, and the capability registry shown in docs/operations.md parses and
validates."""

from __future__ import annotations

import tomllib

from dispatcher.capabilities import Capability
from tests.fixtures.paths import REPO

README = REPO / "README.md"
OPERATIONS = REPO / "docs" / "operations.md"
# Details live in docs/, CONTRIBUTING.md and bench/README.md; the README keeps the pitch,
# the quick start, how it fits, the promises, one row per performance target and links.
MAX_README_LINES = 200


def test_readme_is_at_most_200_lines() -> None:
    lines = len(README.read_text().splitlines())
    assert lines <= MAX_README_LINES, (
        f"README.md has {lines} lines: move details to a page in docs/ and link it"
    )


def test_readme_quick_start_is_the_two_make_targets() -> None:
    text = README.read_text()
    assert "make demo   #" in text
    assert "make test   #" in text
    makefile = (REPO / "Makefile").read_text()
    assert "\ndemo:" in makefile
    assert "\ntest:" in makefile


def test_operations_capability_example_is_a_valid_registry() -> None:
    text = OPERATIONS.read_text()
    block = text.split("### Capability registry")[1].split("```toml")[1].split("```")[0]
    [raw] = tomllib.loads(block)["capability"]
    capability = Capability.model_validate(raw)
    assert capability.side_effects
    assert capability.reconcile.idempotency_window_seconds == 86400
    assert capability.lookup_by_key is not None
