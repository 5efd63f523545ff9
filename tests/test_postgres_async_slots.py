"""The async face's per-loop connections: a free slot is taken at once, a full set waits at most ``timeout``."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from checkpointers import BackendUnavailableError
from checkpointers._flows import make_put
from checkpointers._names import Partition
from checkpointers.backends.postgres import PostgresBackend


@pytest.mark.timeout(60)
def test_async_connections_wait_for_a_slot_and_time_out_when_none_frees(postgres_schema_url: str) -> None:
    b = PostgresBackend.from_url(postgres_schema_url, max_size=1, timeout=0.5, retry_attempts=0)
    p = Partition("u", "items", f"slots-{uuid.uuid4().hex[:8]}")

    async def main() -> None:
        # more operations than slots: they queue for the one connection and all complete
        await asyncio.gather(*(b.awrite(p, [make_put(f"k{i}", b"v")]) for i in range(5)))
        assert len(await b.aget(p, [f"k{i}" for i in range(5)])) == 5
        pool = b._async_pool()
        async with pool.connection():  # the only slot held: the next operation cannot get one
            with pytest.raises(BackendUnavailableError, match="no connection free within 0.5 s"):
                await b.aget(p, ["k0"])
        assert (await b.aget(p, ["k0"]))[0] is not None  # freed: served again

    try:
        asyncio.run(main())
    finally:
        b.close()
