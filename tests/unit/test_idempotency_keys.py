"""The request fingerprint is the hash of one canonical JSON text, and the default
idempotency key is built from each of the request's names."""

from __future__ import annotations

import hashlib

from dispatcher.intake.keys import default_key, fingerprint
from dispatcher.schemas import SubmitRequest


def test_the_fingerprint_hashes_one_canonical_text() -> None:
    canonical = '{"capabilityId":"refund","input":{"a":1,"b":"é"}}'
    assert (
        fingerprint("refund", {"b": "é", "a": 1}) == hashlib.sha256(canonical.encode()).hexdigest()
    )


def test_the_fingerprint_tells_capabilities_and_inputs_apart() -> None:
    assert fingerprint("refund", {"a": 1}) == fingerprint("refund", {"a": 1})
    assert fingerprint("refund", {"a": 1}) != fingerprint("charge", {"a": 1})
    assert fingerprint("refund", {"a": 1}) != fingerprint("refund", {"a": 2})


REQUEST = SubmitRequest.model_validate(
    {
        "runId": "run-1",
        "turnId": "turn-2",
        "capabilityId": "refund",
        "correlationId": "corr-3",
        "input": {"orderId": "o-4"},
    }
)


def test_without_a_template_the_key_is_the_call_qualified_by_its_tenant() -> None:
    assert default_key(REQUEST, "tc-5", None, "acme") == "acme:tc-5"


def test_a_template_is_rendered_over_every_name_of_the_request() -> None:
    template = "{runId}/{turnId}/{capabilityId}/{correlationId}/{toolCallId}/{input.orderId}"
    assert default_key(REQUEST, "tc-5", template, "acme") == "run-1/turn-2/refund/corr-3/tc-5/o-4"
