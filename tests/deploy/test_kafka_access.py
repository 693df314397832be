"""Tenants are kept apart on the broker. Each tenant's KafkaUser may write its own
request topic and read its own replies (in a consumer group of its own), and nothing
of another tenant's. Bus intake's user may do what bus intake does and no more. And the
broker enforces it: ACLs on, and the unauthenticated listener open to the service's
own pods only.

The tenants and their topics are the routes of TOOL_DISPATCHER_BUS__TOPICS in the
rendered settings ConfigMap, parsed as the processes parse it. ACLs are matched as
Kafka matches them (a literal name, a prefix, the ``*`` wildcard, the ``All``
operation), so an ACL that reaches further than the names it seems to list fails too."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from dispatcher.settings import BusRoute, Settings
from tests.deploy.manifests import (
    OVERLAYS,
    Manifest,
    render,
    settings_config_map,
    settings_of,
)

BUS_USER = "tool-dispatcher-bus-intake"
AUTHENTICATIONS = {"tls", "scram-sha-512"}
# Kafka's operations; ``All`` grants each of them.
OPERATIONS = frozenset(
    {
        "Read", "Write", "Create", "Delete", "Alter", "Describe", "ClusterAction",
        "DescribeConfigs", "AlterConfigs", "IdempotentWrite",
    }
)  # fmt: skip
# Kafka grants Describe with any of these, and DescribeConfigs with AlterConfigs.
IMPLIES_DESCRIBE = {"Read", "Write", "Delete", "Alter"}
OWN_REQUESTS = frozenset({"Write", "Describe"})
OWN_REPLIES = frozenset({"Read", "Describe"})


def producer(tenant: str) -> str:
    """A tenant's KafkaUser: deploy/README.md names it so."""
    return f"producer-{tenant}"


@dataclass(frozen=True)
class Acl:
    kind: str  # topic, group, cluster, transactionalId
    name: str
    pattern: str  # literal or prefix
    operations: frozenset[str]
    allow: bool

    def matches(self, kind: str, name: str) -> bool:
        if self.kind != kind:
            return False
        if self.pattern == "prefix":
            return name.startswith(self.name)
        return self.name in ("*", name)  # a literal "*" is every resource


def acls(user: Manifest) -> list[Acl]:
    """The user's ACL rules; Strimzi's defaults filled in (literal, allow)."""
    rules = []
    for rule in (user["spec"].get("authorization") or {}).get("acls", []):
        resource = rule["resource"]
        ops = rule.get("operations") or [rule["operation"]]
        rules.append(
            Acl(
                resource["type"],
                resource.get("name", ""),
                resource.get("patternType", "literal"),
                frozenset(ops),
                rule.get("type", "allow") == "allow",
            )
        )
    return rules


def granted(rules: list[Acl], kind: str, name: str) -> frozenset[str]:
    """What ``rules`` let their user do on one resource, as Kafka decides it: every
    allowing rule that matches, with what its operations imply, less any denied."""

    def expand(ops: frozenset[str]) -> set[str]:
        found = set(OPERATIONS) if "All" in ops else set(ops)
        if found & IMPLIES_DESCRIBE:
            found.add("Describe")
        if "AlterConfigs" in found:
            found.add("DescribeConfigs")
        return found

    allowed: set[str] = set()
    denied: set[str] = set()
    for rule in rules:
        if rule.matches(kind, name):
            (allowed if rule.allow else denied).update(expand(rule.operations))
    return frozenset(allowed - denied)


@dataclass(frozen=True)
class Overlay:
    settings: Settings
    routes: list[BusRoute]
    users: dict[str, Manifest]
    kafka: Manifest

    @property
    def tenants(self) -> set[str]:
        return {r.tenant for r in self.routes}

    def bus_topics(self) -> set[str]:
        return {t for r in self.routes for t in (r.topic, r.replies, r.dead_letters)}


def overlay_of(name: str) -> Overlay:
    docs = render(name)
    settings = settings_of(settings_config_map(docs))
    [kafka] = [d for d in docs if d["kind"] == "Kafka"]
    users = {d["metadata"]["name"]: d for d in docs if d["kind"] == "KafkaUser"}
    return Overlay(settings, list(settings.bus.routes().values()), users, kafka)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_tenant_has_its_user_and_no_user_is_unaccounted_for(overlay: str) -> None:
    found = overlay_of(overlay)
    assert len(found.tenants) >= 2  # isolation needs someone to be isolated from

    # Every KafkaUser is checked below: one per tenant of the routes, and bus intake's.
    assert set(found.users) == {producer(t) for t in found.tenants} | {BUS_USER}
    for name, user in found.users.items():
        assert user["metadata"]["labels"]["strimzi.io/cluster"] == found.kafka["metadata"]["name"]
        assert user["spec"]["authentication"]["type"] in AUTHENTICATIONS, name
        assert user["spec"]["authorization"]["type"] == "simple", name


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_a_tenants_acls_are_literal_and_name_only_its_own_topics(overlay: str) -> None:
    found = overlay_of(overlay)
    wrong: list[str] = []
    for tenant in sorted(found.tenants):
        name = producer(tenant)
        mine = [r for r in found.routes if r.tenant == tenant]
        requests, replies = {r.topic for r in mine}, {r.replies for r in mine}
        rules = acls(found.users[name])
        for rule in rules:
            where = f"{name}: {rule}"
            if not rule.allow:
                wrong.append(f"{where}: a deny rule (allow only what is named)")
            if rule.pattern != "literal" or "*" in rule.name:
                wrong.append(f"{where}: not one literal name")
            if rule.kind == "topic":
                own_request = rule.name in requests and rule.operations <= OWN_REQUESTS
                own_replies = rule.name in replies and rule.operations <= OWN_REPLIES
                if not (own_request or own_replies):
                    wrong.append(f"{where}: not its own request or replies topic")
            elif rule.kind == "group":
                # A group of its own, to read its replies in: named after the user.
                if not rule.name.startswith(f"{name}-") or not rule.operations <= {"Read"}:
                    wrong.append(f"{where}: not Read on a group of its own")
            else:
                wrong.append(f"{where}: a {rule.kind} resource")
        # And enough to do its part: produce requests, consume replies in its group.
        for topic in requests:
            if granted(rules, "topic", topic) != OWN_REQUESTS:
                wrong.append(f"{name}: {sorted(granted(rules, 'topic', topic))} on {topic}")
        for topic in replies:
            if granted(rules, "topic", topic) != OWN_REPLIES:
                wrong.append(f"{name}: {sorted(granted(rules, 'topic', topic))} on {topic}")
        if not any(r.kind == "group" and "Read" in r.operations for r in rules):
            wrong.append(f"{name}: no group to read its replies in")
    assert wrong == []


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_no_tenant_can_touch_another_tenants_topics_or_groups(overlay: str) -> None:
    found = overlay_of(overlay)
    service = {
        found.settings.dispatch_topic,
        found.settings.events_topic,
        found.settings.escalations_topic,
    }
    groups = {found.settings.bus.group_id} | {
        r.name for u in found.users.values() for r in acls(u) if r.kind == "group"
    }
    for tenant in sorted(found.tenants):
        name = producer(tenant)
        rules = acls(found.users[name])
        # Every bus topic (anyone's), and the service's own.
        can = {
            topic: ops
            for topic in found.bus_topics() | service
            if (ops := granted(rules, "topic", topic))
        }
        writes = {
            r.topic
            for r in found.routes
            if r.tenant != tenant and "Write" in can.get(r.topic, frozenset())
        }
        assert writes == set(), f"{name} can write another tenant's request topic"
        # Nothing else either: its own two topics, with exactly what it needs on them.
        mine = [r for r in found.routes if r.tenant == tenant]
        assert can == {
            **{r.topic: OWN_REQUESTS for r in mine},
            **{r.replies: OWN_REPLIES for r in mine},
        }, name
        # No group another user reads in, nor bus intake's.
        used = {g for g in groups if granted(rules, "group", g)}
        assert all(g.startswith(f"{name}-") for g in used), (name, used)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_bus_intakes_user_may_do_what_bus_intake_does_and_no_more(overlay: str) -> None:
    found = overlay_of(overlay)
    rules = acls(found.users[BUS_USER])
    settings = found.settings
    # It makes sure every topic exists first (dispatcher.topics), so it sees them all.
    expected = {
        topic: frozenset({"Describe"})
        for topic in found.bus_topics()
        | {settings.dispatch_topic, settings.events_topic, settings.escalations_topic}
    }
    for route in found.routes:
        expected[route.topic] = frozenset({"Read", "Describe"})
        expected[route.dead_letters] = frozenset({"Write", "Describe"})
        # The replies are the relay's to write.
    assert {t: granted(rules, "topic", t) for t in expected} == expected
    assert granted(rules, "group", settings.bus.group_id) == {"Read", "Describe"}
    named = {(r.kind, r.name) for r in rules}
    assert named == {("topic", t) for t in expected} | {("group", settings.bus.group_id)}
    assert all(r.allow and r.pattern == "literal" and "*" not in r.name for r in rules)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_broker_enforces_the_users_acls(overlay: str) -> None:
    found = overlay_of(overlay)
    spec = found.kafka["spec"]
    # Without an authorizer the ACLs are stored and never checked; without the User
    # Operator the users are never made.
    assert spec["kafka"].get("authorization", {}).get("type") == "simple"
    assert "userOperator" in spec["entityOperator"]
    listeners = spec["kafka"]["listeners"]
    authenticated = {ln["authentication"]["type"] for ln in listeners if "authentication" in ln}
    for name, user in found.users.items():
        assert user["spec"]["authentication"]["type"] in authenticated, name
    # An unauthenticated connection is ANONYMOUS, a super user (the service's processes
    # have no client credentials): only the service's own pods may reach such a
    # listener, or any tenant could bypass its ACLs through it.
    for listener in listeners:
        if "authentication" in listener:
            continue
        peers = listener.get("networkPolicyPeers")
        assert peers, f"listener {listener['name']} is open to every pod"
        for peer in peers:
            assert set(peer) == {"podSelector"}, peer  # this namespace only
            labels = peer["podSelector"]["matchLabels"]
            assert labels == {"app.kubernetes.io/name": "tool-dispatcher"}, peer
