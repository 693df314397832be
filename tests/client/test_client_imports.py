"""An agent runtime that only talks to the API imports :mod:`dispatcher.client`, and that
must not load the server: no database driver, no ORM, no web framework, no broker client.

Each check runs in a fresh interpreter, since this test process has imported everything.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

SERVER_ONLY = ("sqlalchemy", "psycopg", "fastapi", "aiokafka")


def loaded_by(statement: str) -> list[str]:
    """The top-level packages of ``SERVER_ONLY`` that ``statement`` loads."""
    probe = (
        f"{statement}\n"
        "import json, sys\n"
        "loaded = {name.partition('.')[0] for name in sys.modules}\n"
        f"print(json.dumps(sorted(loaded & {set(SERVER_ONLY)!r})))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    found: list[str] = json.loads(done.stdout)
    return found


@pytest.mark.parametrize(
    "statement",
    [
        "import dispatcher.client",
        "from dispatcher.client import DispatcherClient, SyncDispatcherClient",
        "import dispatcher.schemas, dispatcher.errors, dispatcher.states",
        "from dispatcher import SubmitRequest, ToolCallView, DispatcherError",
    ],
)
def test_the_client_side_loads_no_server_package(statement: str) -> None:
    assert loaded_by(statement) == []


def test_the_probe_sees_a_server_import() -> None:
    # The library's submit is the server side: the probe must notice it, so the test
    # above is not passing vacuously.
    assert "sqlalchemy" in loaded_by("from dispatcher import submit")


def test_the_bus_submitter_loads_aiokafka_but_no_server_package() -> None:
    # A producer on the bus needs its broker client, and nothing of the server's.
    assert loaded_by("from dispatcher.client.bus import BusSubmitter") == ["aiokafka"]
