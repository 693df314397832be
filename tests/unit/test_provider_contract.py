"""The provider contract is read the same way by the worker that sends a call and the
reconciler that looks it up: one vocabulary of status words, one body reader."""

from __future__ import annotations

import json
from typing import Any

import pytest
from multidict import CIMultiDict

from dispatcher.capabilities import Capability
from dispatcher.provider.client import OutcomeKind, ProviderClient
from dispatcher.provider.contract import (
    ProviderState,
    credential_headers,
    external_request_id,
    read_object,
    state_of,
    status_word,
)
from dispatcher.provider.transport import Reply, Transport
from reconciler.lookup import ProviderLookup, _classify
from reconciler.policy import Observation

CAPABILITY = Capability.model_validate(
    {"id": "c", "sideEffects": True, "request": {"url": "http://127.0.0.1:1/x"}}
)
WORKER_KIND = {
    ProviderState.SUCCEEDED: OutcomeKind.COMPLETED,
    ProviderState.FAILED: OutcomeKind.FAILED,
    ProviderState.PENDING: OutcomeKind.ACCEPTED,
    ProviderState.PARTIAL: OutcomeKind.ACCEPTED,
    ProviderState.UNRECOGNISED: OutcomeKind.ACCEPTED,
}
LOOKUP_OBSERVATION = {
    ProviderState.SUCCEEDED: Observation.SUCCEEDED,
    ProviderState.FAILED: Observation.FAILED,
    ProviderState.PENDING: Observation.PENDING,
    ProviderState.PARTIAL: Observation.PARTIAL,
    ProviderState.UNRECOGNISED: Observation.UNREADABLE,
}
WORDS = {
    "succeeded": ProviderState.SUCCEEDED,
    "Completed": ProviderState.SUCCEEDED,
    "success": ProviderState.SUCCEEDED,
    "ok": ProviderState.SUCCEEDED,
    "failed": ProviderState.FAILED,
    "failure": ProviderState.FAILED,
    "error": ProviderState.FAILED,
    "declined": ProviderState.FAILED,
    "pending": ProviderState.PENDING,
    "accepted": ProviderState.PENDING,
    "processing": ProviderState.PENDING,
    "in_progress": ProviderState.PENDING,
    "queued": ProviderState.PENDING,
    "partial": ProviderState.PARTIAL,
    "partially_succeeded": ProviderState.PARTIAL,
    "partially_applied": ProviderState.PARTIAL,
    "done-ish": ProviderState.UNRECOGNISED,
    "": ProviderState.UNRECOGNISED,
}


def response(body: Any, status: int = 200) -> Reply:
    return Reply(status, CIMultiDict(), json.dumps(body).encode())


@pytest.mark.parametrize(("word", "state"), WORDS.items())
def test_worker_and_reconciler_read_a_status_word_alike(word: str, state: ProviderState) -> None:
    body = {"status": word, "externalRequestId": "ext-1"}
    assert state_of(body) is state
    sent = ProviderClient(Transport())._classify(CAPABILITY, response(body), 1)
    looked_up = _classify(response(body), "externalRequestId")
    assert sent.kind is WORKER_KIND[state]
    assert looked_up.observation is LOOKUP_OBSERVATION[state]
    assert sent.external_request_id == looked_up.external_request_id == "ext-1"


def test_bodies_that_are_not_objects_carry_nothing() -> None:
    assert read_object(Reply(200, CIMultiDict(), b"not json")) == {}
    assert read_object(response([1, 2])) == {}
    assert external_request_id({"id": 7}) == "7"
    assert external_request_id({"externalRequestId": "a", "id": "b"}) == "a"
    assert external_request_id({}) is None


def test_a_credential_travels_as_a_bearer_token_of_its_own_capability() -> None:
    secrets = {"c": "s3cret"}
    assert credential_headers(secrets, "c") == {"Authorization": "Bearer s3cret"}
    assert credential_headers(secrets, "other") == {}
    lookup = ProviderLookup(Transport(), secrets)
    assert lookup._headers(CAPABILITY, "acme") == {"Authorization": "Bearer s3cret"}


def test_an_absent_status_reads_as_the_empty_word() -> None:
    assert status_word({}) == ""
    assert status_word({"status": "Completed"}) == "completed"
