"""The ops endpoints of a long-running command (:mod:`dispatcher.ops`), set up from its
settings: the port of its kind, the database check every process has, the broker's
for the processes that use one."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

from dispatcher.db.engine import engine_for
from dispatcher.ops import DEFAULT_PORTS, Ops, broker_check, database_check, serve_ops
from dispatcher.settings import Settings
from kit.cli import fail


@asynccontextmanager
async def process_ops(settings: Settings, kind: str, *, broker: bool = False) -> AsyncIterator[Ops]:
    """Serve ``kind``'s ops endpoints for the block; yields the :class:`Ops` its parts add
    their own checks to (see :func:`dispatcher.ops.serve_ops` for a taken port)."""
    ops = Ops()
    # Its own one-connection engine: a probe must not wait behind the process's own
    # work for a pooled connection, nor take one from it.
    engine = engine_for(settings.sqlalchemy_url(), pool_size=1)
    ops.add_check("database", database_check(engine))
    if broker and settings.kafka_bootstrap is not None:
        ops.add_check("broker", broker_check(settings.kafka_bootstrap))
    port = DEFAULT_PORTS[kind] if settings.ops_port is None else settings.ops_port
    try:
        async with AsyncExitStack() as serving:
            try:
                await serving.enter_async_context(
                    serve_ops(ops, settings.ops_host, port, required=settings.ops_port is not None)
                )
            except OSError as exc:  # a port that was set explicitly is taken
                fail(f"ops endpoints on {settings.ops_host}:{port}: {exc.strerror or exc}", 1)
            yield ops
    finally:
        await engine.dispose()
