"""The sandbox registry: capabilities whose providers are the sandbox on its default
port. Only `up`, `demo`, `chaos` and the tests use it; a production process is given
its registry by TOOL_DISPATCHER_CAPABILITIES_FILE."""

from __future__ import annotations

from pathlib import Path

from dispatcher.capabilities import CapabilityRegistry, load_registry

SANDBOX_REGISTRY = Path(__file__).with_name("sandbox_registry.toml")


def sandbox_registry() -> CapabilityRegistry:
    return load_registry(SANDBOX_REGISTRY)
