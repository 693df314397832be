"""The packages' public surfaces, pinned: adding or dropping a name is a deliberate act
that updates this test too."""

from __future__ import annotations

import importlib

import pytest

import dispatcher
import outbox_relay
import reconciler

SURFACES = {
    "outbox_relay": [
        "BatchResult",
        "DeadLetter",
        "OutboxMessage",
        "RelayConfig",
        "discard_dead_letter",
        "list_dead_letters",
        "outbox_table",
        "purge_published",
        "retry_dead_letter",
        "run_once",
        "run_relay",
    ],
    "reconciler": [
        "Decision",
        "Observation",
        "Reconciler",
        "Situation",
        "Tally",
        "Verdict",
        "backoff_seconds",
        "decide",
    ],
}


def test_outbox_relay_surface() -> None:
    assert sorted(outbox_relay.__all__) == SURFACES["outbox_relay"]


def test_reconciler_surface() -> None:
    assert sorted(reconciler.__all__) == SURFACES["reconciler"]


def test_dispatcher_surface_is_exactly_what_it_imports_lazily() -> None:
    # The names resolve through _HOMES on first use: a name in one list and not the
    # other would be exported but missing, or importable but unlisted.
    assert set(dispatcher.__all__) == set(dispatcher._HOMES)


@pytest.mark.parametrize("package", [*sorted(SURFACES), "dispatcher"])
def test_every_exported_name_exists_and_is_listed_once(package: str) -> None:
    module = importlib.import_module(package)
    exported = list(module.__all__)
    assert len(exported) == len(set(exported))
    missing = [name for name in exported if not hasattr(module, name)]
    assert missing == []


def test_library_submit_is_the_intake_function() -> None:
    from dispatcher.intake.service import submit

    assert dispatcher.submit is submit
