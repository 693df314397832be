"""``python -m devtools.chaos.early_commit bus-intake``: bus intake with one defence
switched off ON PURPOSE, for proving that the chaos checker sees request records
lost (`python -m devtools chaos --plant early-commit`, which runs the bus intake
processes through it, leading with a bus intake killed mid-batch). Never run it
against a real request topic.

The defence: the group's offsets are committed to Kafka only after the batch's
transaction committed, so a process killed with a batch in hand leaves it to be
fetched again. Here each fetched batch's offsets are committed first, as an
auto-committing consumer does: killed before the batch is recorded, its records are
never fetched again and never answered.

The product is left as it is: :meth:`dispatcher.bus.consumer.BusIntake.handle` is
rebound in this process only, and the CLI then runs as usual.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys

from aiokafka import TopicPartition
from aiokafka.errors import KafkaError

from dispatcher.bus import consumer

_record_then_commit = consumer.BusIntake.handle


async def commit_then_record(
    self: consumer.BusIntake,
    batches: dict[TopicPartition, list[consumer.Record]],
    stop: asyncio.Event,
) -> None:
    """Commit the batch's offsets, then handle it as the real code does."""
    offsets = {tp: records[-1].offset + 1 for tp, records in batches.items() if records}
    if offsets:
        with contextlib.suppress(KafkaError):
            await self._consumer.commit(offsets)
    await _record_then_commit(self, batches, stop)


def main() -> int:
    consumer.BusIntake.handle = commit_then_record  # type: ignore[method-assign]
    from tool_dispatcher.main import main as cli

    return cli(sys.argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
