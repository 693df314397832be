"""What a database error means for the one who got it: the one classifier of driver and
pool errors, by SQLSTATE class where the server sent one and by exception type where
it did not. The API's problem mapping, intake's group commit and the command-line
tools all decide through :func:`classify`.
"""

from __future__ import annotations

import traceback
from enum import StrEnum

import psycopg
from sqlalchemy import exc as sa


class DbErrorClass(StrEnum):
    """Kinds of database failure, from "try again later" to "this is a bug"."""

    UNAVAILABLE = "unavailable"
    """No usable connection: refused or lost (SQLSTATE class 08), a server shutting down
    or starting (57P01-57P03), a driver error with no SQLSTATE (the server never
    answered), a connection the driver or pool closed, no pooled connection in time, an
    OSError of the driver itself."""
    CONTENTION = "contention"
    """The transaction lost a race (40001 serialization failure, 40P01 deadlock): it is
    safe to run again as a whole."""
    TRANSIENT = "transient"
    """Any other operational refusal by a reachable server: a statement timeout
    (57014), a lock not available (55P03), insufficient resources (class 53)."""
    PROGRAM_LIMIT = "program_limit"
    """The statement exceeds a server limit (class 54): the same statement fails again."""
    DATA = "data"
    """The server refused the data: a value its type rejects (class 22: a NUL or an
    untranslatable character in text or jsonb, a number out of range, bad JSON). The
    same data fails again: the input is at fault."""
    CONSTRAINT = "constraint"
    """A violated constraint (class 23). Input that passed validation violates none the
    program does not handle itself, so one reaching a caller is the program's fault."""
    OTHER = "other"
    """Everything else: a bug (class 42, an internal error), or no database error at all."""


# The server is going away or not accepting connections yet (class 57 "operator
# intervention" also holds 57014, a statement timeout, which is no outage).
_SERVER_GOING = frozenset({"57P01", "57P02", "57P03"})
_CONTENTION = frozenset({"40001", "40P01"})
_OPERATIONAL = (sa.OperationalError, psycopg.OperationalError)

REFUSED_INPUT = frozenset({DbErrorClass.DATA, DbErrorClass.PROGRAM_LIMIT})
"""The kinds that say the statement's data is at fault, not the service: the same
request fails again however often it is sent (an API answers them 400)."""


def classify(exc: BaseException) -> DbErrorClass:
    """The kind of ``exc``, a SQLAlchemy or psycopg error (or anything else: ``OTHER``)."""
    if isinstance(exc, sa.DBAPIError) and exc.connection_invalidated:
        return DbErrorClass.UNAVAILABLE
    if isinstance(
        exc, (sa.InterfaceError, psycopg.InterfaceError, sa.DisconnectionError, sa.TimeoutError)
    ):
        # InterfaceError: a connection the driver already closed; sa.TimeoutError: no
        # pooled connection came free in time.
        return DbErrorClass.UNAVAILABLE
    if isinstance(exc, (sa.DBAPIError, psycopg.Error)):
        return _by_sqlstate(exc)
    # builtins.TimeoutError is an OSError too. Only when the pool or the driver raised it
    # unwrapped: an OSError of the application's own (a file it reads) is no outage.
    if isinstance(exc, OSError) and _raised_by_driver(exc):
        return DbErrorClass.UNAVAILABLE
    return DbErrorClass.OTHER


def _by_sqlstate(exc: sa.DBAPIError | psycopg.Error) -> DbErrorClass:
    code = sqlstate(exc)
    if code is None:
        # psycopg raises connection failures without a SQLSTATE: no server answered.
        return DbErrorClass.UNAVAILABLE if isinstance(exc, _OPERATIONAL) else DbErrorClass.OTHER
    if code.startswith("08") or code in _SERVER_GOING:
        return DbErrorClass.UNAVAILABLE
    if code in _CONTENTION:
        return DbErrorClass.CONTENTION
    if code.startswith("54"):
        return DbErrorClass.PROGRAM_LIMIT
    if code.startswith("22"):
        return DbErrorClass.DATA
    if code.startswith("23"):
        return DbErrorClass.CONSTRAINT
    return DbErrorClass.TRANSIENT if isinstance(exc, _OPERATIONAL) else DbErrorClass.OTHER


def sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE the server sent with ``exc``, if any."""
    driver_error = exc.orig if isinstance(exc, sa.DBAPIError) else exc
    code = getattr(driver_error, "sqlstate", None)
    return code if isinstance(code, str) else None


def refusal(exc: BaseException) -> str:
    """What the server refused, in its own words: the primary message only, without
    the statement, its parameters or the DETAIL and CONTEXT lines, which can quote
    other rows of the statement."""
    driver_error = exc.orig if isinstance(exc, sa.DBAPIError) else exc
    diag = getattr(driver_error, "diag", None)
    primary = getattr(diag, "message_primary", None)
    if isinstance(primary, str) and primary:
        return primary
    return type(driver_error).__name__


def _raised_by_driver(exc: OSError) -> bool:
    return any(
        str(frame.f_globals.get("__name__", "")).startswith(("sqlalchemy.", "psycopg"))
        for frame, _ in traceback.walk_tb(exc.__traceback__)
    )
