"""The local stack: whatever the settings leave unconfigured is started embedded
(PostgreSQL, Tansu), the schema is migrated, and the resolved settings are returned."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from dispatcher import migrate
from dispatcher.embedded import EmbeddedPostgres, Tansu
from dispatcher.settings import ApiKey, Settings, hash_api_key


@dataclass
class Stack:
    settings: Settings
    dev_api_key: str | None = None
    started: list[str] = field(default_factory=list)


@asynccontextmanager
async def local_stack(settings: Settings) -> AsyncIterator[Stack]:
    """Yield a :class:`Stack` whose settings name a migrated database and a broker."""
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    pg: EmbeddedPostgres | None = None
    broker: Tansu | None = None
    updates: dict[str, object] = {}
    started: list[str] = []
    try:
        if settings.database_url is None:
            pg = EmbeddedPostgres(settings.state_dir.resolve() / "pgdata")
            updates["database_url"] = await asyncio.to_thread(pg.start)
            started.append(f"embedded PostgreSQL  {updates['database_url']}")
        if settings.kafka_bootstrap is None:
            broker = Tansu(log_file=settings.state_dir / "tansu.log")
            updates["kafka_bootstrap"] = await asyncio.to_thread(broker.start)
            # Tansu rejects the idempotent producer.
            updates["kafka_enable_idempotence"] = False
            started.append(f"embedded Tansu       {updates['kafka_bootstrap']} (memory only)")
        dev_key = None
        if not settings.api_keys:
            dev_key = _dev_api_key(settings)
            updates["api_keys"] = [ApiKey(sha256=hash_api_key(dev_key), tenant="dev", name="dev")]
        resolved = settings.model_copy(update=updates)
        await migrate.upgrade_async(resolved.database_url or "")
        yield Stack(resolved, dev_key, started)
    finally:
        if broker is not None:
            await asyncio.to_thread(broker.stop)
        if pg is not None:
            await asyncio.to_thread(pg.stop)


def _dev_api_key(settings: Settings) -> str:
    """A per-checkout development key, kept in the state directory."""
    path = settings.state_dir / "dev-api-key"
    if path.exists():
        return path.read_text().strip()
    key = "dev_" + secrets.token_urlsafe(24)
    path.write_text(key + "\n")
    path.chmod(0o600)
    return key
