"""`tool-dispatcher chaos`: the whole service as separate processes on real PostgreSQL
and a real Kafka-protocol broker, broken on purpose while load flows, then checked
against the invariants the service promises (see ``docs/guarantees.md``).

Modules: :mod:`~dispatcher.testing.chaos.schedule` (the seeded fault plan, pure),
:mod:`~dispatcher.testing.chaos.infra` (database and broker the run owns or borrows),
:mod:`~dispatcher.testing.chaos.supervisor` (the service's processes),
:mod:`~dispatcher.testing.chaos.proxy` (a TCP proxy between workers and the provider),
:mod:`~dispatcher.testing.chaos.faults` (carrying out each planned fault),
:mod:`~dispatcher.testing.chaos.stack` (the service's registry and settings),
:mod:`~dispatcher.testing.chaos.load` (two tenants' submissions, replays, the simulated
approvers; :mod:`~dispatcher.testing.chaos.stats`, what it saw),
:mod:`~dispatcher.testing.chaos.dead_letters` (each tenant's dead letters, found and
discarded), :mod:`~dispatcher.testing.chaos.checker` (the eight invariants;
:mod:`~dispatcher.testing.chaos.isolation` is the eighth) with
:mod:`~dispatcher.testing.chaos.evidence` (what they are checked against),
:mod:`~dispatcher.testing.chaos.report`, :mod:`~dispatcher.testing.chaos.run` (the
whole run) and :mod:`~dispatcher.testing.chaos.command` (the subcommand).
:mod:`~dispatcher.testing.chaos.blind_worker` is a worker with a defence switched off,
:mod:`~dispatcher.testing.chaos.stale_fence_worker` one whose outcome fence is the
status alone, and :mod:`~dispatcher.testing.chaos.shared_keys` runs any process of the
service with keys that do not name their tenant, for proving the checker catches each.
"""
