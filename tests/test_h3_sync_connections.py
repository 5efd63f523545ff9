"""The sync face's pool opens with its first connection ready, so one thread's calls keep to one server process.

Opened with ``wait=False``, psycopg_pool's ``ConnectionPool`` made the first
call wait for its first connection, and a pool that had a waiter grows: it
held two connections after one call, and since it hands idle connections out
oldest first, one thread's operations alternated between two server
processes, each with its caches cold (docs/postgres.md, "The sync face's
connections").
"""

from __future__ import annotations

import uuid

from checkpointers._flows import make_put
from checkpointers._names import Partition
from checkpointers.backends.postgres import PostgresBackend


def test_one_thread_keeps_to_one_server_process(postgres_schema_url: str) -> None:
    b = PostgresBackend.from_url(postgres_schema_url, max_size=4)
    p = Partition("u", "items", f"one-{uuid.uuid4().hex[:8]}")
    try:
        pids = []
        for i in range(6):
            b.write(p, [make_put(f"k{i}", b"v")])
            assert b.get(p, [f"k{i}"])[0] is not None
            with b._sync_pool().connection() as conn:
                pids.append(int(conn.info.backend_pid))
        assert len(set(pids)) == 1  # one server process served them all
        assert b._sync_pool().get_stats()["pool_size"] == 1  # type: ignore[union-attr]
    finally:
        b.close()
