"""The SQLite backend reads on its writer connection while no write holds it, and that connection's
read cache survives its own puts in other partitions.

Counted in SQL statements (the trace callback) and checked by results, never timed: a read right
after this backend's put runs on the connection that wrote (its page cache is still warm), a put in
partition Q leaves the cached reads of partition P served, and anything another connection commits
still empties the cache before the next read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from checkpointers._flows import make_put
from checkpointers._names import Partition
from checkpointers.backends.base import Delete, ListQuery, Mode
from checkpointers.backends.ops import GetOp, ListOp
from checkpointers.backends.sqlite import SqliteBackend
from tests.test_sqlite_read_cache import _reads_records, backend

__all__ = ["backend"]  # the fixture, shared with test_sqlite_read_cache

P = Partition("alice", "items", "runs/r1")
Q = Partition("alice", "items", "runs/r2")
ALL = ListQuery(prefix="c/")


def _trace(conn: Any) -> list[str]:
    statements: list[str] = []
    conn.set_trace_callback(statements.append)
    return statements


def _values(records: list[Any]) -> list[bytes]:
    return [r.value for r in records]


def test_a_read_after_a_put_runs_on_the_writer_connection(backend: SqliteBackend) -> None:
    backend.write(P, [make_put("c/1", b"one")])
    writer, pooled = backend._wconn, backend._idle[-1]
    assert writer is not None and writer is not pooled
    on_writer, on_pool = _trace(writer), _trace(pooled)
    assert _values(backend.list(P, ALL)) == [b"one"]
    assert backend.get(P, ["c/1"])[0].value == b"one"  # type: ignore[union-attr]
    assert _reads_records(on_writer) and on_pool == []


def test_a_read_while_a_write_holds_the_writer_runs_on_the_pool(backend: SqliteBackend) -> None:
    backend.write(P, [make_put("c/1", b"one")])
    writer, pooled = backend._wconn, backend._idle[-1]
    on_writer, on_pool = _trace(writer), _trace(pooled)
    with backend._writer:  # a write in flight on another thread: the read does not wait for it
        assert _values(backend.list(P, ALL)) == [b"one"]
    assert on_writer == [] and _reads_records(on_pool)


def test_a_put_in_another_partition_keeps_this_partitions_reads_cached(backend: SqliteBackend) -> None:
    backend.write(P, [make_put("c/1", b"one")])
    backend.write(Q, [make_put("c/1", b"q1")])
    for _ in range(2):  # a miss, then cached
        assert _values(backend.list(P, ALL)) == [b"one"]
        assert _values(backend.many([GetOp(P, ["c/1"]), ListOp(P, ALL)])[1]) == [b"one"]
    assert _values(backend.list(Q, ALL)) == [b"q1"]
    backend.write(Q, [make_put("c/2", b"q2")])
    statements = _trace(backend._wconn)
    assert _values(backend.list(P, ALL)) == [b"one"]
    assert _values(backend.many([GetOp(P, ["c/1"]), ListOp(P, ALL)])[1]) == [b"one"]
    assert not _reads_records(statements), statements  # served: Q's put cannot change P's reads
    assert _values(backend.list(Q, ALL)) == [b"q1", b"q2"]  # the partition written is read again
    assert _reads_records(statements)
    backend.write(P, [make_put("c/2", b"two")])
    assert _values(backend.list(P, ALL)) == [b"one", b"two"]


def test_a_delete_empties_the_whole_cache(backend: SqliteBackend) -> None:
    backend.write(P, [make_put("c/1", b"one")])
    backend.write(Q, [make_put("c/1", b"q1")])
    for _ in range(2):
        assert _values(backend.list(P, ALL)) == [b"one"]
    backend.write(Q, [], [Delete("c/1")])  # raises the shared seq counter: nothing is kept
    statements = _trace(backend._wconn)
    assert _values(backend.list(P, ALL)) == [b"one"]
    assert _reads_records(statements)
    assert backend.list(Q, ALL) == []


def test_another_backends_commit_before_our_put_still_empties_the_cache(tmp_path: Path) -> None:
    with SqliteBackend(tmp_path / "c.db") as mine, SqliteBackend(tmp_path / "c.db") as theirs:
        mine.write(P, [make_put("c/1", b"one")])
        mine.write(Q, [make_put("c/1", b"q1")])
        for _ in range(2):
            assert _values(mine.list(P, ALL)) == [b"one"]
        theirs.write(P, [make_put("c/1", b"changed")])
        mine.write(Q, [make_put("c/2", b"q2")])  # our own put after theirs: their commit is not forgotten
        assert _values(mine.list(P, ALL)) == [b"changed"]
        assert mine.get(P, ["c/1"])[0].value == b"changed"  # type: ignore[union-attr]
        theirs.drop(P)
        mine.write(Q, [make_put("c/3", b"q3")])
        assert mine.list(P, ALL) == [] and mine.get(P, ["c/1"]) == [None]


def test_a_put_after_a_refused_batch_does_not_serve_what_was_cached_before_it(backend: SqliteBackend) -> None:
    backend.write(P, [make_put("c/1", b"one")])
    for _ in range(2):
        assert _values(backend.list(P, ALL)) == [b"one"]
    refused = backend.write(P, [make_put("c/1", b"refused", mode=Mode.IF_MATCH, if_match="0" * 32)])
    assert refused.conflict is not None
    backend.write(Q, [make_put("c/1", b"q1")])
    assert _values(backend.list(P, ALL)) == [b"one"]
    assert _values(backend.list(Q, ALL)) == [b"q1"]


def test_a_put_after_a_delete_does_not_bring_back_what_the_delete_emptied(backend: SqliteBackend) -> None:
    backend.write(P, [make_put("c/1", b"one"), make_put("c/2", b"two")])
    for _ in range(2):
        assert _values(backend.list(P, ALL)) == [b"one", b"two"]
        assert backend.get(P, ["c/2"])[0].value == b"two"  # type: ignore[union-attr]
    backend.write(P, [], [Delete("c/2")])  # the cache is not current after it: the next put must not make it so
    backend.write(Q, [make_put("c/1", b"q1")])
    assert _values(backend.list(P, ALL)) == [b"one"]
    assert backend.get(P, ["c/2"]) == [None]
