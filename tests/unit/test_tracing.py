"""The pure parts of tracing: W3C context as stored text, the attributes of a call's
spans, and what an exporter setting installs (nothing, for "none")."""

from __future__ import annotations

import pytest

from dispatcher.settings import Settings
from dispatcher.states import ExecutionStatus as S
from dispatcher.tracing import call_attributes, trace_headers
from kit import telemetry
from reconciler.due import DueCall
from reconciler.rulings import Compensated, Escalation, Retry, Settlement
from reconciler.spans import _found

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_a_stored_traceparent_reads_back_as_the_same_context() -> None:
    assert telemetry.parse_traceparent(PARENT) == PARENT
    assert telemetry.context_of(PARENT, "vendor=1") is not None


@pytest.mark.parametrize(
    "text",
    [
        None,
        "",
        "garbage",
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # invalid trace id
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # invalid span id
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",  # no flags
    ],
)
def test_what_is_not_a_traceparent_gives_no_parent(text: str | None) -> None:
    assert telemetry.context_of(text) is None
    assert telemetry.parse_traceparent(text) is None


def test_no_current_span_has_no_traceparent() -> None:
    assert telemetry.current_traceparent() is None


def test_trace_headers_carry_tracestate_only_when_there_is_one() -> None:
    assert trace_headers((PARENT, None)) == {"traceparent": PARENT}
    assert trace_headers((PARENT, "v=1")) == {"traceparent": PARENT, "tracestate": "v=1"}


def test_call_attributes_add_the_genai_ones_only_for_an_agent_tool_call() -> None:
    call = {"tool_call_id": "c-1", "run_id": "r-1", "capability_id": "refund", "status": "x"}
    assert call_attributes(call) == {
        "tool_dispatcher.tool_call_id": "c-1",
        "tool_dispatcher.run_id": "r-1",
        "tool_dispatcher.capability_id": "refund",
        "tool_dispatcher.status": "x",
    }
    agent = call_attributes({**call, "tool_name": "refund_order"})
    assert agent["gen_ai.operation.name"] == "execute_tool"
    assert agent["gen_ai.tool.name"] == "refund_order"
    assert agent["gen_ai.tool.call.id"] == "c-1"
    assert "tool_dispatcher.status" not in call_attributes({"tool_call_id": "c-1"})


def test_traces_are_off_by_default_and_none_installs_nothing() -> None:
    assert Settings.model_fields["traces_exporter"].default == "none"
    assert telemetry.install("tool-dispatcher-test", "none") is False
    assert not telemetry.enabled()


def test_otlp_without_an_endpoint_is_refused_before_anything_is_installed() -> None:
    with pytest.raises(ValueError, match="endpoint"):
        telemetry.install("tool-dispatcher-test", "otlp")
    assert not telemetry.enabled()


def test_a_reconciler_span_names_what_its_step_found() -> None:
    class Answer:
        class observation:
            value = "found_succeeded"

    call = DueCall(
        "tc-1", "acme", "run-1", "refund", S.RESULT_UNKNOWN, "k", None, 2, 0, 1, 0, False, None
    )
    assert _found((None, Answer())) == "found_succeeded"
    assert _found(Escalation(call, "why", {})) == "escalate"
    assert _found(Retry(call, 1.0, {})) == "retry"
    assert _found(Compensated(Settlement(call, {}))) == "compensated"
    assert _found(False) == "taken_over"
    assert _found(True) is None
