"""The sandbox provider: a real HTTP server implementing the provider contract that
tool-dispatcher's workers and reconciler call, with faults on demand.

``async with SandboxServer() as sandbox: ...`` in tests, ``serve_sandbox(host, port)``
or ``python -m dispatcher.sandbox`` otherwise. The HTTP contract is summarised in
:mod:`dispatcher.sandbox.provider`, the faults in :mod:`dispatcher.sandbox.faults`.
"""

from dispatcher.sandbox.faults import Fault, FaultKind, FaultRule
from dispatcher.sandbox.pgstore import PostgresStore
from dispatcher.sandbox.records import RequestStatus
from dispatcher.sandbox.server import SandboxServer, serve_sandbox
from dispatcher.sandbox.store import MemoryStore, SandboxStore

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
