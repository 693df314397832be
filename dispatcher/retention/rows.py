"""Stored rows as Arrow tables and back: the archive's schema is the database's.

Each archived table has the columns of its database table, typed from the models
(:mod:`dispatcher.db.tables`): text as strings, timestamps as microsecond UTC
timestamps, jsonb as its JSON text (DuckDB's ``json`` functions read it), dates as
dates, bytea as binary. Nothing is renamed, so a query over the archive reads like one
over the tables. One value is written out where the table leaves it implied: a call's
``provider_key``, which the live row stores only when it is not the namespaced form
of its idempotency key (:func:`dispatcher.tenancy.stored_provider_key`), so the archive
names the key its provider saw without that rule.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa
from sqlalchemy import BigInteger, Date, DateTime, Integer, Table
from sqlalchemy.dialects.postgresql import BYTEA, JSONB

from dispatcher.db.jsonb import dumps
from dispatcher.db.tables import approvals, escalations, execution_events, tool_calls
from dispatcher.schemas import EventView
from dispatcher.tenancy import stored_provider_key

TABLES: dict[str, Table] = {
    "calls": tool_calls,
    "events": execution_events,
    "approvals": approvals,
    "escalations": escalations,
}
"""The archive's tables by their name in it (a file's name starts with it)."""


def _arrow_type(column_type: Any) -> pa.DataType:
    if isinstance(column_type, BigInteger):
        return pa.int64()
    if isinstance(column_type, Integer):
        return pa.int32()
    if isinstance(column_type, DateTime):
        return pa.timestamp("us", tz="UTC")
    if isinstance(column_type, Date):
        return pa.date32()
    if isinstance(column_type, BYTEA):
        return pa.binary()
    return pa.string()  # text, and jsonb as its JSON text


def schema(name: str) -> pa.Schema:
    table = TABLES[name]
    return pa.schema([pa.field(c.name, _arrow_type(c.type)) for c in table.columns])


def _json_columns(name: str) -> frozenset[str]:
    return frozenset(c.name for c in TABLES[name].columns if isinstance(c.type, JSONB))


def to_arrow(name: str, rows: Iterable[Mapping[Any, Any]]) -> pa.Table:
    """The ``name`` table of the archive holding ``rows`` (stored rows, as read)."""
    as_json = _json_columns(name)
    columns = schema(name).names
    if name == "calls":
        rows = (_with_provider_key(row) for row in rows)
    listed = [
        {
            c: (None if row[c] is None else dumps(row[c]).decode()) if c in as_json else row[c]
            for c in columns
        }
        for row in rows
    ]
    return pa.Table.from_pylist(listed, schema=schema(name))


def _with_provider_key(row: Mapping[Any, Any]) -> Mapping[Any, Any]:
    key = stored_provider_key(row["tenant"], row["idempotency_key"], row["provider_key"])
    return {**row, "provider_key": key}


def from_arrow(name: str, table: pa.Table) -> list[dict[str, Any]]:
    """The rows of an archived table, jsonb columns parsed back."""
    as_json = _json_columns(name) & set(table.column_names)
    rows: list[dict[str, Any]] = table.to_pylist()
    for row in rows:
        for c in as_json:
            if row[c] is not None:
                row[c] = json.loads(row[c])
    return rows


def events_of(table: pa.Table) -> list[EventView]:
    """Archived events as the views the run view folds, in log order."""
    rows = sorted(from_arrow("events", table), key=lambda r: r["seq"])
    return [EventView.of(r) for r in rows]
