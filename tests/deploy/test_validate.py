"""Every overlay renders, its core kinds are valid (strictly: no unknown field) for a
named Kubernetes version, and checkov fails none of its checks on it."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate  # type: ignore[import-untyped]  # no stubs; its own schemas
import pytest

from tests.deploy.checkov import run_checkov
from tests.deploy.manifests import OVERLAYS, render, render_text

# The oldest Kubernetes the manifests support (autoscaling/v2, policy/v1, batch/v1
# CronJob, timeZone-free schedules); kubernetes-validate ships its schema.
KUBERNETES_VERSION = "1.30.0"

# Custom resources of operators the cluster must run: kubernetes-validate has schemas
# of Kubernetes' own kinds only, so these are skipped by kind. Their shape is each
# operator's to check on apply (Strimzi, CloudNativePG, prometheus-operator).
CUSTOM_KINDS = {
    "Kafka": "Strimzi (kafka.strimzi.io/v1beta2)",
    "KafkaNodePool": "Strimzi (kafka.strimzi.io/v1beta2)",
    "KafkaTopic": "Strimzi (kafka.strimzi.io/v1beta2)",
    "KafkaUser": "Strimzi (kafka.strimzi.io/v1beta2)",
    "Cluster": "CloudNativePG (postgresql.cnpg.io/v1)",
    "ScheduledBackup": "CloudNativePG (postgresql.cnpg.io/v1)",
    "ServiceMonitor": "prometheus-operator (monitoring.coreos.com/v1)",
    "PrometheusRule": "prometheus-operator (monitoring.coreos.com/v1)",
}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_core_kinds_are_valid_for_the_named_kubernetes_version(overlay: str) -> None:
    invalid: list[str] = []
    for doc in render(overlay):
        if doc["kind"] in CUSTOM_KINDS:
            continue
        # A kind without a schema (a typo of a core kind) raises SchemaNotFoundError.
        try:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            invalid.append(f"{doc['kind']}/{doc['metadata']['name']} {path}: {exc.message}")

    assert invalid == []


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_no_secret_is_committed(overlay: str) -> None:
    # Secrets are referenced by name only; their values are the cluster operator's.
    assert [d["metadata"]["name"] for d in render(overlay) if d["kind"] == "Secret"] == []


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_checkov_fails_no_check_of_the_rendered_manifests(overlay: str, tmp_path: Path) -> None:
    rendered = tmp_path / f"{overlay}.yaml"
    rendered.write_text(render_text(overlay))

    assert run_checkov(rendered, "kubernetes") == []
