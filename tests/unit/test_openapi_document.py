"""The shape of ``/openapi.json``: every /v1 operation names the bearer scheme, its
body and its 2xx model, and answers every error as problem+json; no operation
declares FastAPI's default 422 (the service answers bad requests with 400). The
contract test (tests/intake/test_openapi_contract.py) checks the server keeps it."""

from __future__ import annotations

from typing import Any

import pytest

from devtools.registries import sandbox_registry
from dispatcher import schemas
from dispatcher.api.app import create_app
from dispatcher.capability_views import PauseRequest
from dispatcher.operations.models import OperationRequest
from dispatcher.settings import load_settings

PROBLEM = "application/problem+json"
# The body model of each operation that takes one; the others take none.
BODIES = {
    ("post", "/v1/tool-calls"): schemas.SubmitRequest,
    ("post", "/v1/tool-calls/{tool_call_id}/retry"): schemas.RetryRequest,
    ("post", "/v1/runs/{run_id}/stop"): schemas.StopRequest,
    ("post", "/v1/approvals/{approval_id}/decision"): schemas.DecisionRequest,
    ("post", "/v1/escalations/{escalation_id}/resolve"): schemas.ResolveRequest,
    ("post", "/v1/outbox/dead-letters/{row_id}/discard"): schemas.DiscardRequest,
    ("post", "/v1/capabilities/{capability_id}/pause"): PauseRequest,
    ("post", "/v1/capabilities/{capability_id}/resume"): PauseRequest,
    ("post", "/v1/operations"): OperationRequest,
}
VIEWS = {
    ("post", "/v1/tool-calls"): "ToolCallView",
    ("get", "/v1/tool-calls/{tool_call_id}"): "ToolCallView",
    ("post", "/v1/tool-calls/{tool_call_id}/retry"): "ToolCallView",
    ("get", "/v1/runs"): "RunList",
    ("get", "/v1/runs/{run_id}"): "RunView",
    ("get", "/v1/runs/{run_id}/events"): "EventLog",
    ("post", "/v1/runs/{run_id}/stop"): "StopResult",
    ("get", "/v1/approvals"): "ApprovalList",
    ("post", "/v1/approvals/{approval_id}/decision"): "ApprovalView",
    ("get", "/v1/escalations"): "EscalationList",
    ("post", "/v1/escalations/{escalation_id}/acknowledge"): "EscalationView",
    ("post", "/v1/escalations/{escalation_id}/resolve"): "EscalationView",
    ("get", "/v1/outbox/dead-letters"): "DeadLetterList",
    ("post", "/v1/outbox/dead-letters/{row_id}/retry"): "DeadLetterOutcome",
    ("post", "/v1/outbox/dead-letters/{row_id}/discard"): "DeadLetterOutcome",
    ("get", "/v1/capabilities"): "CapabilityList",
    ("post", "/v1/capabilities/{capability_id}/pause"): "CapabilityChange",
    ("post", "/v1/capabilities/{capability_id}/resume"): "CapabilityChange",
    ("post", "/v1/operations"): "OperationView",
    ("get", "/v1/operations/{operation_id}"): "OperationView",
    ("get", "/v1/operations/{operation_id}/calls"): "TouchedCalls",
    ("post", "/v1/operations/{operation_id}/cancel"): "OperationView",
}
# Answers whose model differs by status: a dry run (or a replayed key) answers 200.
STATUS_VIEWS = {(("post", "/v1/operations"), "200"): "OperationAnswer"}


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    app: Any = create_app(
        load_settings({"database_url": "postgresql://unused"}), sandbox_registry()
    )
    while not hasattr(app, "openapi"):  # unwrap the pure-ASGI middleware
        app = app.app
    doc: dict[str, Any] = app.openapi()
    return doc


def operations(doc: dict[str, Any], prefix: str = "/") -> dict[tuple[str, str], Any]:
    return {
        (method, path): op
        for path, ops in doc["paths"].items()
        if path.startswith(prefix)
        for method, op in ops.items()
    }


def test_every_v1_operation_names_the_bearer_scheme(document: dict[str, Any]) -> None:
    schemes = document["components"]["securitySchemes"]
    assert [s | {"description": ""} for s in schemes.values()] == [
        {"type": "http", "scheme": "bearer", "description": ""}
    ]
    (name,) = schemes
    v1 = operations(document, "/v1/")
    assert set(v1) == set(VIEWS)
    for key, op in v1.items():
        assert op.get("security") == [{name: []}], key
    for path in ("/healthz", "/readyz", "/metrics"):
        assert "security" not in document["paths"][path]["get"], path


def test_every_body_is_declared_from_its_model(document: dict[str, Any]) -> None:
    components = document["components"]["schemas"]
    for key, op in operations(document, "/v1/").items():
        model = BODIES.get(key)
        if model is None:
            assert "requestBody" not in op, key
            continue
        content = op["requestBody"]["content"]
        assert list(content) == ["application/json"], key
        assert content["application/json"]["schema"] == {
            "$ref": f"#/components/schemas/{model.__name__}"
        }
        expected = model.model_json_schema(ref_template="#/components/schemas/{model}")
        expected.pop("$defs", None)
        assert components[model.__name__] == expected
    # A stop's reason is optional, and so is its body.
    assert document["paths"]["/v1/runs/{run_id}/stop"]["post"]["requestBody"]["required"] is False
    assert document["paths"]["/v1/tool-calls"]["post"]["requestBody"]["required"] is True


def test_every_2xx_names_its_model(document: dict[str, Any]) -> None:
    for key, op in operations(document, "/v1/").items():
        ok = {s: r for s, r in op["responses"].items() if s.startswith("2")}
        assert ok, key
        for status, response in ok.items():
            schema = response["content"]["application/json"]["schema"]
            name = STATUS_VIEWS.get((key, status), VIEWS[key])
            assert schema == {"$ref": f"#/components/schemas/{name}"}, (key, status)
    submit = document["paths"]["/v1/tool-calls"]["post"]["responses"]
    assert set(submit) >= {"201", "200"}
    assert "Location" in submit["201"]["headers"]
    # The view is the model in dispatcher.schemas, whatever fields it gains.
    view = document["components"]["schemas"]["ToolCallView"]
    assert set(view["properties"]) == {
        f.alias or name for name, f in schemas.ToolCallView.model_fields.items()
    }


def test_every_error_is_problem_json(document: dict[str, Any]) -> None:
    problem = document["components"]["schemas"]["Problem"]
    assert set(problem["required"]) == {"type", "title", "status", "detail", "code"}
    for key, op in operations(document).items():
        for status, response in op["responses"].items():
            if status.startswith(("2", "3")):
                continue
            assert list(response["content"]) == [PROBLEM], (key, status)
            schema = response["content"][PROBLEM]["schema"]
            assert {"$ref": "#/components/schemas/Problem"} in schema["allOf"], (key, status)
            assert schema["allOf"][1]["properties"]["status"] == {"const": int(status)}
    for key, op in operations(document, "/v1/").items():
        declared = set(op["responses"])
        assert declared >= {"400", "401", "403", "500", "503"}, key
        if "{" in key[1]:
            assert "404" in declared, key
        if key in BODIES:
            assert "413" in declared, key
    submit = document["paths"]["/v1/tool-calls"]["post"]["responses"]
    assert {"404", "409", "422", "429"} <= set(submit)
    assert "429" in document["paths"]["/v1/tool-calls/{tool_call_id}"]["get"]["responses"]


def test_no_422_but_the_reused_key(document: dict[str, Any]) -> None:
    with_422 = {key for key, op in operations(document).items() if "422" in op["responses"]}
    assert with_422 == {("post", "/v1/tool-calls"), ("post", "/v1/operations")}
    for path in ("/v1/tool-calls", "/v1/operations"):
        assert (
            "idempotency_key_reused"
            in document["paths"][path]["post"]["responses"]["422"]["description"]
        )
    assert "HTTPValidationError" not in document["components"]["schemas"]


@pytest.mark.parametrize("path", ["/v1/approvals", "/v1/escalations"])
def test_a_keyset_list_takes_an_after_cursor_and_answers_its_next(
    document: dict[str, Any], path: str
) -> None:
    operation = document["paths"][path]["get"]
    (after,) = [p for p in operation["parameters"] if p["name"] == "after"]
    assert after["in"] == "query" and not after.get("required", False)
    assert "next" in after["description"]
    assert {"pattern", "maxLength"} <= set(after["schema"]["anyOf"][0])
    answer = VIEWS[("get", path)]
    listing = document["components"]["schemas"][answer]
    assert "next" in listing["required"]
    assert {"type": "null"} in listing["properties"]["next"]["anyOf"]
