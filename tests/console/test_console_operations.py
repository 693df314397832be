"""The bulk operations pages over plain HTTP: the count comes before any confirm, the
confirm is a CSRF-checked form of the ``operate`` scope, another tenant's calls need
``admin`` and another tenant's operation is not found, and the progress fragment says
what the API says."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.capabilities import CapabilityRegistry
from dispatcher.operations.processor import step
from dispatcher.settings import Settings
from tests.console.test_console_http import csrf_of, signed_in
from tests.control.test_operations_api import processor
from tests.fixtures.api import GLOBEX, OPERATOR, READER, control_keys
from tests.fixtures.operations import failed_calls, statuses

pytestmark = pytest.mark.postgres
Sessions = async_sessionmaker[AsyncSession]
FILTER = {"kind": "retry", "reason": "provider fixed", "capabilityId": "send"}


@pytest.fixture
def api_settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"api_keys": control_keys(), "console_secure_cookie": False})


async def test_count_then_confirm_then_progress_and_the_walls_around_it(
    api_url: str, sessions: Sessions, registry: CapabilityRegistry
) -> None:
    await failed_calls(sessions, ["c1", "c2", "c3"])
    await failed_calls(sessions, ["c1"], tenant="globex")
    oncall = await signed_in(api_url, OPERATOR)
    preview = await oncall.get("/console/operations", params={**FILTER, "preview": "1"})
    assert preview.status_code == 200
    assert 'data-testid="preview-count">3<' in preview.text
    assert "Retry 3 calls</button>" in preview.text
    assert (await statuses(sessions, "acme")) == dict.fromkeys(["c1", "c2", "c3"], "failed")

    no_token = await oncall.post("/console/operations", data=FILTER)
    assert no_token.status_code == 403 and 'data-code="csrf_rejected"' in no_token.text
    elsewhere = await oncall.get(
        "/console/operations", params={**FILTER, "preview": "1", "tenant": "globex"}
    )
    assert elsewhere.status_code == 403 and 'data-code="forbidden"' in elsewhere.text
    reader = await signed_in(api_url, READER)
    page = await reader.get("/console/operations", params={**FILTER, "preview": "1"})
    assert "confirm-operation" not in page.text
    refused = await reader.post("/console/operations", data={**FILTER, "csrf": csrf_of(page.text)})
    assert refused.status_code == 403

    made = await oncall.post("/console/operations", data={**FILTER, "csrf": csrf_of(preview.text)})
    assert made.status_code == 303
    location = made.headers["location"].split("?")[0]
    await step(processor(sessions, registry), asyncio.Event())
    progress = (await oncall.get(location + "/progress")).json()
    assert progress == {"state": "completed", "total": 3, "done": 3, "failed": 0, "percent": 100}
    assert (await statuses(sessions, "globex")) == {"c1": "failed"}
    theirs = await signed_in(api_url, GLOBEX)
    for path in (location, location + "/progress"):
        hidden = await theirs.get(path)
        assert hidden.status_code == 404 and 'data-code="operation_not_found"' in hidden.text
    for client in (oncall, reader, theirs):
        await client.aclose()
