"""`tool-dispatcher chaos`: the whole service as separate processes on real PostgreSQL
and a real Kafka-protocol broker, broken on purpose while load flows, then checked
against the invariants the service promises (see ``docs/guarantees.md``).

Modules: :mod:`~dispatcher.chaos.schedule` (the seeded fault plan, pure),
:mod:`~dispatcher.chaos.infra` (database and broker the run owns or borrows),
:mod:`~dispatcher.chaos.supervisor` (the service's processes),
:mod:`~dispatcher.chaos.proxy` (a TCP proxy between workers and the provider),
:mod:`~dispatcher.chaos.faults` (carrying out each planned fault),
:mod:`~dispatcher.chaos.load` (submissions, replays, the simulated approver),
:mod:`~dispatcher.chaos.checker` (the five invariants),
:mod:`~dispatcher.chaos.report`, :mod:`~dispatcher.chaos.run` (the whole run) and
:mod:`~dispatcher.chaos.command` (the subcommand). :mod:`~dispatcher.chaos.blind_worker`
is a worker with a defence switched off, for proving the checker catches it.
"""
