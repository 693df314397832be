"""A call's idempotency key and request fingerprint: how intake derives them, and what
an approval binds itself to."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from dispatcher.capabilities import render_key_template
from dispatcher.schemas import SubmitRequest


def fingerprint(capability_id: str, call_input: dict[str, Any]) -> str:
    """Hash of the canonical JSON of what the call would do."""
    canonical = json.dumps(
        {"capabilityId": capability_id, "input": call_input},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def fingerprint_column(digest: str) -> str:
    """``digest`` (:func:`fingerprint`) as ``tool_calls.request_fingerprint`` takes it
    in a JSON parameter: bytea's hex input form, so its 32 bytes are what is stored
    (migration 0016), not its 64 digits."""
    return f"\\x{digest}"


def same_request(stored: bytes, digest: str) -> bool:
    """Whether a call's stored fingerprint is ``digest``: its 32 bytes, or the digits'
    own text, which a release before migration 0016 writes into the bytea column while
    the two run side by side."""
    return stored == bytes.fromhex(digest) or stored == digest.encode()


def default_key(
    request: SubmitRequest, tool_call_id: str, template: str | None, tenant: str
) -> str:
    """The key of a request that names none: the capability's template rendered over
    the request, or else the call's id qualified by its tenant (a toolCallId is unique
    only within its tenant; the provider sees every tenant's keys)."""
    if template is None:
        return f"{tenant}:{tool_call_id}"
    return render_key_template(
        template,
        {
            "input": request.input,
            "runId": request.run_id,
            "turnId": request.turn_id,
            "capabilityId": request.capability_id,
            "correlationId": request.correlation_id,
            "toolCallId": tool_call_id,
        },
    )
