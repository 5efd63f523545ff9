"""The SQLite backend's per-connection read cache (``_ReadCache`` in :mod:`checkpointers.backends.sqlite`).

A read is served again only while ``PRAGMA data_version`` says no other
connection has committed and the partition's expiry has not passed: every
write, delete, drop or prune by this backend's writer, by a second backend on
the file or by another process is seen by the next read, through the backend
and through :class:`SqliteCheckpointer`. Hits are counted in SQL statements
(the trace callback), never timed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.base.id import uuid6

from checkpointers._flows import make_put
from checkpointers._names import Partition
from checkpointers.backends.base import Delete, ListQuery
from checkpointers.backends.ops import GetOp, ListOp
from checkpointers.backends.sqlite import _CACHE_BYTES, _CACHE_ENTRIES, SqliteBackend
from checkpointers.savers import SqliteCheckpointer

P = Partition("alice", "items", "runs/r1")
LATEST = ListQuery(prefix="c/", depth=0, descending=True, limit=1, children=True)
ALL = ListQuery(prefix="c/")
CFG: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}


def _serving(backend: SqliteBackend) -> Any:
    """The connection the backend's next read runs on: the writer's once it wrote (it is free), else a pooled one."""
    return backend._wconn or backend._idle[-1]


def _traced(backend: SqliteBackend) -> list[str]:
    """The statements the backend's reading connection runs from now on."""
    statements: list[str] = []
    _serving(backend).set_trace_callback(statements.append)
    return statements


def _reads_records(statements: list[str]) -> bool:
    return any("FROM records" in s for s in statements)


def _names(records: list[Any]) -> list[str]:
    return [r.name for r in records]


@pytest.fixture
def backend(tmp_path: Path) -> Any:
    with SqliteBackend(tmp_path / "c.db") as b:
        yield b


def test_a_repeated_read_is_served_without_reading_records_and_a_write_ends_that(backend: SqliteBackend) -> None:
    backend.write(P, [make_put("c/1", b"one"), make_put("c/1/w", b"w")])
    first = backend.list(P, LATEST)
    statements = _traced(backend)
    assert backend.list(P, LATEST) == first  # the first hit of a version also looks up the partition's expiry
    assert not _reads_records(statements) and any("expires_at" in s for s in statements), statements
    statements.clear()
    assert backend.list(P, LATEST) == first
    assert statements == ["PRAGMA data_version"], statements  # the hit: no records read
    backend.write(P, [make_put("c/2", b"two")])  # this partition's entries are forgotten
    statements.clear()
    assert _names(backend.list(P, LATEST)) == ["c/2"]
    assert _reads_records(statements), statements


def test_the_same_query_in_another_partition_is_not_served_from_the_cache(backend: SqliteBackend) -> None:
    other = Partition("bob", "items", "runs/r1")
    backend.write(P, [make_put("c/1", b"alice")])
    backend.write(other, [make_put("c/1", b"bob")])
    for _ in range(2):
        assert [r.value for r in backend.list(P, ALL)] == [b"alice"]
        assert [r.value for r in backend.list(other, ALL)] == [b"bob"]
        assert backend.get(other, ["c/1"])[0].value == b"bob"  # type: ignore[union-attr]
        assert backend.get(P, ["c/1"])[0].value == b"alice"  # type: ignore[union-attr]
        assert backend.many([GetOp(other, ["c/1"]), ListOp(other, ALL)])[0][0].value == b"bob"
        assert backend.many([GetOp(P, ["c/1"]), ListOp(P, ALL)])[0][0].value == b"alice"


def test_writes_deletes_and_drops_of_a_second_backend_on_the_file_are_seen(tmp_path: Path) -> None:
    with SqliteBackend(tmp_path / "c.db") as mine, SqliteBackend(tmp_path / "c.db") as theirs:
        mine.write(P, [make_put("c/1", b"one"), make_put("c/2", b"two")])
        assert _names(mine.list(P, ALL)) == ["c/1", "c/2"]
        assert _names(mine.list(P, ALL)) == ["c/1", "c/2"]  # cached now
        theirs.write(P, [make_put("c/1", b"changed")])
        assert [r.value for r in mine.list(P, ALL)] == [b"changed", b"two"]
        assert mine.get(P, ["c/1"])[0].value == b"changed"  # type: ignore[union-attr]
        theirs.write(P, [], [Delete("c/2")])
        assert _names(mine.list(P, ALL)) == ["c/1"]
        assert mine.get(P, ["c/2"]) == [None]
        theirs.drop(P)
        assert mine.list(P, ALL) == [] and mine.get(P, ["c/1"]) == [None]


def test_another_process_writing_and_dropping_is_seen(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    script = (
        "import sys\n"
        "from checkpointers._flows import make_put\n"
        "from checkpointers._names import Partition\n"
        "from checkpointers.backends.sqlite import SqliteBackend\n"
        "p = Partition('alice', 'items', 'runs/r1')\n"
        "with SqliteBackend(sys.argv[1]) as b:\n"
        "    b.drop(p) if sys.argv[2] == 'drop' else b.write(p, [make_put('c/9', b'nine')])\n"
    )
    with SqliteBackend(path) as backend:
        backend.write(P, [make_put("c/1", b"one")])
        for _ in range(2):
            assert _names(backend.list(P, LATEST)) == ["c/1"]
        for action, expected in (("put", ["c/9"]), ("drop", [])):
            done = subprocess.run([sys.executable, "-c", script, str(path), action], capture_output=True, timeout=60)
            assert done.returncode == 0, done.stderr
            assert _names(backend.list(P, LATEST)) == expected


def test_a_cached_read_is_not_served_past_its_partitions_expiry(tmp_path: Path) -> None:
    now = [1000.0]
    with SqliteBackend(tmp_path / "c.db", ttl=60, clock=lambda: now[0]) as backend:
        backend.write(P, [make_put("c/1", b"one")])
        assert _names(backend.list(P, ALL)) == ["c/1"]
        now[0] += 30
        statements = _traced(backend)
        assert _names(backend.list(P, ALL)) == ["c/1"]  # before the expiry: a hit
        assert not _reads_records(statements), statements
        now[0] += 31  # past it: nothing committed, only the clock moved
        assert backend.list(P, ALL) == [] and backend.get(P, ["c/1"]) == [None]
        assert backend.list(P, ALL) == []
        now[0] -= 31  # a clock set back: the partition reads as live again, its empty reads are not served
        assert _names(backend.list(P, ALL)) == ["c/1"] and backend.get(P, ["c/1"])[0] is not None


def test_two_reads_never_share_a_mutable_object(backend: SqliteBackend) -> None:
    backend.write(P, [make_put("c/1", b"one", tags={"k": "v"}), make_put("c/1/w", b"w")])
    for read in (lambda: backend.list(P, LATEST), lambda: backend.get(P, ["c/1", "c/1/w"]),
                 lambda: backend.many([GetOp(P, ["c/1"]), ListOp(P, ALL)])[1]):
        first, second, third = read(), read(), read()  # a miss, then two hits
        assert first == second == third
        for one, two in ((first, second), (second, third)):
            assert one is not two
            assert all(a is not b and a.tags is not b.tags for a, b in zip(one, two, strict=True))
        for got in (first, second):
            got[0].tags["k"] = "mutated"  # type: ignore[index]
            got.append(None)
            again = read()
            assert again == third and again[0].tags == {"k": "v"}


def test_the_cache_stays_within_its_bounds(backend: SqliteBackend) -> None:
    backend.write(P, [make_put(f"c/{i:03d}", bytes(20_000)) for i in range(60)])
    for i in range(2 * _CACHE_ENTRIES):  # distinct listings: without values (small), with (up to 1.2 MB)
        backend.list(P, ListQuery(prefix="c/", limit=1 + i, values=False))
        backend.list(P, ListQuery(prefix="c/", limit=1 + i % 60))
        cache = _serving(backend).read_cache
        assert len(cache.entries) <= _CACHE_ENTRIES and cache.size <= _CACHE_BYTES
    assert len(cache.entries) > 1 and cache.size > _CACHE_BYTES // 2  # it was used, up to its bounds


def test_the_saver_sees_its_own_puts_prunes_and_deletes(tmp_path: Path) -> None:
    with SqliteCheckpointer(tmp_path / "s.db") as saver:
        ids = []
        config = CFG
        for step in range(3):
            checkpoint: Any = empty_checkpoint()
            checkpoint["id"] = str(uuid6())
            ids.append(checkpoint["id"])
            config = saver.put(config, checkpoint, {"source": "loop", "step": step}, {})
            for _ in range(2):  # polled: the second is a hit
                got = saver.get_tuple(CFG)
                assert got is not None and got.checkpoint["id"] == checkpoint["id"]
            assert [t.checkpoint["id"] for t in saver.list(CFG)] == ids[::-1]
        saver.put_writes(config, [("a", 1)], "task")
        got = saver.get_tuple(CFG)
        assert got is not None and [w[1] for w in got.pending_writes or []] == ["a"]
        saver.prune(["t"])
        assert [t.checkpoint["id"] for t in saver.list(CFG)] == ids[-1:]
        saver.delete_thread("t")
        assert saver.get_tuple(CFG) is None and list(saver.list(CFG)) == []


def test_a_second_saver_on_the_file_sees_the_other_ones_put(tmp_path: Path) -> None:
    with SqliteCheckpointer(tmp_path / "s.db") as mine, SqliteCheckpointer(tmp_path / "s.db") as theirs:
        for saver in (theirs, theirs):
            checkpoint: Any = empty_checkpoint()
            checkpoint["id"] = str(uuid6())
            saver.put(CFG, checkpoint, {"source": "loop", "step": 1}, {})
            for _ in range(2):
                got = mine.get_tuple(CFG)
                assert got is not None and got.checkpoint["id"] == checkpoint["id"]
        theirs.delete_thread("t")
        assert mine.get_tuple(CFG) is None
