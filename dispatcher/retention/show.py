"""An archived run, folded into the view the API serves for ``GET /v1/runs/{runId}``,
from the archive alone: its events (those archived with its calls, and its run-level
ones archived with their day) go through :func:`dispatcher.views.run_view.fold_run`."""

from __future__ import annotations

from dispatcher.errors import RunNotFound
from dispatcher.retention.archive import Archive
from dispatcher.retention.rows import events_of
from dispatcher.views.run_view import RunView, fold_run


def archived_run(archive: Archive, tenant: str, run_id: str) -> RunView:
    """The run's view from ``tenant``'s archived events (RunNotFound if it has none).
    Blocking I/O: every events file of the tenant is listed, and read for the run's
    rows only."""
    paths = archive.tenant_files(tenant, "events")
    if not paths:
        raise RunNotFound(run_id)
    table = archive.read(paths, equal={"run_id": run_id, "tenant": tenant})
    if table.num_rows == 0:
        raise RunNotFound(run_id)
    return fold_run(run_id, events_of(table))
