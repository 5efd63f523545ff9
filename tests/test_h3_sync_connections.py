"""The sync face's own connections (``_ThreadConnections``): newest first, bounded, broken ones dropped.

psycopg_pool's ``ConnectionPool`` handed idle connections out oldest first,
so once it had grown (it did on its first call) one thread's operations went
to its server processes in turn; the sync face now keeps to the connection it
used last, as the async face and ``PostgresSaver`` do.
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

import psycopg
import pytest

from checkpointers._flows import make_put
from checkpointers._names import Partition
from checkpointers.backends.postgres import PostgresBackend
from checkpointers.errors import BackendUnavailableError


def _server_pid(b: PostgresBackend) -> int:
    with b._sync_pool().connection() as conn:
        return int(conn.info.backend_pid)


def test_one_thread_keeps_to_the_connection_it_used_last(postgres_schema_url: str) -> None:
    b = PostgresBackend.from_url(postgres_schema_url, max_size=4)
    p = Partition("u", "items", f"lifo-{uuid.uuid4().hex[:8]}")
    try:
        pool = b._sync_pool()
        with pool.connection() as c1, pool.connection() as c2, pool.connection() as c3:  # three open, as after a burst
            opened = {c1.info.backend_pid, c2.info.backend_pid, c3.info.backend_pid}
        assert len(opened) == 3
        pids = []
        for i in range(6):
            b.write(p, [make_put(f"k{i}", b"v")])
            pids.append(_server_pid(b))
        assert len(set(pids)) == 1 and pids[0] in opened  # one server process served them all
    finally:
        b.close()


def test_no_free_connection_within_the_timeout_is_unavailable(postgres_schema_url: str) -> None:
    b = PostgresBackend.from_url(postgres_schema_url, max_size=1, timeout=0.3, retry_attempts=0)
    p = Partition("u", "items", "busy")
    caught: list[BaseException] = []

    def other() -> None:
        try:
            b.get(p, ["k"])
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            caught.append(exc)

    try:
        with b._sync_pool().connection():  # the only connection, held
            t = threading.Thread(target=other)
            t.start()
            t.join(10)
        assert len(caught) == 1 and isinstance(caught[0], BackendUnavailableError)
        assert b.get(p, ["k"]) == [None]  # free again
    finally:
        b.close()


def test_a_connection_the_server_closed_is_not_handed_out_again(postgres_schema_url: str, postgres_url: str) -> None:
    b = PostgresBackend.from_url(postgres_schema_url, max_size=2)
    p = Partition("u", "items", "broken")
    try:
        b.write(p, [make_put("k", b"v")])
        first = _server_pid(b)
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (first,))
        rec: Any = b.get(p, ["k"])[0]  # the dead connection fails, is dropped, and the retry connects anew
        assert rec is not None and rec.value == b"v"
        assert _server_pid(b) != first
        assert len(b._sync_pool().idle) == 1  # type: ignore[union-attr]
    finally:
        b.close()


def test_closing_the_backend_closes_its_idle_connections(postgres_schema_url: str) -> None:
    b = PostgresBackend.from_url(postgres_schema_url)
    b.get(Partition("u", "items", "x"), ["k"])
    conns = list(b._sync_pool().idle)  # type: ignore[union-attr]
    assert conns
    b.close()
    assert all(c.closed for c in conns)
    with pytest.raises(BackendUnavailableError, match="closed"):
        b.get(Partition("u", "items", "x"), ["k"])
