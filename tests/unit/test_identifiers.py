"""The identifier contract (``dispatcher.schemas.check_identifier``) and the storable
input check (``dispatcher.schemas.unstorable``) on their own."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from pydantic_core import PydanticCustomError

from devtools.registries import capability
from dispatcher.capabilities import render_key_template
from dispatcher.schemas import MAX_INPUT_DEPTH, check_identifier, unstorable

PRINTABLE = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) != "/")


@pytest.mark.parametrize("value", [PRINTABLE, "x" * 200, "a", "...", "a.b", "%2F"])
def test_printable_ascii_without_slash_is_an_identifier(value: str) -> None:
    assert check_identifier(value) == value


@pytest.mark.parametrize(
    "value",
    ["", "x" * 201, "a/b", ".", "..", "a b", "a\n", "\x00", "a\x7f", "é", "日本", "a\u2028"],
)
def test_anything_else_is_refused(value: str) -> None:
    with pytest.raises(PydanticCustomError):
        check_identifier(value)


def test_a_key_may_be_255_characters() -> None:
    assert check_identifier("k" * 255, 255) == "k" * 255
    with pytest.raises(PydanticCustomError):
        check_identifier("k" * 256, 255)


def test_template_values_are_percent_encoded_and_stable() -> None:
    context = {"input": {"orderId": "ключ/%1 2"}, "runId": "r-1:a"}
    key = render_key_template("refund:{input.orderId}:{runId}", context)
    assert key == "refund:%D0%BA%D0%BB%D1%8E%D1%87%2F%251%202:r-1:a"
    assert render_key_template("refund:{input.orderId}:{runId}", context) == key
    assert check_identifier(key, 255) == key


@pytest.mark.parametrize(
    ("value", "path"),
    [
        ({"a": [1, {"b": "x\x00"}]}, "input.a[1].b"),
        ({"a b": float("nan")}, 'input["a b"]'),
        ({"a": float("-inf")}, "input.a"),
        ({"k\x00": 1}, 'input["k\\u0000"]'),
    ],
)
def test_unstorable_values_are_named_by_their_json_path(value: object, path: str) -> None:
    found = unstorable(value)
    assert found is not None and found[0] == path


def test_depth_is_bounded() -> None:
    deep: object = 1
    for _ in range(MAX_INPUT_DEPTH):
        deep = [deep]
    assert unstorable(deep) is None
    assert unstorable([deep]) is not None
    assert unstorable({"s": "ok", "n": 10**400, "f": 1.5, "b": True, "z": None}) is None


@pytest.mark.parametrize("template", ["refund {input.orderId}", "a/{runId}", "ключ:{runId}"])
def test_a_template_whose_own_text_breaks_the_contract_is_refused(template: str) -> None:
    with pytest.raises(ValidationError, match="key template"):
        capability("keyed", idempotencyKeyTemplate=template)
