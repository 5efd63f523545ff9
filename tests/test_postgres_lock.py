"""PostgreSQL schema migration 5: the partition lock is an advisory lock, not a row lock.

A batch that writes nothing (every put kept) takes no transaction id and
writes no WAL; writers of one partition still queue on the advisory lock; a
partition that can expire still has its row locked while it is written (the
sweep skips it); a version-4 schema written by its own ``write_batch``
migrates, keeps its records, and for an hour has every writer lock the row too
(a batch begun under version 4 may still run).
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import psycopg
import pytest

from checkpointers._flows import make_put
from checkpointers._names import Partition
from checkpointers.backends.base import ListQuery, Mode, Put, WriteResult
from checkpointers.backends.postgres import SCHEMA_VERSION, PostgresBackend
from tests.plugins.postgres_plugin import with_query
from tests.test_postgres_backend import schema_at


def _conninfo_and_schema(url: str) -> tuple[str, str]:
    b = PostgresBackend.from_url(url)
    return b.conninfo, b.schema


def _guard(rec: Any) -> Put:
    """The unchanged IF_MATCH re-put of a stored record (what a lease guard sends)."""
    return Put(rec.name, rec.value, rec.digest, rec.etag, dict(rec.tags), Mode.IF_MATCH, rec.etag)


def _in_open_transaction(conn: psycopg.Connection[Any], write: Any) -> tuple[Any, Any]:
    """Run ``write()`` inside a transaction left open on ``conn``: its result and the transaction's id."""
    conn.execute("SELECT 1")  # opens the caller's transaction: the backend works in a savepoint of it
    result = write()
    (xid,) = conn.execute("SELECT pg_current_xact_id_if_assigned()::text").fetchone()  # type: ignore[misc]
    return result, xid


@pytest.mark.parametrize("ttl", [None, 3600.0], ids=["no-ttl", "ttl"])
def test_a_batch_that_writes_nothing_takes_no_transaction_id(
    postgres_schema_url: str, _postgres_admin: psycopg.Connection[Any], ttl: float | None
) -> None:
    conninfo, schema = _conninfo_and_schema(postgres_schema_url)
    p = Partition("u", "items", f"noop-{uuid.uuid4().hex[:8]}")
    with psycopg.connect(conninfo) as conn:  # no autocommit: the caller's transaction stays open
        b = PostgresBackend(conn, schema=schema, ttl=ttl)
        stored = b.write(p, [make_put("lease", b"L"), make_put("w", b"1", mode=Mode.APPEND)]).records
        conn.commit()
        noop = [_guard(stored[0]), make_put("w", b"1", mode=Mode.APPEND)]  # a kept guard, an append of the same
        result, xid = _in_open_transaction(conn, lambda: b.write(p, noop))
        assert isinstance(result, WriteResult) and result.records == stored
        if ttl is None:
            assert xid is None  # no row lock, no row written: nothing for WAL
        else:  # the expiry is pushed back (a write) and the row was locked for the sweep: an id
            assert xid is not None
        conn.rollback()
        # a batch that writes takes one, so the check above can fail
        _, xid = _in_open_transaction(conn, lambda: b.write(p, [_guard(stored[0]), make_put("x", b"2")]))
        assert xid is not None
        conn.rollback()


@pytest.mark.parametrize(("ttl", "locked"), [(3600.0, True), (None, False)], ids=["ttl", "no-ttl"])
def test_a_partition_that_can_expire_has_its_row_locked_while_written(
    postgres_schema_url: str, _postgres_admin: psycopg.Connection[Any], ttl: float | None, locked: bool
) -> None:
    conninfo, schema = _conninfo_and_schema(postgres_schema_url)
    lock_row = f"SELECT pkey FROM {schema}.partitions WHERE pkey = %s FOR UPDATE SKIP LOCKED"
    p = Partition("u", "items", f"rowlock-{uuid.uuid4().hex[:8]}")
    with psycopg.connect(conninfo) as conn:
        b = PostgresBackend(conn, schema=schema, ttl=ttl)
        (rec,) = b.write(p, [make_put("a", b"1")]).records
        conn.commit()
        refused = Put("a", b"2", rec.digest, rec.etag, {}, Mode.IF_MATCH, "stale")  # writes nothing
        result, _ = _in_open_transaction(conn, lambda: b.write(p, [refused]))
        assert result.conflict is not None
        # what the sweep does: skip a row a writer holds
        assert _postgres_admin.execute(lock_row, (p.key,)).fetchall() == ([] if locked else [(p.key,)])
        conn.rollback()
        assert _postgres_admin.execute(lock_row, (p.key,)).fetchall() == [(p.key,)]


def _waiting_for_advisory_lock(admin: psycopg.Connection[Any], pid: int) -> bool:
    sql = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND pid <> %s"
    (count,) = admin.execute(sql, (pid,)).fetchone()  # type: ignore[misc]
    return bool(count)


def test_writers_of_one_partition_queue_on_its_advisory_lock(
    postgres_backend: PostgresBackend, postgres_url: str
) -> None:
    b = postgres_backend
    p = Partition("u", "items", f"queue-{uuid.uuid4().hex[:8]}")
    results: list[Any] = []
    with psycopg.connect(postgres_url) as holder:
        (pid,) = holder.execute("SELECT pg_backend_pid()").fetchone()  # type: ignore[misc]
        holder.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (f"{b.schema}.{p.key}",))
        writer = threading.Thread(target=lambda: results.append(b.write(p, [make_put("a", b"1")])))
        writer.start()
        deadline = time.monotonic() + 30
        while not _waiting_for_advisory_lock(holder, pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _waiting_for_advisory_lock(holder, pid)  # the write waits for the lock's holder
        assert results == [] and writer.is_alive()
        holder.rollback()  # released: the write goes on
        writer.join(30)
    assert len(results) == 1 and results[0].conflict is None
    assert [r.value for r in b.get(p, ["a"]) if r] == [b"1"]


def test_a_version_4_schema_migrates_to_the_advisory_lock(postgres_url: str) -> None:
    """Migrated with writers possibly running: for an hour every writer locks the row as version 4 did."""
    schema = f"cpm_{uuid.uuid4().hex[:10]}"
    p = Partition("u", "items", "v4")
    lock_row = f"SELECT pkey FROM {schema}.partitions WHERE pkey = %s FOR UPDATE SKIP LOCKED"
    try:
        schema_at(postgres_url, schema, 4)
        b = PostgresBackend.from_url(with_query(postgres_url, schema=schema))
        with b:
            b._ready = True  # write through version 4's function first
            old = b.write(p, [make_put("a", b"1", tags={"t": "1"}, mode=Mode.APPEND), make_put("c", b"2")]).records
            assert b.migrate() == 4 and b.migrate() == SCHEMA_VERSION
            assert b.get(p, ["a", "c"]) == old
            assert b.write(p, [make_put("a", b"1", tags={"t": "1"}, mode=Mode.APPEND)]).records == old[:1]
            (new,) = b.write(p, [make_put("n", b"3", tags={"t": "1"}, mode=Mode.APPEND)]).records
            assert new.seq > old[1].seq and [r.name for r in b.list(p, ListQuery(tags={"t": "1"}))] == ["a", "n"]
        conninfo = b.conninfo
        with psycopg.connect(conninfo) as conn, psycopg.connect(conninfo, autocommit=True) as admin:
            given = PostgresBackend(conn, schema=schema)
            noop = [make_put("a", b"1", tags={"t": "1"}, mode=Mode.APPEND)]
            for hour_left, locked in ((True, True), (False, False)):
                if not hour_left:  # the hour after the migration is over
                    admin.execute(f"UPDATE {schema}.row_lock_until SET until = now() - interval '1 second'")
                result, xid = _in_open_transaction(conn, lambda: given.write(p, noop))
                assert result.records == old[:1]
                assert (xid is not None) == locked  # a row lock takes a transaction id
                assert admin.execute(lock_row, (p.key,)).fetchall() == ([] if locked else [(p.key,)])
                conn.rollback()
            assert given.drop(p) == 3 and given.get(p, ["a", "c", "n"]) == [None, None, None]
            conn.commit()
    finally:
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def test_a_schema_created_at_version_5_has_no_hour_of_row_locks(
    postgres_schema_url: str, _postgres_admin: psycopg.Connection[Any]
) -> None:
    _, schema = _conninfo_and_schema(postgres_schema_url)
    (until,) = _postgres_admin.execute(f"SELECT until::text FROM {schema}.row_lock_until").fetchall()
    assert until == ("-infinity",)
