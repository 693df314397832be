"""The sandbox provider: a real HTTP server implementing the provider contract that
tool-dispatcher's workers and reconciler call, with faults on demand.

``async with SandboxServer() as sandbox: ...`` in tests, ``serve_sandbox(host, port)``
or ``python -m dispatcher.testing.sandbox`` otherwise. The HTTP contract is summarised in
:mod:`dispatcher.testing.sandbox.provider`, the faults in :mod:`dispatcher.testing.sandbox.faults`.
"""

from dispatcher.testing.sandbox.faults import Fault, FaultKind, FaultRule
from dispatcher.testing.sandbox.pgstore import PostgresStore
from dispatcher.testing.sandbox.records import RequestStatus
from dispatcher.testing.sandbox.server import SandboxServer, serve_sandbox
from dispatcher.testing.sandbox.store import MemoryStore, SandboxStore

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
