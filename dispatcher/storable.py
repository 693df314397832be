"""What a call's ``input`` may hold: only what PostgreSQL's jsonb stores as it was sent
and a provider's JSON parser reads, and nothing that grows in storage past a stated
factor of its request (see :data:`INPUT_GROWTH`).

Pure Python, like :mod:`dispatcher.schemas`, which checks every ``input`` with it.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

# Deeper input is refused: nothing a tool needs is nested this deep, and each level
# costs stack in the JSON encoder, the database and the provider.
MAX_INPUT_DEPTH = 32
# jsonb keeps a number as numeric, which prints it without an exponent: 1e308, six
# bytes in a request, would be stored and served as 309 digits, for every reader of the
# call. A number with a fraction or an exponent (a float once parsed) whose plain form
# is longer than this is refused. The worst case left is "1e39," (5 bytes) stored as 40
# digits and jsonb's ", " (42 bytes): 8.4 times, so a call's stored input, and the input
# of every answer about it, stays within INPUT_GROWTH times its request body. An integer
# is stored digit for digit as written: it cannot grow.
MAX_NUMBER_CHARS = 40
INPUT_GROWTH = 9
# Python's int/str conversion limit: over HTTP the JSON parser refuses a longer integer,
# and a library caller's would otherwise fail the fingerprint instead of being refused.
_INT_LIMIT = 10**4300


def unstorable(value: Any, path: str = "input", depth: int = 0) -> tuple[str, str] | None:
    """The JSON path and the fault of the first value in ``value`` that PostgreSQL's
    jsonb cannot store or a provider's JSON parser would refuse (a NUL in a string or a
    key, a NaN or infinite number, a number that grows past :data:`MAX_NUMBER_CHARS` in
    jsonb, nesting deeper than :data:`MAX_INPUT_DEPTH`)."""
    if depth > MAX_INPUT_DEPTH:
        return path, f"nested deeper than {MAX_INPUT_DEPTH} levels"
    if isinstance(value, str):
        return (path, "a string holds a NUL character") if "\x00" in value else None
    if isinstance(value, float):
        if not math.isfinite(value):
            return path, "a number is not finite"
        return (path, _LONG_NUMBER) if _grows(value) else None
    if isinstance(value, int) and abs(value) >= _INT_LIMIT:
        return path, "an integer has more than 4300 digits"
    if isinstance(value, Mapping):
        for key, item in value.items():
            name = f"{path}.{key}" if _PLAIN_KEY.fullmatch(key) else f"{path}[{json.dumps(key)}]"
            if "\x00" in key:
                return name, "a key holds a NUL character"
            found = unstorable(item, name, depth + 1)
            if found is not None:
                return found
    elif isinstance(value, list):
        for n, item in enumerate(value):
            found = unstorable(item, f"{path}[{n}]", depth + 1)
            if found is not None:
                return found
    return None


_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
_LONG_NUMBER = (
    "a number is stored without an exponent, and this one would take more than"
    f" {MAX_NUMBER_CHARS} characters (send it as a string)"
)


def _grows(value: float) -> bool:
    """Whether ``value``'s plain decimal form, as PostgreSQL numeric prints it, is
    longer than :data:`MAX_NUMBER_CHARS`."""
    # Between these, repr is already plain (at most 17 digits, a sign, a point and
    # three zeros): no Decimal on the common path.
    if value == 0 or 1e-4 <= abs(value) < 1e16:
        return False
    return len(format(Decimal(repr(value)), "f")) > MAX_NUMBER_CHARS
