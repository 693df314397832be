"""The rendered overlays of deploy/kustomize, and the tools the deploy tests run. Every
tool is a wheel of the dev extras installed beside this interpreter (no download)."""

from __future__ import annotations

import functools
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped]  # no stubs installed; read as Any

from dispatcher.settings import RelaySettings, Settings

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
KUSTOMIZE = DEPLOY / "kustomize"
OVERLAYS = ("dev", "production")
BIN = Path(sys.executable).parent
PREFIX = "TOOL_DISPATCHER_"

Manifest = dict[str, Any]


def tool(name: str) -> str:
    return str(BIN / name)


def render_text(overlay: str) -> str:
    """``kubectl kustomize`` of one overlay (a failure to render fails the caller)."""
    result = subprocess.run(
        [tool("kubectl"), "kustomize", str(KUSTOMIZE / "overlays" / overlay)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


@functools.cache
def _render(overlay: str) -> tuple[Manifest, ...]:
    return tuple(d for d in yaml.safe_load_all(render_text(overlay)) if d)


def render(overlay: str) -> list[Manifest]:
    return list(_render(overlay))


def pod_specs(docs: list[Manifest]) -> Iterator[tuple[str, Manifest]]:
    """(kind/name, pod spec) of every workload: Deployment, Job, CronJob."""
    for doc in docs:
        kind, name = doc["kind"], doc["metadata"]["name"]
        if kind in ("Deployment", "Job"):
            yield f"{kind}/{name}", doc["spec"]["template"]["spec"]
        elif kind == "CronJob":
            yield f"{kind}/{name}", doc["spec"]["jobTemplate"]["spec"]["template"]["spec"]


def containers(spec: Manifest) -> list[Manifest]:
    return [*spec.get("initContainers", []), *spec["containers"]]


def is_setting(name: str) -> bool:
    """Whether ``name`` is a setting Settings reads. Settings ignores any other
    TOOL_DISPATCHER_* variable, so a misspelt one would pass unnoticed without this."""
    field, _, nested = name.removeprefix(PREFIX).lower().partition("__")
    if field not in Settings.model_fields:
        return False
    return not nested or (field == "relay" and nested in RelaySettings.model_fields)
