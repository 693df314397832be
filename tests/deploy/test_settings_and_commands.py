"""What the manifests tell the processes is what the processes read: every
``TOOL_DISPATCHER_*`` name is a field of Settings, every container's args parse with
the real command line (plugins included), every probe is on the port that process
serves, and the pieces the manifests name (topics, the capability file, the alert
rules) are the service's own."""

from __future__ import annotations

import argparse
import contextlib
import io
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]  # no stubs installed; read as Any

from dispatcher.capabilities import load_registry
from dispatcher.ops import DEFAULT_PORTS
from dispatcher.settings import DEFAULT_TOPICS, Settings
from tests.deploy.manifests import (
    DEPLOY,
    KUSTOMIZE,
    OVERLAYS,
    PREFIX,
    Manifest,
    containers,
    is_setting,
    pod_specs,
    render,
    settings_config_map,
    settings_of,
)
from tool_dispatcher.main import TRACED, build_parser

# The port each long-running process serves its probes on, by its subcommand: the API
# on http_port, the others on their kind's ops port. Read from the command line's own
# tables (the subcommand's process kind, that kind's port), so a process added there is
# one the manifests must run.
PROBE_PORTS = {
    "serve": Settings().http_port,
    **{command: DEFAULT_PORTS[kind] for command, kind in TRACED.items() if kind in DEFAULT_PORTS},
}


def setting_names(docs: list[Manifest]) -> set[str]:
    """Every TOOL_DISPATCHER_* name: a container's env, and a ConfigMap's keys."""
    names: set[str] = set()
    for doc in docs:
        if doc["kind"] == "ConfigMap":
            names |= {k for k in doc.get("data", {}) if k.startswith(PREFIX)}
    for _, spec in pod_specs(docs):
        for container in containers(spec):
            names |= {e["name"] for e in container.get("env", [])}
    return names


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_setting_name_is_a_field_of_settings(overlay: str) -> None:
    names = setting_names(render(overlay))

    assert "TOOL_DISPATCHER_DATABASE_URL" in names
    assert sorted(n for n in names if not is_setting(n)) == []


def test_a_misspelt_name_is_no_setting() -> None:
    assert is_setting("TOOL_DISPATCHER_RELAY__BATCH_SIZE")
    assert is_setting("TOOL_DISPATCHER_BUS__TOPICS")
    assert not is_setting("TOOL_DISPATCHER_DATABASE_URI")
    assert not is_setting("TOOL_DISPATCHER_RELAY__BATCH")
    assert not is_setting("TOOL_DISPATCHER_BUS__TOPIC")
    # A plain field has no fields of its own.
    assert not is_setting("TOOL_DISPATCHER_DATABASE_URL__X")


def parse(args: list[str]) -> argparse.Namespace | str:
    """The parsed args, or the parser's one-line complaint."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return build_parser().parse_args(args)
    except SystemExit:
        return err.getvalue().strip()


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_container_runs_a_real_subcommand(overlay: str) -> None:
    bad: dict[str, Any] = {}
    for where, spec in pod_specs(render(overlay)):
        for container in containers(spec):
            assert "command" not in container, f"{where}: the image's entrypoint is the CLI"
            parsed = parse(container["args"])
            if isinstance(parsed, str):
                bad[f"{where}/{container['name']}"] = parsed
    assert bad == {}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_pod_waits_for_the_schema(overlay: str) -> None:
    for where, spec in pod_specs(render(overlay)):
        first = spec["containers"][0]["args"]
        inits = [c["args"] for c in spec.get("initContainers", [])]
        expected = [] if first == ["migrate"] else [["migrate", "--check"]]
        assert inits == expected, where


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_probe_is_on_the_port_its_process_serves(overlay: str) -> None:
    probed = set()
    for where, spec in pod_specs(render(overlay)):
        for container in spec["containers"]:
            ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
            for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
                if probe not in container:
                    continue
                get = container[probe]["httpGet"]
                assert get["path"] == path, where
                port = ports.get(get["port"], get["port"])
                assert port == PROBE_PORTS[container["args"][0]], where
                probed.add(container["args"][0])
    assert {"serve", "worker", "bus-intake", "relay", "webhooks"} <= probed


def test_every_long_running_process_is_deployed() -> None:
    # Each subcommand with ops endpoints of its own is a process the service runs: the
    # production overlay must run it, as a Deployment or a CronJob (`--once`).
    run = {
        container["args"][0]
        for _, spec in pod_specs(render("production"))
        for container in spec["containers"]
    }

    assert set(PROBE_PORTS) - run == set()


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_every_deployment_is_scraped_under_a_job_the_rules_know() -> None:
    docs = render("production")
    by_kind: dict[str, list[Manifest]] = {}
    for doc in docs:
        by_kind.setdefault(doc["kind"], []).append(doc)
    # The jobs deploy/observability/README.md lists, which the rules and panels assume.
    listed = (DEPLOY / "observability" / "README.md").read_text()
    unscraped = []
    for deployment in by_kind["Deployment"]:
        pod = deployment["spec"]["template"]["metadata"]["labels"]
        # prometheus-operator names a ServiceMonitor's job after the Service it selects.
        jobs = {
            service["metadata"]["name"]
            for service in by_kind["Service"]
            if selects(service["spec"]["selector"], pod)
            and any(
                selects(monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])
                for monitor in by_kind["ServiceMonitor"]
            )
        }
        if not any(f"| `{job}` |" in listed for job in jobs):
            unscraped.append(deployment["metadata"]["name"])

    assert unscraped == []


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_kafka_topics_are_the_services(overlay: str) -> None:
    docs = render(overlay)
    topics = {d["spec"]["topicName"]: d["spec"] for d in docs if d["kind"] == "KafkaTopic"}
    settings = settings_config_map(docs)
    routes = settings_of(settings).bus.routes().values()

    # The service's three, and each bus route's request, replies and dead-letters
    # topics (the relay would otherwise create them, at replication 1).
    expected = {DEFAULT_TOPICS.dispatch, DEFAULT_TOPICS.events, DEFAULT_TOPICS.escalations}
    expected |= {t for r in routes for t in (r.topic, r.replies, r.dead_letters)}
    assert routes
    assert set(topics) == expected
    assert settings["TOOL_DISPATCHER_DISPATCH_TOPIC"] == DEFAULT_TOPICS.dispatch
    dispatch_partitions = topics[DEFAULT_TOPICS.dispatch]["partitions"]
    assert int(settings["TOOL_DISPATCHER_TOPIC_PARTITIONS"]) == dispatch_partitions
    # A worker beyond the dispatch topic's partitions would get none (README: scaling).
    [worker] = [
        d
        for d in docs
        if d["metadata"]["name"] == "tool-dispatcher-worker" and d["kind"] == "Deployment"
    ]
    assert worker["spec"]["replicas"] <= dispatch_partitions


def test_production_keeps_a_message_on_two_brokers_before_it_is_acknowledged() -> None:
    docs = render("production")
    topics = [d["spec"] for d in docs if d["kind"] == "KafkaTopic"]
    [kafka] = [d["spec"]["kafka"]["config"] for d in docs if d["kind"] == "Kafka"]
    [db] = [d["spec"] for d in docs if d["kind"] == "Cluster"]

    assert all(t["replicas"] == 3 and t["config"]["min.insync.replicas"] == 2 for t in topics)
    assert kafka["unclean.leader.election.enable"] is False
    assert db["instances"] == 3 and db["postgresql"]["synchronous"]["number"] >= 1


def test_the_capability_file_is_a_valid_registry() -> None:
    registry = load_registry(KUSTOMIZE / "base" / "capabilities.toml")

    assert len(registry) == 1


def test_the_prometheus_rule_is_alerts_yaml() -> None:
    rule = yaml.safe_load(Path(DEPLOY / "observability" / "prometheusrule.yaml").read_text())
    alerts = yaml.safe_load(Path(DEPLOY / "observability" / "alerts.yaml").read_text())

    assert rule["spec"] == alerts


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_pod_spreads_and_writes_only_to_its_empty_dir(overlay: str) -> None:
    # checkov checks the security context and resources; these two it does not.
    for where, spec in pod_specs(render(overlay)):
        keys = {c["topologyKey"] for c in spec.get("topologySpreadConstraints", [])}
        assert {"topology.kubernetes.io/zone", "kubernetes.io/hostname"} <= keys, where
        scratch = {v["name"] for v in spec["volumes"] if "emptyDir" in v}
        for container in containers(spec):
            assert container["securityContext"]["readOnlyRootFilesystem"] is True, where
            mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
            assert {n for n in mounts if n in scratch} == {"tmp"}, where
            # The state dir (TOOL_DISPATCHER_STATE_DIR) lives under it.
            assert mounts["tmp"] == "/tmp", where  # noqa: S108  # a path in a pod, not here


# RFC 1918, link-local (cloud metadata) and carrier-grade NAT.
PRIVATE_RANGES = {
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "169.254.0.0/16",
    "100.64.0.0/10",
}


def policy_ports(rules: list[Manifest]) -> set[int]:
    return {p["port"] for rule in rules for p in rule.get("ports", [{"port": "any"}])}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_network_policies_open_only_what_each_process_uses(overlay: str) -> None:
    docs = render(overlay)
    policies = {
        d["spec"]["podSelector"]["matchLabels"].get("app.kubernetes.io/component", "*"): d["spec"]
        for d in docs
        if d["kind"] == "NetworkPolicy"
    }
    # Deny by default: one policy selecting every pod of the service, with no rule.
    assert policies["*"]["policyTypes"] == ["Ingress", "Egress"]
    assert "ingress" not in policies["*"] and "egress" not in policies["*"]
    components = {
        doc["metadata"]["labels"]["app.kubernetes.io/component"]
        for doc in docs
        if doc["kind"] in ("Deployment", "Job", "CronJob")
    }
    assert components <= set(policies)

    assert policy_ports(policies["api"]["ingress"]) == {Settings().http_port}
    for component in ("worker", "reconciler"):
        # DNS, the database, the broker, the providers' HTTPS: nothing else.
        assert policy_ports(policies[component]["egress"]) == {53, 5432, 9092, 443}
    for component in ("relay", "bus-intake"):
        # They call no provider: DNS, the database and the broker only.
        assert policy_ports(policies[component]["egress"]) == {53, 5432, 9092}
    # The webhook sender: DNS, the database and its receivers' HTTPS; no broker.
    assert policy_ports(policies["webhooks"]["egress"]) == {53, 5432, 443}
    # Its receivers are whatever URL a subscription names: none may be inside the
    # cluster's or the cloud's private ranges (the metadata endpoint above all).
    [public] = [
        to["ipBlock"]
        for rule in policies["webhooks"]["egress"]
        for to in rule["to"]
        if "ipBlock" in to
    ]
    assert public["cidr"] == "0.0.0.0/0"
    assert set(public["except"]) >= PRIVATE_RANGES
    # Each ops port, from where the worker's is reachable (Prometheus) only.
    [worker] = policies["worker"]["ingress"]
    for component in ("bus-intake", "webhooks"):
        [rule] = policies[component]["ingress"]
        assert rule["from"] == worker["from"], component
        assert policy_ports([rule]) == {DEFAULT_PORTS[component]}, component
