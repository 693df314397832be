"""Bulk operations: one operator command over every call (or dead letter) a filter
selects, recorded as a row and worked through in batches that survive a crash, each
call touched at most once (docs/bulk-operations.md). ``service`` is what the API, the
console and the CLI call; ``processor`` is the workers' loop."""
