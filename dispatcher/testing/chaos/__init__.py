"""`tool-dispatcher chaos`: the whole service as separate processes on real PostgreSQL
and a real Kafka-protocol broker, broken on purpose while load flows, then checked
against the invariants the service promises (see ``docs/guarantees.md``).

Modules: :mod:`~dispatcher.testing.chaos.schedule` (the seeded fault plan, pure),
:mod:`~dispatcher.testing.chaos.infra` (database and broker the run owns or borrows),
:mod:`~dispatcher.testing.chaos.supervisor` (the service's processes),
:mod:`~dispatcher.testing.chaos.proxy` (a TCP proxy between workers and the provider),
:mod:`~dispatcher.testing.chaos.faults` (carrying out each planned fault),
:mod:`~dispatcher.testing.chaos.load` (submissions, replays, the simulated approver),
:mod:`~dispatcher.testing.chaos.checker` (the seven invariants),
:mod:`~dispatcher.testing.chaos.report`, :mod:`~dispatcher.testing.chaos.run` (the
whole run) and :mod:`~dispatcher.testing.chaos.command` (the subcommand).
:mod:`~dispatcher.testing.chaos.blind_worker` is a worker with a defence switched off,
and :mod:`~dispatcher.testing.chaos.stale_fence_worker` one whose outcome fence is
the status alone, for proving the checker catches each.
"""
