"""How long each tenant's finished calls stay, and how long each capability's provider
keeps an idempotency key: what makes a call due (pure; built from the settings and the
registry once per pass)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from dispatcher.capabilities import CapabilityRegistry, ReconcilePolicy
from dispatcher.settings import Settings

DEFAULT_WINDOW_SECONDS: float = ReconcilePolicy.model_fields["idempotency_window_seconds"].default


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    default_days: float
    days_by_tenant: Mapping[str, float] = field(default_factory=dict)
    # Each capability's reconcile.idempotencyWindowSeconds: a call dispatched less than
    # this long ago may still be re-sent or looked up by its key, so it stays.
    windows: Mapping[str, float] = field(default_factory=dict)
    batch_size: int = 500

    @classmethod
    def of(cls, settings: Settings, registry: CapabilityRegistry) -> RetentionPolicy:
        return cls(
            default_days=settings.retention_days,
            days_by_tenant=dict(settings.retention_days_by_tenant),
            windows={c.id: c.reconcile.idempotency_window_seconds for c in registry},
            batch_size=settings.retention_batch_size,
        )

    def days(self, tenant: str) -> float:
        return self.days_by_tenant.get(tenant, self.default_days)

    def cutoff(self, tenant: str, now: datetime) -> datetime:
        """A terminal call of ``tenant`` last changed before this is due."""
        return now - timedelta(days=self.days(tenant))

    def shortest_days(self) -> float:
        return min([self.default_days, *self.days_by_tenant.values()])

    def unknown_window(self) -> float:
        """The window of a capability no longer in the registry: the longest known one
        (at least the default), since nothing says its provider forgot the key."""
        return max([DEFAULT_WINDOW_SECONDS, *self.windows.values()])
