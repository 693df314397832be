"""What a chaos run reports: as text for a person, as JSON for a file."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from devtools.chaos.checker import INVARIANTS, Evidence, explained
from devtools.chaos.isolation import shared_names

SAMPLES = 10
"""Violations printed per invariant (all are counted)."""
JSON_SAMPLES = 200
"""Violations written to the JSON report per invariant."""


@dataclass
class ChaosReport:
    seed: int
    duration_seconds: float
    plant: str | None
    infrastructure: dict[str, str]
    submissions: dict[str, Any]
    calls_by_status: dict[str, int]
    faults: dict[str, int]
    fault_log: list[dict[str, Any]]
    unexpected_exits: dict[str, int]
    violations: dict[int, list[str]]
    settled: bool
    settle_seconds: float | None
    """From the end of the fault phase (every fault lifted) to every call settled."""
    since_last_fault_seconds: float | None
    """From the last fault injected to every call settled."""
    wall_seconds: float
    effects_applied: int = 0
    commands_reemitted: int = 0
    taken_over: int = 0
    fenced: int = 0
    escalation_reasons: dict[str, int] = field(default_factory=dict)
    """Outcomes a stalled worker came back with and could not record (lease lost)."""
    tenancy: dict[str, Any] = field(default_factory=dict)
    """What the tenants shared, and the dead letters (``run._tenancy``)."""
    retention: dict[str, Any] = field(default_factory=dict)
    """The retention job's passes, how they ended, and the calls it archived."""
    bus: dict[str, Any] = field(default_factory=dict)
    """What the broker kept of the request records and what bus intake answered
    (:func:`bus_figures`)."""
    notes: list[str] = field(default_factory=list)

    @property
    def violation_counts(self) -> dict[int, int]:
        return {n: len(self.violations.get(n, [])) for n in INVARIANTS}

    @property
    def passed(self) -> bool:
        return self.settled and not any(self.violation_counts.values())

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["violations"] = {
            str(n): {
                "invariant": INVARIANTS[n],
                "count": len(found),
                "samples": found[:JSON_SAMPLES],
            }
            for n, found in self.violations.items()
        }
        data["faultsTotal"] = sum(self.faults.values())
        data["passed"] = self.passed
        return data

    def write(self, path: str) -> None:
        with open(path, "w") as out:
            json.dump(self.as_json(), out, indent=2, sort_keys=True)
            out.write("\n")

    def text(self) -> str:
        s = self.submissions
        lines = [
            f"chaos run: seed {self.seed}, {self.duration_seconds:.0f} s of faults"
            + (f", planted defect: {self.plant}" if self.plant else ""),
            "  " + ", ".join(f"{k} {v}" for k, v in self.infrastructure.items()),
            f"submissions: {s['attempted']} sent, {s['acknowledged']} acknowledged (2xx), "
            f"{s['replays']} replays, {s['runsStopped']} runs stopped",
            f"  by tenant: {_pairs(s['byTenant'])}; by door: {_pairs(s.get('byDoor', {}))};"
            f" sent by both tenants alike: {s['mirrored']}",
            f"  by kind: {_pairs(s['byKind'])}",
            f"  not acknowledged: {_pairs(s['notAcknowledged']) or 'none'}",
            f"  hostile_input: {_pairs(s['hostile']) or 'none'}; answered other than 4xx:"
            f" {s['hostileMisanswered']}; valid refused as invalid: {s['validRefused']}",
            f"  approvals: {_pairs(s['approvals']) or 'none'}",
            f"calls by final status: {_pairs(self.calls_by_status)}",
            f"provider effects applied: {self.effects_applied}",
            f"dispatch commands written again (re-drive, read-only re-dispatch): "
            f"{self.commands_reemitted}",
            f"escalations by reason: {_pairs(self.escalation_reasons) or 'none'}",
            f"calls taken over from lost workers: {self.taken_over}; outcomes fenced off "
            f"(a zombie's, after its lease was lost): {self.fenced}",
            *self._tenancy_lines(),
            *self._bus_lines(),
            *self._retention_lines(),
            f"faults injected: {sum(self.faults.values())}",
        ]
        lines += [f"  {kind:<28} {n}" for kind, n in sorted(self.faults.items())]
        lines.append(
            "processes that exited on their own (restarted): "
            + (_pairs(self.unexpected_exits) or "none")
        )
        lines.append("violations by invariant:")
        for n, count in self.violation_counts.items():
            lines.append(f"  {n}. {INVARIANTS[n]}: {count}")
            lines += [f"       {v}" for v in self.violations.get(n, [])[:SAMPLES]]
        settle = (
            f"{self.since_last_fault_seconds:.1f} s ({self.settle_seconds:.1f} s after the "
            "fault phase ended and every fault was lifted)"
            if self.settle_seconds is not None and self.since_last_fault_seconds is not None
            else "did not settle in time"
        )
        lines.append(f"time from last fault to settled: {settle}")
        lines.append(f"wall time: {self.wall_seconds:.0f} s")
        lines += [f"note: {note}" for note in self.notes]
        lines.append("PASSED" if self.passed else "FAILED")
        return "\n".join(lines)

    def _tenancy_lines(self) -> list[str]:
        t = self.tenancy
        if not t:
            return []
        return [
            f"names both tenants used: {_pairs(t['sharedByTenants'])}",
            f"dead letters: {t['deadLetters']} ({t['deadLettersOnPurpose']} made on purpose,"
            f" over the relay's {t['maxMessageBytes']} bytes; {t['deadLettersDiscarded']}"
            f" discarded by their tenant; {t['rowsThatWaitedBehindThem']} row(s) waited"
            f" behind them); largest message published: {t['largestPublishedBytes']} bytes",
        ]

    def _bus_lines(self) -> list[str]:
        b, sent = self.bus, self.submissions.get("bus", {})
        if not b or not sent:
            return []
        return [
            f"bus intake: {sent['events']} events sent ({sent['sendsAcknowledged']} sends"
            f" acknowledged, {sent['sendsMaybe']} maybe written; {sent['doubled']} sent twice,"
            f" {sent['hostile']} hostile); replies the load read: {_pairs(sent['replies'])}",
            f"  records kept by the broker: {b['recordsKept']} of {b['eventsKept']} events"
            f" ({b['recordsWithoutId']} without a readable ce_id; not counted:"
            f" {b['recordsAtAClashingOffset']} at an offset the broker gave twice);"
            " replies recorded:"
            f" {_pairs(b['replies']) or 'none'}; refusals by code: {_pairs(b['refusals'])}",
        ]

    def _retention_lines(self) -> list[str]:
        r = self.retention
        if not r:
            return []
        return [
            f"retention: {r['archivedCalls']} calls archived and removed in {r['passes']}"
            f" passes (exits: {_pairs(r['exits'])}; killed at: {_pairs(r['killedAt']) or 'none'})"
        ]


def _pairs(counts: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in counts.items())


def tenancy(evidence: Evidence) -> dict[str, Any]:
    """What the tenants shared, and what became of the dead letters: what invariants 5
    and 8 had to bite on."""
    dead = evidence.dead_letters
    return {
        "callsByTenant": dict(sorted(Counter(t for t, _ in evidence.calls).items())),
        "sharedByTenants": shared_names(evidence.calls.values()),
        "deadLetters": len(dead),
        "deadLettersOnPurpose": sum(
            explained(d, evidence.oversized, evidence.max_message_bytes) for d in dead
        ),
        "deadLettersDiscarded": sum(evidence.discarded.get(d.id) == "200" for d in dead),
        "rowsThatWaitedBehindThem": sum(len(d.waiting) for d in dead),
        "maxMessageBytes": evidence.max_message_bytes,
        "largestPublishedBytes": evidence.largest_published,
    }


def bus_figures(evidence: Evidence) -> dict[str, Any]:
    """What invariant 10 had to bite on: the request records the broker kept, and the
    replies bus intake recorded, by outcome and refusal code."""
    answers = evidence.bus_answers
    return {
        "recordsKept": sum(evidence.bus_kept.values()),
        "eventsKept": len(evidence.bus_kept),
        "recordsWithoutId": evidence.bus_unreadable,
        "recordsAtAClashingOffset": evidence.bus_clashing,
        "replies": dict(sorted(Counter(a.outcome for a in answers).items())),
        "refusals": dict(sorted(Counter(str(a.code) for a in answers if a.code).items())),
    }
