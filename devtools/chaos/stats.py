"""What the load of a chaos run saw: every promise the API made, and every answer the
checker holds against the service."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Ack:
    """A submission the API acknowledged with a 2xx."""

    tenant: str
    tool_call_id: str
    http_status: int
    body: str
    """The request body, so a replay sends exactly the same."""
    at: float = 0.0
    """When it was acknowledged (the event loop's clock)."""
    door: str = "http"
    """``http``, or ``bus`` for an ``accepted`` reply to a request record (its
    ``http_status`` is then what HTTP would have said: 201 if the record made the call,
    200 if it replayed one)."""


@dataclass(frozen=True, slots=True)
class ReplayMismatch:
    original: str
    answered: str | None
    http_status: int


@dataclass
class BusStats:
    """What the load sent through bus intake, by event id (each record's ``ce_id``)."""

    sent_acked: Counter[str] = field(default_factory=Counter)
    """Sends of each event the broker acknowledged."""
    sent_maybe: Counter[str] = field(default_factory=Counter)
    """Sends of each event that failed without knowing (a timeout, a broker away): the
    record may have been written all the same."""
    hostile: set[str] = field(default_factory=set)
    """The events sent with a hostile body (devtools.hostile): never to be accepted."""
    doubled: int = 0
    """Events sent twice, as a producer retrying after a timeout does."""
    replies: Counter[str] = field(default_factory=Counter)
    """The first reply the load read to each event, by outcome (``none`` when it read
    none in time)."""

    def summary(self) -> dict[str, Any]:
        return {
            "events": len(self.sent_acked.keys() | self.sent_maybe.keys()),
            "sendsAcknowledged": sum(self.sent_acked.values()),
            "sendsMaybe": sum(self.sent_maybe.values()),
            "doubled": self.doubled,
            "hostile": len(self.hostile),
            "replies": dict(sorted(self.replies.items())),
        }


@dataclass
class LoadStats:
    attempted: int = 0
    acks: list[Ack] = field(default_factory=list)
    replays: int = 0
    replay_mismatches: list[ReplayMismatch] = field(default_factory=list)
    refused: Counter[str] = field(default_factory=Counter)
    """Answers other than 2xx (by status), and requests that got no answer (by error)."""
    by_kind: Counter[str] = field(default_factory=Counter)
    approvals: Counter[str] = field(default_factory=Counter)
    runs_stopped: int = 0
    hostile: Counter[str] = field(default_factory=Counter)
    """Hostile submissions by ``kind:status`` (``kind:no-answer`` when none came)."""
    hostile_misanswered: list[str] = field(default_factory=list)
    """Hostile submissions answered with anything but a 4xx problem+json."""
    valid_refused: list[str] = field(default_factory=list)
    """Valid submissions refused with a 4xx they did not deserve."""
    mirrored: int = 0
    """Submissions both tenants sent, with the same ids."""
    oversized: list[tuple[str, str]] = field(default_factory=list)
    """``(tenant, toolCallId)`` of every call made too large to announce on purpose
    (submitted; its answer may have been lost)."""
    stops: set[tuple[str, str]] = field(default_factory=set)
    """``(tenant, runId)`` of every run a tenant asked to stop (answered or not)."""
    foreign_refusals: list[str] = field(default_factory=list)
    """Submissions refused as ``run_stopped`` for a run their tenant never stopped."""
    bus: BusStats = field(default_factory=BusStats)

    def summary(self) -> dict[str, Any]:
        return {
            "attempted": self.attempted,
            "acknowledged": len(self.acks),
            "byTenant": dict(sorted(Counter(a.tenant for a in self.acks).items())),
            "byDoor": dict(sorted(Counter(a.door for a in self.acks).items())),
            "byKind": dict(sorted(self.by_kind.items())),
            "mirrored": self.mirrored,
            "replays": self.replays,
            "replayMismatches": len(self.replay_mismatches),
            "notAcknowledged": dict(sorted(self.refused.items())),
            "approvals": dict(sorted(self.approvals.items())),
            "runsStopped": self.runs_stopped,
            "hostile": dict(sorted(self.hostile.items())),
            "hostileMisanswered": len(self.hostile_misanswered),
            "validRefused": len(self.valid_refused),
            "bus": self.bus.summary(),
        }
