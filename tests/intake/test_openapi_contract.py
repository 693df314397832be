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

import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from dispatcher.api.app import create_app
from dispatcher.api.server import api_server
from dispatcher.settings import load_settings
from dispatcher.testing.databases import create_database, drop_database, unique_name
from dispatcher.testing.embedded import free_port
from dispatcher.testing.registries import sandbox_registry
from tests.fixtures.api import GLOBEX, control_keys

pytestmark = pytest.mark.postgres

# Per operation (14 of them), each example a real request: about a minute here.
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
# - unsupported_method, until 405 answers carry ``Allow`` (issue 13, finding 9, built
#   on another branch): drop its section then.
# - positive_data_acceptance allows 400 on the event log: an ``after`` cursor that
#   names no event of the run is refused (``validation_failed``), however well formed.
# The key has every scope, so an answer is decided by the request, not by a missing
# scope; schemathesis leaves it out where it tests the security scheme itself.
CONFIG = f"""
[auth.openapi.apiKey]
bearer = "{GLOBEX}"

[checks.unsupported_method]
enabled = false

[[operations]]
include-path = "/v1/runs/{{run_id}}/events"
checks.positive_data_acceptance.expected-statuses = [
    "2xx", "3xx", "400", "401", "403", "404", "409", "429", "5xx"
]
"""
schema = schemathesis.openapi.from_dict(_document(), config=schemathesis.Config.from_str(CONFIG))


@schema.parametrize()
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
)
def test_every_answer_matches_the_document(case: schemathesis.Case, served: str) -> None:
    case.call_and_validate(base_url=served)


def test_the_server_serves_it(served: str) -> None:
    assert httpx.get(f"{served}/openapi.json").json() == _document()
