"""How the console writes values: times in UTC beside their age, JSON indented. Pure
functions, registered as template filters."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote


def utc(value: datetime | None) -> str:
    if value is None:
        return "—"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def iso(value: datetime | None) -> str:
    return "" if value is None else value.astimezone(UTC).isoformat()


def span(seconds: float) -> str:
    """A duration as its two largest units: ``3d 4h``, ``5m 2s``, ``40s``."""
    whole = int(abs(seconds))
    days, rest = divmod(whole, 86_400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    units = [(days, "d"), (hours, "h"), (minutes, "m"), (secs, "s")]
    shown = [f"{n}{u}" for n, u in units if n][:2]
    return " ".join(shown) or "0s"


def age(value: datetime | None, now: datetime | None = None) -> str:
    """How long ago (or, for a future time, in how long)."""
    if value is None:
        return ""
    delta = ((now or datetime.now(UTC)) - value).total_seconds()
    return f"{span(delta)} ago" if delta >= 0 else f"in {span(delta)}"


def pretty(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


def link(*parts: str) -> str:
    """A console URL whose id segments are always encoded ("?", "#", "%" are legal ids)."""
    return "/console/" + "/".join(quote(p, safe="") for p in parts)


def origin(via: dict[str, Any] | None) -> str:
    """Where a call came from, as its first event's ``via`` names it."""
    if not via:
        return "not recorded (before origins were kept)"
    if "bus" in via:
        bus = via["bus"]
        return f"bus: {bus['topic']} partition {bus['partition']} offset {bus['offset']}"
    return "HTTP API" if "http" in via else "library call (in the caller's transaction)"


FILTERS: dict[str, Callable[..., str]] = {
    "utc": utc,
    "iso": iso,
    "age": age,
    "pretty": pretty,
    "span": span,
    "origin": origin,
}
