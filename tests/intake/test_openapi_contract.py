"""The API keeps the promises of its own ``/openapi.json``: schemathesis generates
requests for every operation from the document the server serves (valid and invalid
ones) and runs its checks on each answer: status codes, content types, response
headers and schemas conformance, 5xx, negative data rejected, positive data accepted,
undeclared auth ignored.

The server is the real app under uvicorn on a free port, with the control plane's
keys, on a database of its own; it runs in a thread with its own event loop, because
schemathesis' calls are blocking. Examples are bounded per operation so the whole run
stays near two minutes on two cores."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any, TypeGuard

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import GenerationMode

from devtools.databases import create_database, drop_database, unique_name
from devtools.embedded import free_port
from devtools.registries import sandbox_registry
from dispatcher.api.app import create_app
from dispatcher.api.server import api_server
from dispatcher.api.tool_calls import MAX_WAIT_SECONDS
from dispatcher.settings import load_settings
from tests.fixtures.api import GLOBEX, control_keys

pytestmark = pytest.mark.postgres

# Capabilities of the sandbox registry whose key template needs nothing of the input.
RECORDABLE = ("send-email", "refund-order-approved", "lookup-order")
# Per operation (17 of them), each example a real request: about a minute here.
EXAMPLES = 120


@pytest.fixture(scope="module")
def served(pg_server_url: str, template_database: str) -> Iterator[str]:
    """The base URL of the real API, serving a database of this module's own."""
    name = unique_name("td_contract")
    url = create_database(pg_server_url, name, template=template_database)
    config = load_settings(
        {"database_url": url, "api_keys": control_keys(), "kafka_enable_idempotence": False}
    )
    port = free_port(config.http_host)
    server = api_server(config, sandbox_registry(), port=port, install_signal_handlers=False)
    thread = threading.Thread(target=server.run, name="api", daemon=True)
    thread.start()
    while not server.started:
        assert thread.is_alive(), "the API server stopped while starting"
        time.sleep(0.01)
    try:
        yield f"http://{config.http_host}:{port}"
    finally:
        server.should_exit = True
        thread.join()
        drop_database(pg_server_url, name)


def _document() -> dict[str, Any]:
    # The document the app builds (test_the_server_serves_it: the one it serves).
    app: Any = create_app(
        load_settings({"database_url": "postgresql://unused"}), sandbox_registry()
    )
    while not hasattr(app, "openapi"):  # unwrap the pure-ASGI middleware
        app = app.app
    document: dict[str, Any] = app.openapi()
    return document


# Every check schemathesis has is on, except:
# - positive_data_acceptance allows 400 on the event log: an ``after`` cursor that
#   names no event of the run is refused (``validation_failed``), however well formed;
#   so on the approvals and escalations lists, whose ``after`` is an opaque cursor the
#   document can only give the alphabet of; and 400 and 422 on submit: input the
#   document cannot describe (a NUL in a nested string, see _recordable) is refused,
#   and a key generated twice for two calls is ``idempotency_key_reused``.
# The key has every scope, so an answer is decided by the request, not by a missing
# scope; schemathesis leaves it out where it tests the security scheme itself.
CONFIG = f"""
[auth.openapi.apiKey]
bearer = "{GLOBEX}"

[[operations]]
include-path = "/v1/tool-calls"
include-method = "POST"
checks.positive_data_acceptance.expected-statuses = [
    "2xx", "3xx", "400", "401", "403", "404", "409", "422", "429", "5xx"
]

[[operations]]
include-path = "/v1/runs/{{run_id}}/events"
checks.positive_data_acceptance.expected-statuses = [
    "2xx", "3xx", "400", "401", "403", "404", "409", "429", "5xx"
]

[[operations]]
include-path = "/v1/approvals"
include-method = "GET"
checks.positive_data_acceptance.expected-statuses = [
    "2xx", "3xx", "400", "401", "403", "404", "409", "429", "5xx"
]

[[operations]]
include-path = "/v1/escalations"
include-method = "GET"
checks.positive_data_acceptance.expected-statuses = [
    "2xx", "3xx", "400", "401", "403", "404", "409", "429", "5xx"
]
"""


def _recordable(body: object) -> TypeGuard[dict[str, Any]]:
    """A body the identifier and input contract admits: no NUL anywhere, a printable
    ASCII toolCallId. The rest answer 400 whatever the capability (allowed on submit,
    below)."""
    if not isinstance(body, dict) or "\\u0000" in json.dumps(body):
        return False
    call_id = body.get("toolCallId")
    return call_id is None or (
        isinstance(call_id, str) and call_id.isascii() and call_id.isprintable()
    )


schema = schemathesis.openapi.from_dict(_document(), config=schemathesis.Config.from_str(CONFIG))


def _seconds(value: object) -> float:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return 0.0


@schema.parametrize()
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
)
def test_every_answer_matches_the_document(case: schemathesis.Case, served: str) -> None:
    if case.operation.path == "/v1/tool-calls" and case.meta is not None:
        if case.meta.generation.mode is GenerationMode.POSITIVE and _recordable(case.body):
            # The document cannot know the registry: name a capability that exists (and
            # keys on nothing in the input), so calls are recorded and their 201 and
            # their approvals are checked too, not only 404 capability_not_found.
            case.body["capabilityId"] = RECORDABLE[len(case.body) % len(RECORDABLE)]
    if case.query and _seconds(case.query.get("waitSeconds")) > 1:
        # A poll of a call POSTed earlier (generated ids repeat) holds for its whole
        # wait, up to 20 s an example; past the first second the answer is the same.
        case.query["waitSeconds"] = "1"
    # A long-poll may hold its answer up to MAX_WAIT_SECONDS: wait longer than that.
    case.call_and_validate(base_url=served, timeout=MAX_WAIT_SECONDS + 10)


def test_the_server_serves_it(served: str) -> None:
    assert httpx.get(f"{served}/openapi.json").json() == _document()
