"""``python -m outbox_relay`` as a real process: bad arguments, SIGTERM, kill -9."""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from devtools.databases import unique_name
from tests.fixtures.relay import (
    REPO,
    RelayProcess,
    TopicReader,
    assert_key_order,
    fill,
    scalar,
    unpublished,
)
from tests.fixtures.waiting import eventually


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "outbox_relay", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["--database-url", "postgresql://x/y"],
        ["--database-url", "mysql://x/y", "--bootstrap", "b:9092"],
        ["--database-url", "postgresql://x/y", "--bootstrap", "b:9092", "--batch-size", "0"],
        ["--database-url", "postgresql://x/y", "--bootstrap", "b:9092", "--table", "Bad-Name"],
        ["--database-url", "postgresql://x/y", "--bootstrap", "b:9092", "--topic-map", "nope"],
    ],
)
def test_bad_arguments_exit_2_with_one_line(args: list[str]) -> None:
    done = _run(*args)
    assert done.returncode == 2
    assert done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


async def _unpublished_below(database_url: str, count: int) -> bool:
    return await unpublished(database_url) < count


async def _published_ids(database_url: str) -> set[str]:
    ids = await scalar(
        database_url,
        "SELECT coalesce(array_agg(headers ->> 'ce_id'), '{}') FROM outbox "
        "WHERE published_at IS NOT NULL",
    )
    return set(ids)


@pytest.mark.postgres
@pytest.mark.kafka
async def test_sigterm_finishes_the_batch_in_flight_and_exits_0(
    database_url: str, kafka_bootstrap: str, tmp_path: Path
) -> None:
    topic = unique_name("relay-sigterm")
    await fill(database_url, topic, 20_000, keys=50)
    relay = RelayProcess(
        database_url, kafka_bootstrap, "--batch-size", "500", log=tmp_path / "relay.log"
    ).start()
    try:
        await eventually(lambda: _unpublished_below(database_url, 15_000), within=60)
        code = await asyncio.to_thread(relay.terminate)
    finally:
        relay.stop_quietly()

    assert code == 0, (tmp_path / "relay.log").read_text()
    assert "Traceback" not in (tmp_path / "relay.log").read_text()
    marked = await _published_ids(database_url)
    assert 0 < len(marked) < 20_000
    async with TopicReader(kafka_bootstrap, topic) as reader:
        await reader.distinct(len(marked), within=30)
        await reader.poll(0.5)
    delivered = {m.ce_id for m in reader.messages}
    # Nothing marked that was not delivered, nothing delivered left unmarked: the
    # batch in flight at the signal was finished, not abandoned half-way.
    assert delivered == marked
    assert (
        await scalar(database_url, "SELECT count(*) FROM outbox_lanes WHERE owner IS NOT NULL") == 0
    )


@pytest.mark.postgres
@pytest.mark.kafka
@pytest.mark.slow
async def test_kill_9_at_random_points_loses_nothing(
    database_url: str, kafka_bootstrap: str, tmp_path: Path
) -> None:
    total, batch, kills = 20_000, 500, 24
    topic = unique_name("relay-kill")
    await fill(database_url, topic, total, keys=50)
    rng = random.Random()
    # Kill points spread over the whole run: after a random number of marked rows.
    thresholds = sorted(rng.sample(range(1, total * 3 // 4), kills))
    log = tmp_path / "relay.log"
    for round_, threshold in enumerate(thresholds):
        # Mostly the same relay id (a restart resumes at once); every fourth round a new
        # one, which must wait for the dead relay's leases to lapse.
        relay_id = f"killed-{round_}" if round_ % 4 == 3 else "killed"
        relay = RelayProcess(
            database_url,
            kafka_bootstrap,
            "--batch-size",
            str(batch),
            "--relay-id",
            relay_id,
            log=log,
        ).start()
        try:
            while total - await unpublished(database_url) < threshold:
                await asyncio.sleep(0.005)
                assert relay.process is not None
                assert relay.process.poll() is None, log.read_text()[-3000:]
            await asyncio.sleep(rng.uniform(0, 0.05))
        finally:
            relay.kill()
    assert await unpublished(database_url) > 0

    last = RelayProcess(database_url, kafka_bootstrap, "--batch-size", str(batch), log=log).start()
    try:
        await eventually(lambda: _unpublished_below(database_url, 1), within=120)
        assert last.terminate() == 0
    finally:
        last.stop_quietly()

    async with TopicReader(kafka_bootstrap, topic) as reader:
        messages = await reader.distinct(total, within=60)
        await reader.poll(0.5)
    copies = Counter(m.ce_id for m in reader.messages)
    assert len(copies) == total
    duplicates = sum(copies.values()) - total
    # Only batches in flight at a kill are sent twice: at most one batch per kill.
    assert duplicates <= kills * batch, duplicates
    print(f"{kills} kills, {duplicates} duplicate deliveries of {total} rows")
    assert_key_order(messages)
