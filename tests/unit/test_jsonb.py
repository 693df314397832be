"""The jsonb parameter encoder (dispatcher.db.jsonb): orjson's compact UTF-8 text,
and the standard library's for the integers orjson refuses."""

from __future__ import annotations

import json

import pytest

from dispatcher.db import jsonb


@pytest.mark.parametrize(
    "value",
    [
        {"b": 1, "a": [1.5, None, True, "é ☃"], "c": {}},
        [{"eventId": "evt_1", "occurredAt": "2026-01-01T00:00:00+00:00"}],
        {"n": 2**63 - 1, "m": -(2**63)},
    ],
)
def test_values_are_compact_json_in_their_key_order(value: object) -> None:
    expected = json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
    assert jsonb.dumps(value) == expected


@pytest.mark.parametrize("big", [2**64, -(2**64) - 1, 10**400])
def test_an_integer_beyond_64_bits_is_written_exactly(big: int) -> None:
    assert json.loads(jsonb.dumps({"n": [big]})) == {"n": [big]}
