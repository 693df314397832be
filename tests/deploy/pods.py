"""A rendered container as a local process: its args after the image's entrypoint, its
environment with every ConfigMap and Secret reference resolved, and the files it mounts
written under a directory of the test's own (each mount path mapped to its copy).

Nothing here invents a setting: what a container is given is what its manifest says,
and the caller maps addresses (hosts, ports, mount paths) only where a setting names
them."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from tests.deploy.manifests import Manifest, tool

Secrets = dict[str, dict[str, str]]


@dataclass
class Container:
    """One container of one workload, resolved."""

    where: str  # kind/name/container, for messages
    args: list[str]
    env: dict[str, str]
    # Mount path in the pod -> the directory standing in for it here.
    mounts: dict[str, Path] = field(default_factory=dict)
    # containerPort -> the port the local process serves it on.
    ports: dict[str, int] = field(default_factory=dict)


def config_maps(docs: list[Manifest]) -> dict[str, dict[str, str]]:
    """The rendered ConfigMaps' data, by their (hash-suffixed) names."""
    return {d["metadata"]["name"]: d.get("data", {}) for d in docs if d["kind"] == "ConfigMap"}


def resolve_env(
    container: Manifest, maps: dict[str, dict[str, str]], secrets: Secrets
) -> dict[str, str]:
    """The container's environment as the kubelet builds it: ``envFrom`` first, then
    ``env`` over it. A reference to a missing ConfigMap, Secret or key fails (a pod
    would not start); ``optional`` references are not used by the manifests."""
    sources = {"configMapRef": maps, "secretRef": secrets}
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        [(kind, ref)] = source.items()
        env.update(sources[kind][ref["name"]])
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
            continue
        ref = item["valueFrom"]
        if "configMapKeyRef" in ref:
            key = ref["configMapKeyRef"]
            env[item["name"]] = maps[key["name"]][key["key"]]
        else:
            key = ref["secretKeyRef"]
            env[item["name"]] = secrets[key["name"]][key["key"]]
    return env


def write_mounts(
    spec: Manifest,
    container: Manifest,
    root: Path,
    maps: dict[str, dict[str, str]],
    secrets: Secrets,
) -> dict[str, Path]:
    """Each volume the container mounts, as a directory under ``root`` (one per volume
    of the pod, so an emptyDir is shared by its containers like in the pod)."""
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    mounts: dict[str, Path] = {}
    for mount in container.get("volumeMounts", []):
        volume = volumes[mount["name"]]
        here = root / mount["name"]
        here.mkdir(parents=True, exist_ok=True)
        files: dict[str, str] = {}
        if "configMap" in volume:
            files = maps[volume["configMap"]["name"]]
        elif "secret" in volume:
            files = secrets[volume["secret"]["secretName"]]
        else:
            assert "emptyDir" in volume, f"{mount['name']}: an unexpected volume kind"
        for name, text in files.items():
            (here / name).write_text(text)
        mounts[mount["mountPath"]] = here
    return mounts


def map_paths(env: dict[str, str], mounts: dict[str, Path]) -> dict[str, str]:
    """Every setting naming a path under a mount now names the same path in its copy;
    a path under no mount is left as it is (and fails if the process needs it)."""
    # The longest mount path first: /etc/x/y is under /etc/x/y before /etc/x.
    by_length = sorted(mounts, key=len, reverse=True)

    def mapped(value: str) -> str:
        for mount_path in by_length:
            base = mount_path.rstrip("/")
            if value == base or value.startswith(base + "/"):
                return str(mounts[mount_path]) + value[len(base) :]
        return value

    return {name: mapped(value) for name, value in env.items()}


def base_environment(home: Path) -> dict[str, str]:
    """What the image's environment gives every process besides the manifest's: a PATH
    and a HOME. Nothing of this test's own environment (no TOOL_DISPATCHER_*)."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home)}


class Processes:
    """The local processes of the rendered workloads; all stopped at close."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.running: dict[str, subprocess.Popen[bytes]] = {}

    def _log(self, container: Container) -> Path:
        return self.root / (container.where.replace("/", "_") + ".log")

    def command(self, container: Container) -> list[str]:
        # The image's ENTRYPOINT is ["tool-dispatcher"]; the manifests pass only args.
        return [tool("tool-dispatcher"), *container.args]

    def run_together(self, items: list[tuple[Container, dict[str, str]]]) -> dict[str, int]:
        """Start each, then wait for all: their exit codes (a minute each at most)."""
        started = [(c.where, self.spawn(c, env)) for c, env in items]
        codes = {}
        for where, process in started:
            try:
                codes[where] = process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                codes[where] = process.wait()
        return codes

    def spawn(self, container: Container, env: dict[str, str]) -> subprocess.Popen[bytes]:
        # The child keeps its own copy of the descriptor; ours is closed at once.
        with self._log(container).open("wb") as log:
            return subprocess.Popen(
                self.command(container),
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def start(self, container: Container, env: dict[str, str]) -> subprocess.Popen[bytes]:
        """A long-running process, stopped by :meth:`stop`."""
        process = self.spawn(container, env)
        self.running[container.where] = process
        return process

    def log_of(self, where: str, lines: int = 30) -> str:
        """The end of its output: where a process that died says why."""
        text = (self.root / (where.replace("/", "_") + ".log")).read_text(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> dict[str, int]:
        """SIGTERM to each (as the kubelet does), then their exit codes."""
        for process in self.running.values():
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signal.SIGTERM)
        codes = {}
        for where, process in self.running.items():
            try:
                codes[where] = process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                codes[where] = process.wait()
        return codes
