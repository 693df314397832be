"""The sandbox provider: a real HTTP server implementing the provider contract that
tool-dispatcher's workers and reconciler call, with faults on demand.

``async with SandboxServer() as sandbox: ...`` in tests, ``serve_sandbox(host, port)``
or ``python -m devtools.sandbox`` otherwise. The HTTP contract is summarised in
:mod:`devtools.sandbox.provider`, the faults in :mod:`devtools.sandbox.faults`.
"""

from devtools.sandbox.faults import Fault, FaultKind, FaultRule
from devtools.sandbox.pgstore import PostgresStore
from devtools.sandbox.records import RequestStatus
from devtools.sandbox.server import SandboxServer, serve_sandbox
from devtools.sandbox.store import MemoryStore, SandboxStore

__all__ = [
    "Fault",
    "FaultKind",
    "FaultRule",
    "MemoryStore",
    "PostgresStore",
    "RequestStatus",
    "SandboxServer",
    "SandboxStore",
    "serve_sandbox",
]
