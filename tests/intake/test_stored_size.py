"""A small body never becomes a huge call: jsonb prints a number without an exponent,
so a number whose plain form would outgrow ``MAX_NUMBER_CHARS`` is refused (400,
naming its JSON path), and what intake admits is stored and answered within
``INPUT_GROWTH`` times its request body."""

from __future__ import annotations

import httpx
import pytest
from pydantic import ValidationError
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from dispatcher.schemas import SubmitRequest
from dispatcher.storable import INPUT_GROWTH, MAX_NUMBER_CHARS
from tests.fixtures.api import ALICE, bearer
from tests.intake.test_input_contract import assert_invalid, calls_recorded

SUBMIT = {**bearer(ALICE), "content-type": "application/json"}


def body_of(numbers: list[bytes], **extra: str) -> bytes:
    """A submission whose input is ``{"v": [numbers...]}``, the numbers as written."""
    fields = b"".join(f', "{k}": "{v}"'.encode() for k, v in extra.items())
    return (
        b'{"runId": "run-1", "capabilityId": "send-email"'
        + fields
        + b', "input": {"v": ['
        + b",".join(numbers)
        + b"]}}"
    )


# The shortest spellings of the longest plain forms admitted: "1e39" is 40 digits.
WIDEST = [
    f"1e{MAX_NUMBER_CHARS - 1}",
    f"-1e{MAX_NUMBER_CHARS - 2}",
    f"1e-{MAX_NUMBER_CHARS - 2}",
]
PAST_THE_BOUND = [
    f"1e{MAX_NUMBER_CHARS}",
    f"-1e{MAX_NUMBER_CHARS - 1}",
    f"1e-{MAX_NUMBER_CHARS - 1}",
    f"-1e-{MAX_NUMBER_CHARS - 2}",
    "1.2345678901234567e-23",
    "5e-324",
    "1e-300",
    "1e308",
]


@pytest.mark.parametrize("number", [*WIDEST, "1.2345678901234567e-22", "1.5e10", "6.02e23", "0.0"])
def test_a_number_within_the_bound_is_accepted(number: str) -> None:
    request = SubmitRequest.model_validate_json(body_of([b"1", number.encode()]))
    assert request.input["v"][1] == float(number)


@pytest.mark.parametrize("number", PAST_THE_BOUND)
def test_a_number_whose_plain_form_outgrows_the_bound_is_refused(number: str) -> None:
    # The model's own check: library callers build the same SubmitRequest.
    with pytest.raises(ValidationError, match=r"input\.v\[1\]: a number is stored without"):
        SubmitRequest.model_validate_json(body_of([b"1", number.encode()]))
    with pytest.raises(ValidationError, match=r"input\.v\[1\]: a number is stored without"):
        SubmitRequest(run_id="run-1", capability_id="send-email", input={"v": [1, float(number)]})


def test_integers_are_bounded_where_the_json_parser_bounds_them() -> None:
    # A library caller's integer past 4300 digits is refused like the body's would be,
    # not left to fail in the fingerprint; one of 4300 digits is stored as written.
    SubmitRequest(run_id="run-1", capability_id="send-email", input={"n": 10**4300 - 1})
    with pytest.raises(ValidationError, match=r"input\.n: an integer has more than 4300"):
        SubmitRequest(run_id="run-1", capability_id="send-email", input={"n": -(10**4300)})


@pytest.mark.postgres
async def test_a_240_kb_body_of_1e308_is_refused(
    api: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    body = body_of([b"1e308"] * 40_000)
    assert 240_000 <= len(body) < 256 * 1024

    response = await api.post("/v1/tool-calls", content=body, headers=SUBMIT)

    problem = assert_invalid(response, "input.v[0]")
    assert "40 characters" in problem["errors"][0]["msg"]
    assert await calls_recorded(engine) == 0


@pytest.mark.postgres
async def test_stored_input_and_answers_stay_within_the_stated_growth(
    api: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    # Mostly the worst case admitted, "1e39," (5 bytes, 42 stored), with the other
    # widest numbers and some ordinary ones.
    ordinary = ["1.5e10", "123.456", "1e20", "0.30000000000000004", "6.02e23", "7", "-0.5"]
    numbers = [n.encode() for n in (WIDEST[:1] * 100 + WIDEST[1:] + ordinary) * 300]
    body = body_of(numbers, idempotencyKey="number-heavy")
    assert len(body) < 256 * 1024

    created = await api.post("/v1/tool-calls", content=body, headers=SUBMIT)
    assert created.status_code == 201, created.text
    read = await api.get(created.headers["location"], headers=SUBMIT)
    assert read.status_code == 200, read.text
    async with engine.connect() as conn:
        stored = await conn.scalar(text("SELECT octet_length(input::text) FROM tool_calls"))

    limit = INPUT_GROWTH * len(body)
    assert stored is not None
    assert stored <= limit, f"stored input {stored} B from a {len(body)} B body"
    assert len(created.content) <= limit, f"201 of {len(created.content)} B"
    assert len(read.content) <= limit, f"GET of {len(read.content)} B"
    # Nothing was lost on the way: every number is stored.
    assert len(read.json()["input"]["v"]) == len(numbers)
