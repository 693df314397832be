"""How the service's values become jsonb parameters: orjson, with the standard
library for what orjson refuses.

Every jsonb parameter of the service goes through :func:`dumps` (the engine gives it to
psycopg for each of its connections): the intake statement's calls, events and outbox
rows, the write path's moves and messages. orjson encodes them in a fraction of the
standard library's time. PostgreSQL parses the text into jsonb, so the bytes sent do not
reach anyone: the relay publishes the jsonb as PostgreSQL prints it.

Reading stays with the standard library (psycopg's default): orjson reads an integer
beyond 64 bits as a float, and a call's input may hold one (jsonb keeps it exact), which
the worker must send to the provider unchanged.
"""

from __future__ import annotations

import json
from typing import Any

import orjson


def dumps(value: Any) -> bytes:
    """``value`` as compact JSON text (UTF-8).

    orjson refuses an integer beyond 64 bits, which the standard library writes as it
    is. orjson writes a NaN or an infinity as null, where the standard library wrote
    ``NaN`` and PostgreSQL refused the statement. Intake refuses such input
    (dispatcher.schemas.unstorable); a provider's answer, which the standard library
    reads NaN in, is the one way one still arrives, and it is stored as null.
    """
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
