"""The rendered overlays of deploy/kustomize, and the tools the deploy tests run. Every
tool is a wheel of the dev extras installed beside this interpreter (no download)."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]  # no stubs installed; read as Any
from pydantic import BaseModel

from dispatcher.settings import Settings

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
    TOOL_DISPATCHER_* variable, so a misspelt one would pass unnoticed without this.
    ``<SECTION>__<FIELD>`` is a field of a section (relay, bus)."""
    field, _, nested = name.removeprefix(PREFIX).lower().partition("__")
    if field not in Settings.model_fields:
        return False
    if not nested:
        return True
    section = Settings.model_fields[field].annotation
    return (
        isinstance(section, type)
        and issubclass(section, BaseModel)
        and nested in section.model_fields
    )


def settings_of(env: dict[str, str]) -> Settings:
    """The Settings a process given ``env`` reads (parsed as Settings parses its
    environment: a section's field as JSON), with nothing of this test's own."""
    with pytest.MonkeyPatch.context() as patch:
        for name in [n for n in os.environ if n.startswith(PREFIX)]:
            patch.delenv(name)
        for name, value in env.items():
            patch.setenv(name, value)
        return Settings()


def settings_config_map(docs: list[Manifest]) -> dict[str, str]:
    """The data of the settings ConfigMap every process reads (its name hash-suffixed)."""
    [data] = [
        d["data"]
        for d in docs
        if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("tool-dispatcher-settings")
    ]
    return dict(data)
