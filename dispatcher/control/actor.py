"""Who issued a control command: an API key (its name and tenant) or a CLI user. Every
command records its actor in the events it writes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Actor:
    """An API key (name and tenant) or a CLI user."""

    name: str
    tenant: str | None
    via: str

    @property
    def label(self) -> str:
        return f"{self.name}@{self.tenant or '*'} ({self.via})"

    def as_payload(self) -> dict[str, Any]:
        return {"name": self.name, "tenant": self.tenant, "via": self.via}
