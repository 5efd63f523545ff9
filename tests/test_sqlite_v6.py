"""SQLite schema v6: integer partition ids. A v5 file migrates in place and reads back the same; bytes per put."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest

from checkpointers._flows import make_put
from checkpointers._names import Partition
from checkpointers.backends.base import Delete, ListQuery, Put, Record, tags_json
from checkpointers.backends.sqlite import (
    MIGRATIONS,
    SqliteBackend,
    _blob,
    _pack_digest,
    _pack_etag,
    _text,
)

ALICE = Partition("alice", "items", "runs/r1")
ALICE2 = Partition("alice", "items", "runs/r2")
BOB = Partition("bob", "items", "bobs")
ORPHAN = Partition("carol", "items", "lost")  # records without a partitions row (no release writes these)
NOW = 1_000_000.0


def _v5_rows(conn: sqlite3.Connection, partition: Partition, puts: list[Put], first_seq: int) -> list[Record]:
    """Insert ``puts`` the way the v5 release wrote them; the records they are."""
    out = []
    for seq, put in enumerate(puts, first_seq):
        conn.execute(
            "INSERT INTO records (pkey, name, seq, etag, digest, tags, value) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (partition.key, put.name, seq, _pack_etag(put.etag), _pack_digest(put.digest), tags_json(put.tags),
             put.value),
        )
        conn.executemany(
            "INSERT INTO tags (pkey, k, v, name, seq) VALUES (?, ?, ?, ?, ?)",
            [(partition.key, _text(k), _text(v), put.name, seq) for k, v in put.tags.items()],
        )
        out.append(Record(put.name, put.value, dict(put.tags), put.etag, put.digest, seq))
    return out


def _v5_file(path: Path) -> dict[Partition, list[Record]]:
    """A file at schema version 5 with rows as v5 wrote them: three partitions (one expiring), an orphan."""
    seal = "ab" * 32 + ".u" + "cd" * 16
    contents = {
        ALICE: [
            make_put("c/a", b"1" * 50, tags={"m.source": '"loop"', "m.step": "0", "é\ud800": "x"}),
            make_put("c/a/w", b"writes"),
            make_put("c/b", b"2" * 50, tags={"m.source": '"loop"', "m.step": "1"}),
            Put("plain", b"text-etag", seal, "not-hex-etag", {"k": "v"}),  # text etag, packed sealed digest
        ],
        ALICE2: [make_put("c/a", b"other", tags={"m.source": '"input"'})],
        BOB: [make_put("c/a", b"bob", tags={"m.source": '"loop"'})],
        ORPHAN: [make_put("x", b"orphan", tags={"t": "1"})],
    }
    records: dict[Partition, list[Record]] = {}
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        for v in range(6):
            for statement in MIGRATIONS[v].split(";"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute("INSERT INTO schema_migrations (v) VALUES (?)", (v,))
        seq = 1
        for partition, puts in contents.items():
            records[partition] = _v5_rows(conn, partition, puts, seq)
            seq += len(puts) + 3  # gaps, as deletes leave
            if partition is not ORPHAN:
                conn.execute(
                    "INSERT INTO partitions (pkey, user_key, name, expires_at) VALUES (?, ?, ?, ?)",
                    (partition.key, partition.user_key, _blob(partition.name), NOW + 60 if partition is BOB else None),
                )
        conn.execute("UPDATE seq_counter SET seq = 100 WHERE id = 0")
    return records


QUERIES = [
    ListQuery(),
    ListQuery(values=False),
    ListQuery(order="seq", descending=True, limit=2),
    ListQuery(prefix="c/", depth=0, descending=True, limit=1, children=True),
    ListQuery(tags={"m.source": '"loop"'}),
    ListQuery(tags={"m.source": '"loop"'}, order="seq", descending=True, limit=1),
    ListQuery(tags={"é\ud800": "x", "m.step": "0"}),
    ListQuery(tags={"k": "v"}, order="seq"),
    ListQuery(tags={"t": "1"}),
]


def _reads(backend: SqliteBackend, partition: Partition) -> list[Any]:
    names = ["c/a", "c/a/w", "c/b", "plain", "x", "missing"]
    return [backend.get(partition, names)] + [backend.list(partition, q) for q in QUERIES]


def _expected(records: list[Record], partition: Partition, scratch: Path) -> list[Any]:
    """What the reads give on a fresh v6 file holding ``records`` (written in seq order), with their own seqs."""
    seqs = {r.name: r.seq for r in records}
    with SqliteBackend(scratch) as fresh:
        for r in sorted(records, key=lambda r: r.seq):
            fresh.write(partition, [Put(r.name, r.value, r.digest, r.etag, dict(r.tags))])
        got = _reads(fresh, partition)

    def own_seq(item: Any) -> Any:
        if isinstance(item, list):
            return [own_seq(i) for i in item]
        if isinstance(item, Record):
            return Record(item.name, item.value, item.tags, item.etag, item.digest, seqs[item.name])
        return item

    return own_seq(got)


def test_a_v5_file_migrates_in_place_and_reads_back_identically(tmp_path: Path) -> None:
    path = tmp_path / "v5.db"
    records = _v5_file(path)
    with SqliteBackend(path, clock=lambda: NOW) as backend:
        for partition, recs in records.items():
            want = _expected(recs, partition, tmp_path / f"fresh-{partition.user}-{len(recs)}.db")
            assert _reads(backend, partition) == want, partition
        # the partitions listing, users and expiries as v5 had them (the orphan belongs to nobody)
        assert backend.partitions("alice", "items") == ["runs/r1", "runs/r2"]
        assert backend.partitions("bob", "items") == ["bobs"]
        assert backend.partitions("carol", "items") == []
        assert backend.users() == ["alice", "bob"]
        assert backend.expiry(BOB) == NOW + 60 and backend.expiry(ALICE) is None
        # writing goes on: seqs above seq_counter, a new partition gets an id no row carries
        (new,) = backend.write(ALICE, [make_put("c/c", b"3")]).records
        assert new.seq == 101
        carla = Partition("carla", "items", "fresh")
        backend.write(carla, [make_put("c/a", b"carla")])
        assert [r.value for r in backend.list(carla, ListQuery())] == [b"carla"]
        assert [r.value for r in backend.list(ALICE2, ListQuery())] == [b"other"]
        # a delete of the last record removes the partition's row, as before
        backend.write(ALICE2, [], [Delete("c/a")])
        assert backend.partitions("alice", "items") == ["runs/r1"]
    with contextlib.closing(sqlite3.connect(path)) as conn:
        versions = [v for (v,) in conn.execute("SELECT v FROM schema_migrations ORDER BY v")]
        assert versions == list(range(len(MIGRATIONS)))
        ids = [i for (i,) in conn.execute("SELECT id FROM partitions ORDER BY id")]
        assert ids == [1, 3, 4, 5]  # alice r1, (r2 went), bob, carol's orphan row, carla: never reused
        (pids,) = conn.execute("SELECT pids FROM seq_counter").fetchone()
        assert pids == max(ids)
        orphans = conn.execute("SELECT COUNT(*) FROM records WHERE pid NOT IN (SELECT id FROM partitions)").fetchone()
        assert orphans == (0,)


def test_processes_opening_a_v5_file_at_once_migrate_it_once(tmp_path: Path) -> None:
    path = tmp_path / "v5.db"
    records = _v5_file(path)
    start = threading.Barrier(4)
    errors: list[BaseException] = []
    got: list[list[Record | None]] = []

    def open_and_read() -> None:
        try:
            start.wait()
            with SqliteBackend(path, clock=lambda: NOW) as backend:  # a connection of its own, as a process has
                got.append(backend.get(ALICE, ["c/a", "c/b"]))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=open_and_read) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    want = [r for r in records[ALICE] if r.name in ("c/a", "c/b")]
    assert got == [want] * 4
    with contextlib.closing(sqlite3.connect(path)) as conn:
        assert conn.execute("SELECT COUNT(*) FROM records").fetchone() == (sum(len(r) for r in records.values()),)


def _shape_bytes(path: Path, puts: int) -> tuple[int, dict[str, int]]:
    """File + WAL bytes after ``puts`` puts of the benchmark's 3 x 1 KB shape (put_writes of 2), and dbstat by name."""
    pytest.importorskip("langgraph")
    from benchmarks.shape import ShapeThread
    from checkpointers._flows import run
    from checkpointers.savers import Checkpointer

    saver = Checkpointer(SqliteBackend(path))
    try:
        run(ShapeThread("bytes").puts(saver, puts), saver)
    finally:
        saver.close()
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        stat = dict(conn.execute("SELECT name, SUM(pgsize) FROM dbstat GROUP BY name").fetchall())
    total = sum(p.stat().st_size for p in (path, Path(f"{path}-wal")) if p.exists())
    return total, stat


def test_bytes_at_rest_per_put_of_the_benchmark_shape_stay_bounded(tmp_path: Path) -> None:
    """200 puts of 3 x 1 KB: 236 pages (4,833 B/put) with v6, 244 (4,997) with the text key in every row.

    A checkpoint and its writes fill one page of ``records``; the rest is
    the indexes and tag rows, where the partition key was repeated.
    """
    total, stat = _shape_bytes(tmp_path / "s.db", 200)
    assert total <= 236 * 4096, (total / 200, stat)
    assert stat["records"] <= 202 * 4096, stat
    assert stat["tags"] + stat["tags_seq"] + stat["sqlite_autoindex_records_1"] + stat["records_seq"] <= 28 * 4096, stat
