"""The ``bus_offsets`` table: for each request topic's partition, the offset of the next
record bus intake has not recorded yet.

It moves in the transaction that records a batch (:mod:`dispatcher.bus.recorder`), so
"recorded" and "offset passed" are one fact: a record below it was recorded (a call, or
a refusal and its reply) and is skipped when the broker delivers it again, whoever
holds the partition by then. The Kafka offset commit that follows is only where the
group resumes; this row is what decides. One row per partition, whatever the traffic.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Integer,
    LargeBinary,
    MetaData,
    Table,
    Text,
    func,
)


def bus_offsets_table(metadata: MetaData) -> Table:
    return Table(
        "bus_offsets",
        metadata,
        Column("topic", Text, primary_key=True),
        Column("partition", Integer, primary_key=True),
        Column("next_offset", BigInteger, nullable=False),
        # A fingerprint of the record at next_offset - 1 (dispatcher.bus.continuity): a
        # redelivery of the same log finds it there, a topic made again does not.
        Column("last_record", LargeBinary),
        Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    )
