"""What every subcommand of `tool-dispatcher` needs from its settings before it runs:
the capability registry a service runs with, refused in one line when it is missing
or wrong."""

from __future__ import annotations

from dispatcher.capabilities import CapabilityRegistry, load_registry
from dispatcher.settings import Settings
from kit.cli import fail


def require_registry(settings: Settings) -> CapabilityRegistry:
    """The registry a service runs with. There is no default: a service that fell back
    to the sandbox registry would send real requests to a local test server."""
    if settings.capabilities_file is None:
        fail("TOOL_DISPATCHER_CAPABILITIES_FILE is not set (the capability registry)")
    try:
        return load_registry(settings.capabilities_file)
    except ValueError as exc:
        fail(str(exc).splitlines()[0])
