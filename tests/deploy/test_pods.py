"""The harness of test_manifests_run: a container's environment is built as the kubelet
builds it, and only paths under a mount are mapped to their copies."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.deploy.pods import map_paths, resolve_env

MAPS = {"settings": {"A": "from-map", "B": "from-map"}}
SECRETS = {"db": {"uri": "postgresql://db"}}


def test_env_wins_over_env_from_and_references_resolve() -> None:
    container = {
        "envFrom": [{"configMapRef": {"name": "settings"}}],
        "env": [
            {"name": "B", "value": "literal"},
            {"name": "C", "valueFrom": {"secretKeyRef": {"name": "db", "key": "uri"}}},
            {"name": "D", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "A"}}},
        ],
    }

    env = resolve_env(container, MAPS, SECRETS)

    assert env == {"A": "from-map", "B": "literal", "C": "postgresql://db", "D": "from-map"}


def test_a_reference_to_nothing_fails_as_the_pod_would() -> None:
    container = {"env": [{"name": "C", "valueFrom": {"secretKeyRef": {"name": "db", "key": "x"}}}]}

    with pytest.raises(KeyError):
        resolve_env(container, MAPS, SECRETS)


def test_only_paths_under_a_mount_are_mapped_the_longest_mount_first() -> None:
    mounts = {
        "/etc/td": Path("/here/config"),
        "/etc/td/keys": Path("/here/keys"),
        "/scratch": Path("/here/tmp"),
    }
    env = {
        "FILE": "/etc/td/capabilities.toml",
        "KEYS": "/etc/td/keys",
        "STATE": "/scratch/state",
        "ELSEWHERE": "/etc/tdx/file",
        "PLAIN": "json",
    }

    assert map_paths(env, mounts) == {
        "FILE": "/here/config/capabilities.toml",
        "KEYS": "/here/keys",
        "STATE": "/here/tmp/state",
        "ELSEWHERE": "/etc/tdx/file",
        "PLAIN": "json",
    }
