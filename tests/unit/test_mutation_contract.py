"""What the provider pools promise, and the status word of a body that names none:
mutants of ``dispatcher/provider/contract.py`` that the contract tests let live
(``python -m bench.mutation --module dispatcher/provider/contract.py``)."""

from __future__ import annotations

import httpx
import pytest

from dispatcher.provider.contract import CONNECTIONS_PER_POOL, pool, pools, status_word


def limits(client: httpx.AsyncClient) -> tuple[int, int]:
    # httpx keeps no public view of a client's limits; its transport's pool has them.
    connection_pool = client._transport._pool  # type: ignore[attr-defined]
    return connection_pool._max_connections, connection_pool._max_keepalive_connections


def test_an_absent_status_reads_as_the_empty_word() -> None:
    assert status_word({}) == ""
    assert status_word({"status": "Completed"}) == "completed"


@pytest.mark.parametrize(("connections", "sizes"), [(5, [2, 2, 1]), (4, [2, 2]), (1, [1])])
async def test_pools_hold_exactly_the_connections_asked_for(
    connections: int, sizes: list[int]
) -> None:
    made = pools(connections)
    try:
        assert CONNECTIONS_PER_POOL == 2
        assert [limits(c) for c in made] == [(n, n) for n in sizes]
    finally:
        for client in made:
            await client.aclose()


async def test_a_pool_never_follows_a_redirect() -> None:
    # A followed 307/308 re-sends the request's body elsewhere: a second send of a
    # side effect, under the same key, to a URL the capability never named.
    client = pool(3)
    try:
        assert not client.follow_redirects
        assert limits(client) == (3, 3)
    finally:
        await client.aclose()
