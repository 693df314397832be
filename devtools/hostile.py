"""Hostile submissions: request bodies a careless or malicious producer sends to
``POST /v1/tool-calls``, each certainly invalid under the input contract,
so each must be refused with a 4xx problem+json and must write nothing; and valid
bodies whose inputs carry arbitrary Unicode, which must be accepted.

Shared by the property test (``tests/intake/test_hostile_load.py``, where hypothesis
draws the seed and the text) and the chaos load's ``hostile_input`` share
(:mod:`devtools.chaos.load`, which draws both from its seeded RNG). Plain
``random`` and no hypothesis here: the chaos harness runs without the dev extras.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# Characters no identifier may hold: NUL and other controls, CR/LF, DEL, the path
# separator, and anything outside printable ASCII (a header cannot carry it).
FORBIDDEN_IN_IDS = ("\x00", "\x01", "\r\n", "\n", "\x7f", "/", "é", "日本", "\u2028", "\U0001f600")
ID_FIELDS = (
    "toolCallId",
    "runId",
    "turnId",
    "idempotencyKey",
    "correlationId",
    "causationId",
    "reasoningObjectId",
)
# Values PostgreSQL's jsonb cannot store, or JSON's grammar does not have.
NON_FINITE = ("NaN", "Infinity", "-Infinity", "1e400", "-1e400")


@dataclass(frozen=True, slots=True)
class Hostile:
    """One hostile request: what is wrong with it (``kind``) and its raw body."""

    kind: str
    body: bytes


def random_text(rng: random.Random, max_len: int = 12) -> str:
    """Text from all of Unicode (surrogates included), biased towards the characters
    that break things: controls, NUL, separators, astral planes."""
    pools = ((0, 0x20), (0x20, 0x7F), (0x80, 0x800), (0xD800, 0xE000), (0x10000, 0x110000))
    out = []
    for _ in range(rng.randrange(max_len + 1)):
        low, high = rng.choice(pools)
        out.append(chr(rng.randrange(low, high)))
    return "".join(out)


def storable(text: str) -> str:
    """``text`` without what no stored string may hold (NUL, lone surrogates): what a
    valid input may carry."""
    return "".join(c for c in text if c != "\x00" and not 0xD800 <= ord(c) < 0xE000)


def valid_body(n: str, *, capability_id: str, run_id: str, text: str = "") -> bytes:
    """A valid submission: printable-ASCII ids and key, an input with arbitrary (but
    storable) Unicode in its keys and values."""
    value = storable(text)
    body = {
        "runId": run_id,
        "capabilityId": capability_id,
        "toolCallId": f"valid-{n}",
        "idempotencyKey": f"valid-key-{n}",
        "input": {"text": value, f"k-{value}": [value, 1, 2.5, None, True], "n": n},
    }
    return _dumps(body)


def _dumps(value: Any) -> bytes:
    # ensure_ascii: a lone surrogate travels as a \ud800 escape, as a client would send it.
    return json.dumps(value, ensure_ascii=True).encode()


def _base(capability_id: str, run_id: str, n: str) -> dict[str, Any]:
    return {
        "runId": run_id,
        "capabilityId": capability_id,
        "idempotencyKey": f"hostile-key-{n}",
        "toolCallId": f"hostile-{n}",
        "input": {"n": n},
    }


def _bad_id(rng: random.Random, base: dict[str, Any], text: str) -> bytes:
    bad = rng.choice(FORBIDDEN_IN_IDS)
    cut = rng.randrange(len(text) + 1)
    base[rng.choice(ID_FIELDS)] = f"x{text[:cut]}{bad}{text[cut:]}"
    return _dumps(base)


def _long_id(rng: random.Random, base: dict[str, Any], text: str) -> bytes:
    field = rng.choice(ID_FIELDS)
    base[field] = "a" * (256 if field == "idempotencyKey" else 201)
    return _dumps(base)


def _non_finite(rng: random.Random, base: dict[str, Any], text: str) -> bytes:
    marker = "__number__"
    base["input"] = {"amount": marker, "text": storable(text)}
    return _dumps(base).replace(f'"{marker}"'.encode(), rng.choice(NON_FINITE).encode())


def _nul_in_input(rng: random.Random, base: dict[str, Any], text: str) -> bytes:
    if rng.random() < 0.5:
        base["input"] = {"note": f"{storable(text)}\x00", "list": ["a", f"b\x00{text}"]}
    else:
        base["input"] = {f"key\x00{storable(text)}": 1}
    return _dumps(base)


def _lone_surrogate(rng: random.Random, base: dict[str, Any], text: str) -> bytes:
    base["input"] = {"note": storable(text) + chr(rng.randrange(0xD800, 0xE000))}
    return _dumps(base)


def _deep_input(rng: random.Random, base: dict[str, Any], text: str) -> bytes:
    # Built as text: deeper than json.dumps itself would go.
    depth = rng.randrange(300, 1200)
    base["input"] = {"deep": "__deep__"}
    return _dumps(base).replace(b'"__deep__"', b"[" * depth + b"]" * depth)


def _invalid_json(rng: random.Random, base: dict[str, Any], text: str) -> bytes:
    raw = _dumps({**base, "input": {"t": text}})
    choice = rng.randrange(4)
    if choice == 0:
        return raw[: rng.randrange(1, len(raw) - 1)]  # truncated
    if choice == 1:
        return text.encode("utf-8", "surrogatepass") + b"{"  # not JSON, maybe not UTF-8
    if choice == 2:
        return b"\xff\xfe" + raw  # not UTF-8
    return raw.replace(b":", b"=", 1)


def _not_an_object(rng: random.Random, base: dict[str, Any], text: str) -> bytes:
    return _dumps(rng.choice([[base], storable(text), 42, None, True]))


def _wrong_type(rng: random.Random, base: dict[str, Any], text: str) -> bytes:
    field = rng.choice(["input", "runId", "capabilityId", "toolCallId", "idempotencyKey"])
    base[field] = rng.choice(
        [[storable(text)], 7, 1.5, False, {"a": 1} if field != "input" else "x"]
    )
    return _dumps(base)


def _unknown_field(rng: random.Random, base: dict[str, Any], text: str) -> bytes:
    base["x" + storable(text)] = storable(text)
    return _dumps(base)


def _missing_field(rng: random.Random, base: dict[str, Any], text: str) -> bytes:
    del base[rng.choice(["runId", "capabilityId", "input"])]
    return _dumps(base)


def _empty_id(rng: random.Random, base: dict[str, Any], text: str) -> bytes:
    base[rng.choice(["runId", "capabilityId", "toolCallId", "idempotencyKey"])] = ""
    return _dumps(base)


def _unknown_capability(rng: random.Random, base: dict[str, Any], text: str) -> bytes:
    base["capabilityId"] = "no-such-capability-" + "".join(
        c for c in text if c.isascii() and c.isalnum()
    )
    return _dumps(base)


_MAKERS: dict[str, Callable[[random.Random, dict[str, Any], str], bytes]] = {
    "bad_id": _bad_id,
    "long_id": _long_id,
    "non_finite": _non_finite,
    "nul_in_input": _nul_in_input,
    "lone_surrogate": _lone_surrogate,
    "deep_input": _deep_input,
    "invalid_json": _invalid_json,
    "not_an_object": _not_an_object,
    "wrong_type": _wrong_type,
    "unknown_field": _unknown_field,
    "missing_field": _missing_field,
    "empty_id": _empty_id,
    "unknown_capability": _unknown_capability,
}
KINDS: tuple[str, ...] = tuple(_MAKERS)


def hostile_body(
    rng: random.Random,
    n: str,
    *,
    capability_id: str,
    run_id: str,
    kind: str | None = None,
    text: str | None = None,
) -> Hostile:
    """A hostile submission of ``kind`` (drawn if None) around arbitrary ``text``
    (drawn from all of Unicode if None); ``n`` makes its ids unique."""
    kind = kind or rng.choice(KINDS)
    if text is None:
        text = random_text(rng)
    return Hostile(kind, _MAKERS[kind](rng, _base(capability_id, run_id, n), text))


def hostile_path_id(rng: random.Random, text: str | None = None) -> str:
    """A toolCallId for a path (percent-encoded by the caller) that no call can have."""
    if text is None:
        text = random_text(rng)
    return f"x{storable(text)}{rng.choice(FORBIDDEN_IN_IDS[:5])}"
