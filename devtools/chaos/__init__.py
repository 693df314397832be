"""`python -m devtools chaos`: the whole service as separate processes on real PostgreSQL
and a real Kafka-protocol broker, broken on purpose while load flows, then checked
against the invariants the service promises (see ``docs/guarantees.md``).

Modules: :mod:`~devtools.chaos.schedule` (the seeded fault plan, pure),
:mod:`~devtools.chaos.infra` (database and broker the run owns or borrows),
:mod:`~devtools.chaos.supervisor` (the service's processes),
:mod:`~devtools.chaos.proxy` (a TCP proxy between workers and the provider),
:mod:`~devtools.chaos.faults` (carrying out each planned fault),
:mod:`~devtools.chaos.stack` (the service's registry and settings),
:mod:`~devtools.chaos.load` (two tenants' submissions, replays, the simulated
approvers of :mod:`~devtools.chaos.approvers`; :mod:`~devtools.chaos.bus_load`, its
share through bus intake; :mod:`~devtools.chaos.stats`, what it saw),
:mod:`~devtools.chaos.dead_letters` (each tenant's dead letters, found and
discarded), :mod:`~devtools.chaos.checker` (the ten invariants;
:mod:`~devtools.chaos.isolation` is the eighth) with
:mod:`~devtools.chaos.evidence` and :mod:`~devtools.chaos.bus_evidence` (what they
are checked against),
:mod:`~devtools.chaos.report`, :mod:`~devtools.chaos.run` (the
whole run) and :mod:`~devtools.chaos.command` (the subcommand).
:mod:`~devtools.chaos.blind_worker` is a worker with a defence switched off,
:mod:`~devtools.chaos.stale_fence_worker` one whose outcome fence is the
status alone, :mod:`~devtools.chaos.shared_keys` runs any process of the
service with keys that do not name their tenant, and
:mod:`~devtools.chaos.early_commit` bus intake committing offsets before it records,
for proving the checker catches each.
"""
