"""docs/metrics.md is the metric catalogue: every metric the service's modules define is
in it, with its type and label names, and it names nothing they do not define.

Pure: importing every module of the four packages defines every metric (they are
module-level, in the default registry); nothing is scraped. The end-to-end check that
each process exposes its metrics over HTTP reuses :func:`tests.fixtures.metrics.catalogue`.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from typing import Any

import pytest
from prometheus_client import REGISTRY

import dispatcher
import kit
import outbox_relay
import reconciler
from tests.fixtures.metrics import LOOPS, PREFIXES, Entry, catalogue

PACKAGES = (dispatcher, outbox_relay, reconciler, kit)


def import_everything() -> None:
    for package in PACKAGES:
        for module in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            # Scripts, not modules: __main__ runs the CLI, migrations run under alembic.
            if not module.name.endswith(".__main__") and ".migrations" not in module.name:
                importlib.import_module(module.name)


def defined() -> dict[str, tuple[str, tuple[str, ...]]]:
    """Each of the service's metrics in the default registry: its name as scraped (a
    counter's with ``_total``) -> (type, label names)."""
    import_everything()
    found: dict[str, tuple[str, tuple[str, ...]]] = {}
    for family in REGISTRY.collect():
        if not family.name.startswith(PREFIXES):
            continue
        name = f"{family.name}_total" if family.type == "counter" else family.name
        # The label names of a metric no one has moved yet are on its collector only
        # (the client has no public accessor for them).
        collector: Any = REGISTRY._names_to_collectors[name]
        found[name] = (family.type, tuple(collector._labelnames))
    return found


def by_name(entries: list[Entry]) -> dict[str, Entry]:
    return {e.name: e for e in entries}


def test_the_catalogue_parses_and_names_each_metric_once() -> None:
    entries = catalogue()
    names = [e.name for e in entries]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    assert {e.process for e in entries} == {
        "Every process", "API", "Worker", "Bus intake", "Relay", "Reconciler",
        "Approvals sweeper", "Webhook sender", "Retention",
    }  # fmt: skip
    # A row the parser would drop (a wrong number of cells) is no metric of it.
    assert len(entries) >= 30


def test_every_defined_metric_is_catalogued_and_every_catalogued_one_defined() -> None:
    listed = set(by_name(catalogue()))
    there = set(defined())
    assert sorted(there - listed) == [], "defined but not in docs/metrics.md"
    assert sorted(listed - there) == [], "in docs/metrics.md but defined nowhere"


def test_types_and_label_names_match_the_definitions() -> None:
    entries = by_name(catalogue())
    mismatched = {
        name: {"catalogue": (entries[name].type, entries[name].labels), "defined": spec}
        for name, spec in defined().items()
        if name in entries and (entries[name].type, entries[name].labels) != spec
    }
    assert mismatched == {}


def test_every_entry_says_what_it_means_and_where_it_moves() -> None:
    for entry in catalogue():
        assert entry.meaning and entry.where and entry.values, entry
        assert entry.type in {"counter", "gauge", "histogram"}, entry
        assert ("—" in entry.values) == (entry.labels == ()), entry


def test_the_loops_the_code_runs_are_the_catalogued_ones() -> None:
    """The ``loop`` label's values: each loop's name in the code, the bounded set the
    label checks hold samples to, and the catalogue's two rows, all the same set."""
    from dispatcher.operations.processor import LOOP as OPERATIONS_LOOP
    from dispatcher.webhooks.service import LOOP as WEBHOOKS_LOOP
    from dispatcher.worker.consumer import BREAKER_LOOP, RECOVERY_LOOP, REDRIVE_LOOP, RESUME_LOOP
    from outbox_relay.relay import HOUSEKEEPING_LOOP
    from reconciler.loop import GAUGES_LOOP
    from reconciler.loop import LOOP as RECONCILE_LOOP
    from tool_dispatcher.approvals import LOOP as APPROVALS_LOOP

    named = {
        RECOVERY_LOOP, REDRIVE_LOOP, RESUME_LOOP, HOUSEKEEPING_LOOP, RECONCILE_LOOP,
        GAUGES_LOOP, APPROVALS_LOOP, WEBHOOKS_LOOP, OPERATIONS_LOOP, BREAKER_LOOP,
    }  # fmt: skip
    assert named == LOOPS
    entries = by_name(catalogue())
    for name in ("loop_step_errors_total", "loop_step_seconds"):
        assert set(re.findall(r"`([a-z_]+)`", entries[name].values)) == LOOPS, name


@pytest.mark.parametrize(
    "row, problem",
    [
        ("| `tool_dispatcher_x_total` | counter | `a` | a | m | w |", "not defined"),
        ("| `tool_dispatcher_calls` | counter | `status` | s | m | w |", "wrong type"),
    ],
)
def test_a_wrong_row_is_caught(tmp_path: Any, row: str, problem: str) -> None:
    """The comparison can fail: a catalogue with one wrong row differs from the
    definitions (``problem`` says how)."""
    doc = tmp_path / "metrics.md"
    doc.write_text("## API\n\n| Name | Type | Labels | Label values | Meaning | Where |\n" + row)
    (entry,) = catalogue(doc)
    spec = defined().get(entry.name)
    assert spec != (entry.type, entry.labels), problem
