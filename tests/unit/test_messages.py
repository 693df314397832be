"""The wire contracts of :mod:`dispatcher.ledger.messages`, as pure functions: a dispatch
command survives the trip through the outbox and the relay's Kafka headers, every
producer has its own ``ce_source``, and escalation messages keep their ids."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatcher.ledger.messages import (
    DispatchCommand,
    EscalationMessage,
    Producer,
    ce_source,
    escalation_message,
)
from dispatcher.settings import Topics
from dispatcher.tenancy import ordering_key
from outbox_relay.kafka import kafka_headers

TOPICS = Topics(dispatch="commands", events="events", escalations="escalations")
CALL = {
    "tool_call_id": "tc-1",
    "tenant": "acme",
    "run_id": "run-1",
    "capability_id": "refund",
    "idempotency_key": "key-1",
    "status": "authorized",  # a whole row: only the command's own columns are taken
}


def published(row: dict[str, Any]) -> tuple[bytes, list[tuple[str, bytes]]]:
    """What a consumer receives of an outbox row: the relay's value and headers."""
    return json.dumps(row["payload"]).encode(), kafka_headers(row["headers"])


ASYNCAPI = Path(__file__).resolve().parents[2] / "docs" / "asyncapi.yaml"


def test_every_producer_has_its_own_source_and_asyncapi_lists_them() -> None:
    assert {p: ce_source(p) for p in Producer} == {
        Producer.INTAKE: "/tool-dispatcher/tool-dispatcher.intake",
        Producer.APPROVALS: "/tool-dispatcher/tool-dispatcher.approvals",
        Producer.WORKER: "/tool-dispatcher/tool-dispatcher.worker",
        Producer.RECOVERY: "/tool-dispatcher/tool-dispatcher.recovery",
        Producer.REDRIVE: "/tool-dispatcher/tool-dispatcher.redrive",
        Producer.RECONCILER: "/tool-dispatcher/tool-dispatcher.reconciler",
        Producer.OPERATOR: "/tool-dispatcher/tool-dispatcher.operator",
    }
    spec = yaml.safe_load(ASYNCAPI.read_text())
    headers = spec["components"]["messageTraits"]["cloudEvents"]["headers"]["properties"]
    assert set(headers["ce_source"]["enum"]) == {ce_source(p) for p in Producer}


@pytest.mark.parametrize("producer", list(Producer))
def test_a_command_parses_back_from_what_the_relay_publishes(producer: Producer) -> None:
    command = DispatchCommand.build(CALL, producer=producer, causation_id="evt_1")
    row = command.to_outbox_row(TOPICS)

    assert (row["topic"], row["key"]) == ("commands", ordering_key("acme", "tc-1"))
    assert row["headers"]["ce_type"] == "tool.call.dispatch"
    assert row["headers"]["ce_source"] == ce_source(producer)
    assert row["payload"] == {
        "toolCallId": "tc-1",
        "tenant": "acme",
        "runId": "run-1",
        "capabilityId": "refund",
        "idempotencyKey": "key-1",
        "causationId": "evt_1",
    }
    assert DispatchCommand.parse(*published(row)) == command


def test_a_command_from_before_sources_named_their_writer_still_parses() -> None:
    # Still in the topic during an upgrade: no causation, the old fixed source.
    value = json.dumps(
        {
            "toolCallId": "tc-1",
            "tenant": "acme",
            "runId": "run-1",
            "capabilityId": "refund",
            "idempotencyKey": "key-1",
            "causationId": None,
        }
    ).encode()
    old = DispatchCommand.parse(value, [("ce_source", b"/tool-dispatcher/intake")])
    assert old is not None
    assert (old.tool_call_id, old.causation_id, old.source) == (
        "tc-1",
        None,
        "/tool-dispatcher/intake",
    )
    bare = DispatchCommand.parse(value)
    assert bare is not None and bare.source == ""


@pytest.mark.parametrize(
    "value",
    [
        None,
        b"not json",
        b"\xff\xfe",
        b'["tc-1"]',
        b'{"toolCallId": "tc-1"}',
        b'{"toolCallId": "", "tenant": "a", "runId": "r", "capabilityId": "c",'
        b' "idempotencyKey": "k"}',
        b'{"toolCallId": "tc-1", "tenant": "a", "runId": "r", "capabilityId": 7,'
        b' "idempotencyKey": "k"}',
    ],
)
def test_what_is_not_a_whole_command_is_refused(value: bytes | None) -> None:
    assert DispatchCommand.parse(value) is None


def test_escalation_messages_are_keyed_by_call_with_one_id_per_episode_and_kind() -> None:
    escalation = {"escalationId": "esc_1", "tenant": "acme", "toolCallId": "tc-1", "status": "open"}

    opened = escalation_message(
        EscalationMessage.OPENED, escalation, producer=Producer.RECONCILER, topics=TOPICS
    )
    resolved = escalation_message(
        EscalationMessage.RESOLVED, escalation, producer=Producer.OPERATOR, topics=TOPICS
    )

    assert (opened["topic"], opened["key"], opened["payload"]) == (
        "escalations",
        ordering_key("acme", "tc-1"),
        escalation,
    )
    assert opened["headers"]["ce_id"] == "esc_1"
    assert opened["headers"]["ce_type"] == "tool.call.escalation.opened"
    assert opened["headers"]["ce_source"] == "/tool-dispatcher/tool-dispatcher.reconciler"
    assert resolved["headers"]["ce_id"] == "esc_1:resolved"
    assert resolved["headers"]["ce_type"] == "tool.call.escalation.resolved"
    assert resolved["headers"]["ce_source"] == "/tool-dispatcher/tool-dispatcher.operator"
