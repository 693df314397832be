"""dispatcher.bus.records: a request record read as what it asks, or why it is refused,
decided without the database."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dispatcher.bus.records import At, Refused, Request, derived_key, read
from dispatcher.schemas import SubmitRequest
from dispatcher.settings import BusRoute

ROUTE = BusRoute("tool-calls.requests.acme", "acme")
AT = At(ROUTE.topic, 3, 41, 1_700_000_000_000)
LIMIT = 4096
BODY = {"runId": "run-1", "capabilityId": "refund", "input": {"orderId": "o-1"}}


def headers(**overrides: bytes | None) -> list[tuple[str, bytes]]:
    base: dict[str, bytes | None] = {
        "ce_specversion": b"1.0",
        "ce_id": b"evt-1",
        "ce_source": b"/billing",
        "ce_type": b"tool.call.submit",
        "content-type": b"application/json",
    }
    base.update(overrides)
    return [(k, v) for k, v in base.items() if v is not None]


def value(body: object = BODY) -> bytes:
    return json.dumps(body).encode()


def test_a_submission_is_read_for_its_topics_tenant() -> None:
    got = read(
        ROUTE,
        AT,
        b"run-1",
        value(),
        headers(ce_traceparent=b"00-" + b"a" * 32 + b"-" + b"b" * 16 + b"-01"),
        LIMIT,
    )
    assert isinstance(got, Request)
    assert (got.route.tenant, got.event_id, got.source) == ("acme", "evt-1", "/billing")
    assert got.submission == SubmitRequest.model_validate(BODY)
    assert got.traceparent is not None and got.traceparent.startswith("00-aaaa")


def test_a_record_naming_its_own_tenant_is_read() -> None:
    assert isinstance(
        read(ROUTE, AT, None, value({**BODY, "tenant": "acme"}), headers(), LIMIT), Request
    )


def test_a_record_naming_another_tenant_is_refused_and_answered() -> None:
    got = read(ROUTE, AT, None, value({**BODY, "tenant": "globex"}), headers(), LIMIT)
    assert isinstance(got, Refused)
    assert (got.error.code, got.dead_letter, got.event_id) == ("tenant_mismatch", False, "evt-1")
    assert "globex" not in got.error.detail


def test_an_invalid_submission_is_refused_like_http() -> None:
    got = read(ROUTE, AT, None, value({"runId": "run-1", "input": {}}), headers(), LIMIT)
    assert isinstance(got, Refused)
    assert (got.error.code, got.dead_letter) == ("validation_failed", False)
    assert got.error.extra["field"] == "capabilityId"


@pytest.mark.parametrize(
    ("record_headers", "record_value", "answerable"),
    [
        (headers(), b"not json", True),
        (headers(), b"[1, 2]", True),
        (headers(), b"\xff\xfe", True),
        (headers(ce_type=b"com.example.other"), value(), True),
        (headers(ce_specversion=b"0.3"), value(), True),
        (headers(**{"content-type": b"text/plain"}), value(), True),
        (headers(ce_id=None), value(), False),
        (headers(ce_source=None), value(), False),
        (headers(ce_id=b"\xff"), value(), False),
        ([*headers(), ("ce_id", b"evt-2")], value(), False),
        ([], value(), False),
    ],
    ids=[
        "not-json", "not-an-object", "not-utf8", "other-type", "old-spec", "text", "no-id",
        "no-source", "binary-id", "repeated-id", "no-headers",
    ],
)  # fmt: skip
def test_an_unreadable_record_goes_to_the_dead_letters(
    record_headers: list[tuple[str, bytes]], record_value: bytes, answerable: bool
) -> None:
    got = read(ROUTE, AT, b"k", record_value, record_headers, LIMIT)
    assert isinstance(got, Refused)
    assert (got.error.code, got.dead_letter) == ("unreadable_record", True)
    assert (got.event_id is not None) is answerable


def test_a_record_over_the_limit_is_refused_before_it_is_parsed() -> None:
    got = read(ROUTE, AT, None, value({**BODY, "input": {"pad": "x" * LIMIT}}), headers(), LIMIT)
    assert isinstance(got, Refused)
    assert (got.error.code, got.dead_letter, got.event_id) == ("payload_too_large", True, "evt-1")


@given(
    st.binary(max_size=300),
    st.lists(st.tuples(st.text(max_size=20), st.binary(max_size=20)), max_size=6),
)
def test_any_bytes_are_read_or_refused_never_raised(
    raw: bytes, extra: list[tuple[str, bytes]]
) -> None:
    got = read(ROUTE, AT, raw[:8] or None, raw, [*headers(), *extra], LIMIT)
    assert isinstance(got, Request | Refused)


def test_the_derived_key_is_the_events_identity() -> None:
    key = derived_key("/billing", "evt-1")
    assert key == derived_key("/billing", "evt-1")
    assert len({key, derived_key("/billing", "evt-2"), derived_key("/billing2", "evt-1")}) == 3
    # Source and id cannot be shifted into each other.
    assert derived_key("/a", "b\nc") != derived_key("/a\nb", "c")
    assert SubmitRequest.model_validate({**BODY, "idempotencyKey": key}).idempotency_key == key
