"""The manifests are executable: every Deployment, Job and CronJob of the
rendered dev overlay runs as a local process, with the container's args after the
image's entrypoint and the environment its manifest gives it, against the test's
PostgreSQL, broker and sandbox provider.

What the test supplies, and nothing more:
- the Secrets' values: the database URL (a fresh, empty database), an API key's hash,
  the console secret, a provider credential file per capability id, a webhook signing
  secret per subscription of webhooks.json;
- the files the pods mount (the ConfigMaps' capabilities.toml and webhooks.json, the
  credential and signing-secret Secrets, the /tmp emptyDir) as directories of its own:
  every setting naming a path under a mount path (TOOL_DISPATCHER_CAPABILITIES_FILE,
  TOOL_DISPATCHER_PROVIDER_SECRETS_DIR, TOOL_DISPATCHER_WEBHOOKS__SUBSCRIPTIONS_FILE,
  TOOL_DISPATCHER_WEBHOOKS__SECRETS_DIR, TOOL_DISPATCHER_STATE_DIR) is mapped to the
  same path in its copy;
- addresses on 127.0.0.1 in place of the cluster's names: TOOL_DISPATCHER_KAFKA_BOOTSTRAP
  (which must name the overlay's Strimzi bootstrap service) becomes the test broker's,
  and the provider origin in capabilities.toml becomes the sandbox's (the sandbox serves
  the same contract at /v1/requests, so that path replaces the example's /v1/refunds);
- ports: TOOL_DISPATCHER_HTTP_PORT (the API) and TOOL_DISPATCHER_OPS_PORT (the others)
  are free ports, since the pods' fixed ports (8780-8786) may be taken on a shared
  machine; each containerPort maps to its process's port, and the readiness probes are
  asked there;
- TOOL_DISPATCHER_KAFKA_ENABLE_IDEMPOTENCE=false: the test broker (Tansu) refuses the
  idempotent producer that the manifests rightly turn on for Strimzi;
- the calls: a few over HTTP to the API, and one request record on each request topic
  of the routes bus intake is given (TOOL_DISPATCHER_BUS__TOPICS), as that route's
  tenant's producer would send it. Each record must be answered, accepted for the
  route's tenant, on the route's replies topic, and dispatched like the others.

A wrong subcommand or flag makes its process exit non-zero; a missing or misspelt
setting the process needs makes it fail or never finish the calls; and a misspelt name
a process would silently ignore (Settings ignores unknown variables) fails the check
that every TOOL_DISPATCHER_* name given to a process is a setting."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import re
import secrets
import signal
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from devtools.embedded import free_port
from devtools.sandbox import SandboxServer
from dispatcher.settings import BusRoute, hash_api_key
from tests.deploy.manifests import PREFIX, Manifest, is_setting, render, settings_of
from tests.deploy.pods import (
    Container,
    Processes,
    base_environment,
    config_maps,
    map_paths,
    resolve_env,
    write_mounts,
)
from tests.fixtures.bus import headers, producing
from tests.fixtures.sandbox import books
from tests.fixtures.waiting import eventually

pytestmark = [pytest.mark.postgres, pytest.mark.kafka]

API_KEY = "tdk_deploy_manifests_run"
CALLS = 3
IN_FLIGHT = {"authorized", "dispatching", "accepted"}
# The one setting overridden beyond addresses and ports (see the module's docstring).
# Tansu answers InitProducerId with an error, so the relay could not start at all.
BROKER_LIMITS = {f"{PREFIX}KAFKA_ENABLE_IDEMPOTENCE": "false"}
# An example provider's endpoint, as far as the sandbox's own path: the rest (an id,
# a query) is the sandbox's contract too.
PROVIDER = re.compile(r"https?://[^/\"]+/v1/[A-Za-z0-9_-]+")


@dataclass(frozen=True)
class Pod:
    kind: str
    name: str
    spec: Manifest


def workloads(docs: list[Manifest], kind: str) -> list[Pod]:
    """The pod of every workload of ``kind`` (Deployment, Job or CronJob)."""
    pods = []
    for doc in docs:
        if doc["kind"] == kind:
            spec = doc["spec"].get("jobTemplate", doc)["spec"]["template"]["spec"]
            pods.append(Pod(kind, doc["metadata"]["name"], spec))
    return pods


def strimzi_bootstrap(docs: list[Manifest]) -> str:
    """The plain listener of the overlay's Strimzi Kafka: ``<name>-kafka-bootstrap:port``."""
    [kafka] = [d for d in docs if d["kind"] == "Kafka"]
    [port] = [ln["port"] for ln in kafka["spec"]["kafka"]["listeners"] if not ln["tls"]]
    return f"{kafka['metadata']['name']}-kafka-bootstrap:{port}"


def secret_values(docs: list[Manifest], database_url: str) -> dict[str, dict[str, str]]:
    """The Secrets the manifests reference, with test values (README: the process map)."""
    [cluster] = [d for d in docs if d["kind"] == "Cluster"]
    [config] = [d["data"] for d in docs if "capabilities.toml" in d.get("data", {})]
    [webhooks] = [d["data"] for d in docs if "webhooks.json" in d.get("data", {})]
    capabilities = tomllib.loads(config["capabilities.toml"])["capability"]
    keys = [{"sha256": hash_api_key(API_KEY), "tenant": "acme", "scopes": ["submit", "read"]}]
    return {
        # CloudNativePG writes <cluster>-app for the Cluster the overlay declares.
        f"{cluster['metadata']['name']}-app": {"uri": database_url},
        "tool-dispatcher-api-keys": {"api-keys": json.dumps(keys)},
        "tool-dispatcher-console": {"secret": "deploy-test-console-secret"},
        "tool-dispatcher-provider-credentials": {c["id"]: "sandbox-token" for c in capabilities},
        # A signing secret per subscription of the sender's file (none in the base).
        "tool-dispatcher-webhook-secrets": {
            s["id"]: "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()
            for s in json.loads(webhooks["webhooks.json"])
        },
    }


class Cluster:
    """The rendered dev overlay, its containers resolved for local processes."""

    def __init__(self, root: Path, database_url: str, kafka_bootstrap: str, sandbox: str):
        self.docs = render("dev")
        self.root = root
        self.secrets = secret_values(self.docs, database_url)
        # The provider hosts are in the capability file only.
        self.maps = {
            name: {
                k: PROVIDER.sub(sandbox + "/v1/requests", v) if k == "capabilities.toml" else v
                for k, v in data.items()
            }
            for name, data in config_maps(self.docs).items()
        }
        self.bootstrap = (strimzi_bootstrap(self.docs), kafka_bootstrap)
        self.processes = Processes(root)
        self.given: dict[str, dict[str, str]] = {}  # the manifest's env, per container

    def container(self, pod: Pod, item: Manifest) -> Container:
        where = f"{pod.kind}/{pod.name}/{item['name']}"
        # The process is the image's entrypoint with these args (no command override).
        assert "command" not in item, where
        env = resolve_env(item, self.maps, self.secrets)
        self.given[where] = env
        mounts = write_mounts(pod.spec, item, self.root / pod.name, self.maps, self.secrets)
        return Container(where, list(item["args"]), map_paths(env, mounts), mounts)

    def environment(self, container: Container) -> dict[str, str]:
        env = dict(container.env)
        bootstrap = f"{PREFIX}KAFKA_BOOTSTRAP"
        if bootstrap in env:
            assert env[bootstrap] == self.bootstrap[0], container.where
            env[bootstrap] = self.bootstrap[1]
        for port in container.ports.values():
            setting = "HTTP_PORT" if container.args[0] == "serve" else "OPS_PORT"
            env[f"{PREFIX}{setting}"] = str(port)
        home = self.root / "home"
        home.mkdir(exist_ok=True)
        return {**base_environment(home), **env, **BROKER_LIMITS}

    def run(self, containers: list[Container]) -> None:
        """Containers that run to completion, side by side as the kubelet runs separate
        pods: each must exit 0."""
        codes = self.processes.run_together([(c, self.environment(c)) for c in containers])
        failed = {w: self.processes.log_of(w) for w, code in codes.items() if code != 0}
        assert failed == {}, failed

    def run_pods(self, pods: list[Pod]) -> None:
        """Pods that run to completion (Jobs): every init container, then every
        container."""
        self.run([self.container(p, i) for p in pods for i in p.spec.get("initContainers", [])])
        self.run([self.container(p, i) for p in pods for i in p.spec["containers"]])

    def start_pods(self, pods: list[Pod]) -> list[tuple[Container, Manifest]]:
        """Deployments' pods: their init containers must exit 0, then their containers
        start (each container port on a free port)."""
        self.run([self.container(p, i) for p in pods for i in p.spec.get("initContainers", [])])
        started = []
        for pod in pods:
            for item in pod.spec["containers"]:
                container = self.container(pod, item)
                container.ports = {port["name"]: free_port() for port in item.get("ports", [])}
                self.processes.start(container, self.environment(container))
                started.append((container, item))
        return started

    def running(self) -> None:
        """Every long-running process is still up."""
        for where, process in self.processes.running.items():
            assert process.poll() is None, self.processes.log_of(where)

    async def ready(self, container: Container, item: Manifest) -> None:
        """Its readiness probe answers 200 on the port it maps to."""
        probe = item["readinessProbe"]["httpGet"]
        url = f"http://127.0.0.1:{container.ports[probe['port']]}{probe['path']}"
        process = self.processes.running[container.where]

        async def answered() -> bool:
            assert process.poll() is None, self.processes.log_of(container.where)
            try:
                async with httpx.AsyncClient(timeout=3) as client:
                    return (await client.get(url)).status_code == 200
            except httpx.TransportError:
                return False

        await eventually(answered, within=45, what=f"{container.where} to be ready")


async def submit_and_complete(
    api: str, capability_id: str, running: Callable[[], None]
) -> list[str]:
    """CALLS calls through the API process, each awaited until it completed, while
    ``running()`` finds every process still up."""
    async with httpx.AsyncClient(
        base_url=api, timeout=10, headers={"Authorization": f"Bearer {API_KEY}"}
    ) as client:
        ids = []
        for i in range(CALLS):
            body = {
                "runId": "deploy-run",
                "capabilityId": capability_id,
                "correlationId": f"corr-{i}",
                "input": {"orderId": f"order-{i}"},
            }
            response = await client.post("/v1/tool-calls", json=body)
            assert response.status_code == 201, response.text
            ids.append(response.json()["toolCallId"])

        async def all_completed() -> bool:
            running()
            views = [(await client.get(f"/v1/tool-calls/{i}")).json() for i in ids]
            # Still on its way, or done: anything else (failed, unknown) is a failure.
            assert {v["status"] for v in views} <= {*IN_FLIGHT, "completed"}, views
            return all(v["status"] == "completed" for v in views)

        await eventually(all_completed, within=45, what="the calls to complete")
    return ids


async def reply_to(bootstrap: str, topic: str, request_id: str) -> dict[str, Any] | None:
    """The reply to ``request_id`` on ``topic``, read from its start (a broker kept
    between runs holds earlier runs' replies too), or None if none came in 45 s."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
        assert tps, f"no topic {topic}"
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(45):
                while True:
                    for records in (await consumer.getmany(timeout_ms=200)).values():
                        for record in records:
                            reply: dict[str, Any] = json.loads(record.value)
                            if reply.get("requestId") == request_id:
                                return reply
        return None
    finally:
        await consumer.stop()


async def submit_on_the_bus(
    bootstrap: str, routes: list[BusRoute], capability_id: str, running: Callable[[], None]
) -> None:
    """One request record on each route's request topic, as a tenant's producer sends
    it: each must be answered on the route's replies topic (the relay publishes them),
    accepted as a call of the route's tenant, while ``running()`` finds every process
    still up."""
    sent = {}
    async with producing(bootstrap) as producer:
        for route in routes:
            run_id = f"deploy-bus-{route.tenant}"
            record = {
                "runId": run_id,
                "capabilityId": capability_id,
                "correlationId": f"bus-{route.tenant}",
                "input": {"orderId": f"bus-{route.tenant}"},
            }
            sent[route] = f"deploy-{route.tenant}-{secrets.token_hex(4)}"
            await producer.send_and_wait(
                route.topic,
                json.dumps(record).encode(),
                key=run_id.encode(),
                headers=headers(sent[route], source="/tests/deploy"),
            )
    for route, event_id in sent.items():
        running()
        reply = await reply_to(bootstrap, route.replies, event_id)
        assert reply is not None, f"no reply to {event_id} on {route.replies}"
        assert (reply["outcome"], reply["tenant"]) == ("accepted", route.tenant), reply


async def test_every_workload_of_the_dev_overlay_runs_as_its_manifest_says(
    tmp_path: Path, empty_database_url: str, kafka_bootstrap: str, sandbox: SandboxServer
) -> None:
    cluster = Cluster(tmp_path, empty_database_url, kafka_bootstrap, sandbox.url)
    jobs, cron_jobs = workloads(cluster.docs, "Job"), workloads(cluster.docs, "CronJob")
    deployments = workloads(cluster.docs, "Deployment")
    assert jobs and cron_jobs and deployments
    try:
        # The migrations Job first (on an empty database), then every Deployment, whose
        # init containers must find the schema at head.
        cluster.run_pods(jobs)
        started = cluster.start_pods(deployments)
        for container, item in started:
            await cluster.ready(container, item)
        [api] = [c for c, _ in started if c.args[0] == "serve"]
        [capability_id] = cluster.secrets["tool-dispatcher-provider-credentials"]

        url = f"http://127.0.0.1:{api.ports['http']}"
        await submit_and_complete(url, capability_id, cluster.running)

        counts = await books(sandbox.url)
        assert len(counts["effects"]) == CALLS
        assert set(counts["effects"].values()) == {1}  # one effect per call

        # Bus intake, ready above, consumes the routes its manifest gives it; the relay
        # is given the same ones (it makes their topics and publishes the replies).
        [bus] = [c for c, _ in started if c.args[0] == "bus-intake"]
        [relay] = [c for c, _ in started if c.args[0] == "relay"]
        routes = list(settings_of(bus.env).bus.routes().values())
        assert routes and settings_of(relay.env).bus.routes() == settings_of(bus.env).bus.routes()
        await submit_on_the_bus(kafka_bootstrap, routes, capability_id, cluster.running)

        async def dispatched() -> bool:
            cluster.running()
            effects = (await books(sandbox.url))["effects"]
            assert set(effects.values()) <= {1}, effects  # one effect per call
            return len(effects) == CALLS + len(routes)

        # The worker dispatches the calls recorded from the bus as any other.
        await eventually(dispatched, within=45, what="the bus's calls to be dispatched")
        cluster.run_pods(cron_jobs)
        cluster.running()
    finally:
        codes = cluster.processes.stop()
    # None failed on its own: each stopped at SIGTERM, cleanly or by the signal (the
    # API's server lets the signal end it; the kubelet takes either).
    assert set(codes.values()) <= {0, -signal.SIGTERM}, codes
    # Settings ignores a TOOL_DISPATCHER_* name it does not know: every name a process
    # was given must be one it reads.
    unknown = {
        where: sorted(n for n in env if n.startswith(PREFIX) and not is_setting(n))
        for where, env in cluster.given.items()
    }
    assert {w: n for w, n in unknown.items() if n} == {}
