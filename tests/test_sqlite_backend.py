"""SQLite-specific checks, on real files in ``tmp_path``.

The shared contract runs against SQLite through the ``backend`` fixture; this
file checks what only SQLite has: several processes on one file, ``kill -9``
mid-batch, schema migrations, bytes altered on disk (each column of a row, the
tag index and the partitions table damaged, on every read path, sync and
async), disk space and WAL size after large deletes, driver-error
translation, literal prefixes with ``%``/``_``, the tag indexes (and their
migration), and the sync/async faces sharing a file across event loops.
"""

from __future__ import annotations

import asyncio
import gc
import json
import multiprocessing
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from checkpointers import Store
from checkpointers._flows import make_put
from checkpointers._names import Partition
from checkpointers.backends import open_backend
from checkpointers.backends.base import Delete, ListQuery, Mode
from checkpointers.backends.memory import MemoryBackend
from checkpointers.backends.ops import GetOp, ListOp
from checkpointers.backends.sqlite import (
    MIGRATIONS,
    SqliteBackend,
    _list_sql,
    _retrying,
    translate_errors,
)
from checkpointers.errors import BackendUnavailableError, CheckpointerError, CorruptItemError

SPAWN = multiprocessing.get_context("spawn")
P = Partition("alice", "items", "runs/r1")


def _versions(path: Path) -> list[int]:
    with sqlite3.connect(path) as conn:
        return [v for (v,) in conn.execute("SELECT v FROM schema_migrations ORDER BY v")]


def _worker_threads() -> list[threading.Thread]:
    """The async worker threads of SQLite backends (``Offload``) alive now."""
    return [t for t in threading.enumerate() if t.name == "checkpointers-sqlite"]


def _in_threads(fn: Any, count: int) -> list[BaseException]:
    """Run ``fn(i)`` for ``i`` in ``range(count)``, each in its own thread; return the errors."""
    errors: list[BaseException] = []

    def guarded(i: int) -> None:
        try:
            fn(i)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def _wait_until(predicate: Any, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return bool(predicate())


# -- 1. several processes append to one (fresh) file at once -----------------------

APPENDS_PER_PROCESS = 120


def _append_worker(path: str, worker: int, barrier: Any, results: Any) -> None:
    """Child: open the file when every sibling does, append, report the seqs."""
    try:
        barrier.wait(timeout=120)
        backend = SqliteBackend(path)  # several processes migrate a fresh file at once

        def put(n: int) -> Any:
            return make_put(
                f"w{worker}/{n:04d}", f"{worker}:{n}".encode(), tags={"w": str(worker)}, mode=Mode.CREATE
            )

        if worker % 2:  # half the processes go through the async face
            async def run() -> list[int]:
                seqs = []
                for n in range(APPENDS_PER_PROCESS):
                    result = await backend.awrite(P, [put(n)])
                    assert result.conflict is None, result.conflict
                    seqs.append(result.records[0].seq)
                await backend.aclose()
                return seqs

            seqs = asyncio.run(run())
        else:
            seqs = []
            for n in range(APPENDS_PER_PROCESS):
                result = backend.write(P, [put(n)])
                assert result.conflict is None, result.conflict
                seqs.append(result.records[0].seq)
            backend.close()
        results.put((worker, seqs, None))
    except BaseException as exc:  # reported to the parent, which fails the test
        results.put((worker, [], repr(exc)))


def test_processes_append_concurrently_without_lost_writes(tmp_path: Path) -> None:
    path = str(tmp_path / "shared.db")
    workers = 4
    barrier = SPAWN.Barrier(workers)
    results = SPAWN.Queue()
    procs = [
        SPAWN.Process(target=_append_worker, args=(path, w, barrier, results)) for w in range(workers)
    ]
    for p in procs:
        p.start()
    reports = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert [err for _, _, err in reports if err] == []

    all_seqs: list[int] = []
    for _, seqs, _ in reports:
        assert len(seqs) == APPENDS_PER_PROCESS
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)  # increasing in write order
        all_seqs += seqs
    assert len(set(all_seqs)) == workers * APPENDS_PER_PROCESS  # unique across processes

    with SqliteBackend(path) as backend:
        stored = backend.list(P, ListQuery(order="seq"))
        assert len(stored) == workers * APPENDS_PER_PROCESS
        assert sorted(r.seq for r in stored) == sorted(all_seqs)
        for w in range(workers):
            mine = backend.list(P, ListQuery(tags={"w": str(w)}, order="seq"))
            assert [r.name for r in mine] == [f"w{w}/{n:04d}" for n in range(APPENDS_PER_PROCESS)]
    assert _versions(Path(path)) == list(range(len(MIGRATIONS)))  # migrated exactly once


# -- 2. kill -9 in the middle of multi-record batches ----------------------------------

BATCH_RECORDS = 20


def _batch_worker(path: str, first: int, committed: Any) -> None:
    """Child: write batches forever; ``committed`` is the last acknowledged batch id."""
    backend = SqliteBackend(path)
    batch = first
    while True:
        puts = [
            make_put(f"b{batch:07d}/r{j:02d}", os.urandom(4096), tags={"batch": str(batch)})
            for j in range(BATCH_RECORDS)
        ]
        head = make_put("head", str(batch).encode())
        doomed = [Delete(f"b{batch - 1:07d}/r00")] if batch > first else []
        assert backend.write(P, [*puts, head], doomed).conflict is None
        committed.value = batch
        batch += 1


def test_kill_9_mid_batch_leaves_whole_batches(tmp_path: Path) -> None:
    path = str(tmp_path / "crash.db")
    acknowledged: list[tuple[int, int]] = []  # (first, last acknowledged) per round
    for round_ in range(3):
        first = round_ * 1_000_000
        committed = SPAWN.Value("q", -1)
        child = SPAWN.Process(target=_batch_worker, args=(path, first, committed))
        child.start()
        assert _wait_until(lambda c=committed, f=first: c.value >= f + 5, 60), "child never committed"
        time.sleep(0.05 + 0.1 * round_)  # land somewhere inside a later batch
        os.kill(child.pid, signal.SIGKILL)  # type: ignore[arg-type]
        child.join(timeout=30)
        assert child.exitcode == -signal.SIGKILL
        acknowledged.append((first, committed.value))

    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    with SqliteBackend(path) as backend:
        records = backend.list(P, ListQuery(values=False))
        sizes = Counter(r.tags["batch"] for r in records if "batch" in r.tags)
        head = int(backend.get(P, ["head"])[0].value)  # type: ignore[union-attr]
    for first, last in acknowledged:
        for batch in range(first, last + 1):
            # every acknowledged batch is there, whole (its r00 deleted by the next batch)
            expected = {BATCH_RECORDS, BATCH_RECORDS - 1}
            assert sizes.get(str(batch)) in expected, (batch, sizes.get(str(batch)))
    for batch, size in sizes.items():
        following = str(int(batch) + 1)
        # all or nothing: a batch has all its records, minus r00 only if the next one committed
        assert size == (BATCH_RECORDS - 1 if following in sizes else BATCH_RECORDS), batch
    last_round_first, last_round_ack = acknowledged[-1]
    assert head >= last_round_ack and str(head) in sizes  # "head" moved with its batch


# -- 3. schema migrations ---------------------------------------------------------------


def test_older_file_is_migrated_on_open(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as conn:  # a file left at schema version 0
        conn.execute(MIGRATIONS[0])
        conn.execute("INSERT INTO schema_migrations (v) VALUES (0)")
    assert _versions(path) == [0]
    with SqliteBackend(path) as backend:
        backend.write(P, [make_put("a", b"1")])
    assert _versions(path) == list(range(len(MIGRATIONS)))
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        tables = {n for (n,) in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"records", "tags", "partitions", "seq_counter", "schema_migrations"} <= tables


def test_v1_file_gets_tag_seqs_backfilled(tmp_path: Path) -> None:
    path = tmp_path / "v1.db"
    puts = [make_put(f"n{i}", b"v%d" % i, tags={"wf": "w" if i % 2 else "o"}) for i in range(6)]
    seqs = [6 - i for i in range(6)]  # seq order is the reverse of name order
    with sqlite3.connect(path) as conn:  # a file left at schema version 1, with tagged records
        for v in (0, 1):
            conn.executescript(MIGRATIONS[v])
            conn.execute("INSERT INTO schema_migrations (v) VALUES (?)", (v,))
        conn.executemany(
            "INSERT INTO records VALUES (?, ?, ?, ?, ?, ?, ?)",
            [
                (P.key, p.name, s, p.etag, p.digest, json.dumps(p.tags), p.value)
                for p, s in zip(puts, seqs, strict=False)
            ],
        )
        conn.executemany(
            "INSERT INTO tags VALUES (?, ?, ?, ?)",
            [(P.key, p.name, json.dumps("wf"), json.dumps(p.tags["wf"])) for p in puts],
        )
        conn.execute("UPDATE seq_counter SET seq = 6")
    with SqliteBackend(path) as backend:
        newest = ListQuery(tags={"wf": "w"}, order="seq", descending=True, limit=2)
        assert [r.name for r in backend.list(P, newest)] == ["n1", "n3"]
        backend.write(P, [make_put("n5", b"again", tags={"wf": "w"})])
        assert [r.name for r in backend.list(P, newest)] == ["n5", "n1"]
    assert _versions(path) == list(range(len(MIGRATIONS)))
    with sqlite3.connect(path) as conn:
        stale = conn.execute(
            "SELECT COUNT(*) FROM tags AS t JOIN records AS r ON r.pid = t.pid AND r.name = t.name "
            "WHERE t.seq != r.seq"
        ).fetchone()
    assert stale == (0,)


def test_reopening_is_idempotent_and_keeps_data(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    with SqliteBackend(path) as backend:
        first = backend.write(P, [make_put("a", b"1")]).records[0]
    for _ in range(2):
        with SqliteBackend(path) as backend:
            assert backend.get(P, ["a"]) == [first]
            later = backend.write(P, [make_put("b", b"2")]).records[0]
            assert later.seq > first.seq
    assert _versions(path) == list(range(len(MIGRATIONS)))


def test_threads_opening_a_fresh_file_at_once_migrate_it_once(tmp_path: Path) -> None:
    path = tmp_path / "fresh.db"
    start = threading.Barrier(6)

    def open_and_write(i: int) -> None:
        start.wait()
        with SqliteBackend(path) as backend:
            backend.write(P, [make_put(f"t{i}", b"x")])

    assert _in_threads(open_and_write, 6) == []
    assert _versions(path) == list(range(len(MIGRATIONS)))
    with SqliteBackend(path) as backend:
        assert len(backend.list(P, ListQuery())) == 6


def test_file_from_a_newer_release_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "future.db"
    SqliteBackend(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute("INSERT INTO schema_migrations (v) VALUES (?)", (len(MIGRATIONS) + 5,))
    with pytest.raises(CheckpointerError, match="newer than this release") as info:
        SqliteBackend(path)
    assert not isinstance(info.value, BackendUnavailableError)  # upgrading helps, retrying does not


# -- 4. bytes altered on disk -------------------------------------------------------------


def test_bytes_altered_on_disk_raise_corrupt_item(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    with SqliteBackend(path) as backend:
        store = Store(backend).for_user("alice")
        store.set_item("runs/r1", "plan", {"steps": [1, 2, 3]})
        store.set_item("runs/r1", "other", {"fine": True})
        with sqlite3.connect(path) as conn:
            (value,) = conn.execute("SELECT value FROM records WHERE name LIKE 'i/_plan'").fetchone()
            damaged = value.replace(b"2", b"7")
            assert damaged != value
            conn.execute("UPDATE records SET value = ? WHERE name = 'i/_plan'", (damaged,))
        with pytest.raises(CorruptItemError, match="plan"):
            store.get_item("runs/r1", "plan")
        with pytest.raises(CorruptItemError):
            store.list_items("runs/r1")
        assert store.get_item("runs/r1", "other").value == {"fine": True}  # type: ignore[union-attr]

        async def read_async() -> None:
            with pytest.raises(CorruptItemError):
                await store.aget_item("runs/r1", "plan")

        asyncio.run(read_async())


# -- 4b. every column of a row damaged, on every read path ----------------------------------

#: Records of ``P`` the damage tests start from: a tagged record with a child, and others.
DAMAGE_SEED = [("a", {"kind": "plan"}), ("a/w", {}), ("b", {"kind": "plan"}), ("c", {})]


def _loosen(conn: sqlite3.Connection) -> None:
    """Rebuild ``records`` without NOT NULL or column types: a hand-edited or crafted file.

    The schema's constraints and type affinities keep some damage out (an
    integer etag becomes text, NULL is refused); a file is not bound to them.
    """
    conn.executescript(
        """
        ALTER TABLE records RENAME TO records_old;
        CREATE TABLE records (pid, name, seq, etag, digest, tags, value, PRIMARY KEY (pid, name));
        INSERT INTO records (rowid, pid, name, seq, etag, digest, tags, value) SELECT rowid, * FROM records_old;
        DROP TABLE records_old;
        CREATE INDEX records_seq ON records (pid, seq);
        """
    )


#: (id, SQL assignment damaging one column of one record, needs _loosen). ``{name}`` is the record.
COLUMN_DAMAGE = [
    ("tags-not-json", "tags = '{not json'", False),
    ("tags-a-list", "tags = '[1,2]'", False),
    ("tags-non-string-value", "tags = '{\"kind\":1}'", False),
    ("tags-null-json", "tags = 'null'", False),
    ("tags-a-json-string", "tags = '\"kind\"'", False),
    ("tags-a-blob", "tags = CAST('{}' AS BLOB)", False),
    ("tags-bad-utf8-blob", "tags = x'7bff7d'", False),
    ("tags-null", "tags = NULL", True),
    ("seq-text", "seq = 'notanint'", False),
    ("seq-real", "seq = 1.5", False),
    ("seq-blob", "seq = x'00'", False),
    ("seq-null", "seq = NULL", True),
    ("etag-blob", "etag = x'00'", False),
    ("etag-null", "etag = NULL", True),
    ("etag-int", "etag = 7", True),
    ("digest-blob", "digest = x'00'", False),
    ("digest-null", "digest = NULL", True),
    ("digest-int", "digest = 7", True),
    ("value-null", "value = NULL", True),
    ("value-int", "value = 5", False),  # bytes(5) would be five zero bytes
    ("value-text", "value = 'text'", False),
    ("name-blob", "name = CAST(name AS BLOB)", False),
    ("name-null", "name = NULL", True),
]


def _damaged_backend(path: Path, damage: str, loose: bool, target: str = "a") -> SqliteBackend:
    backend = SqliteBackend(path)
    backend.write(P, [make_put(n, n.encode() * 10, tags=t) for n, t in DAMAGE_SEED])
    with sqlite3.connect(path) as conn:
        if loose:
            _loosen(conn)
        assert conn.execute(f"UPDATE records SET {damage} WHERE name = ?", (target,)).rowcount == 1
    conn.close()
    return backend


#: Every read of ``P`` that meets record "a": (label, query or names). Children listings pick
#: "a" (depth 0, the root's children) or reach it as a child (picks at depth 1 are none here,
#: so "a/w" is damaged in its own cases below).
def _reads(backend: SqliteBackend) -> list[tuple[str, Any]]:
    q = ListQuery
    return [
        ("get", lambda: backend.get(P, ["a"])),
        ("get of several", lambda: backend.get(P, ["c", "a", "b"])),
        ("list", lambda: backend.list(P, q())),
        ("list values=False", lambda: backend.list(P, q(values=False))),
        ("list by seq, limit", lambda: backend.list(P, q(order="seq", descending=True, limit=10))),
        ("list by seq, limit, values=False", lambda: backend.list(P, q(order="seq", limit=10, values=False))),
        ("list by prefix", lambda: backend.list(P, q(prefix="a"))),
        ("list by tag", lambda: backend.list(P, q(tags={"kind": "plan"}))),
        ("list by tag, values=False", lambda: backend.list(P, q(tags={"kind": "plan"}, values=False))),
        ("list by tag and seq, limit", lambda: backend.list(P, q(tags={"kind": "plan"}, order="seq", limit=5))),
        ("list children", lambda: backend.list(P, q(depth=0, children=True))),
        ("list children, values=False", lambda: backend.list(P, q(depth=0, children=True, values=False))),
    ]


def _areads(backend: SqliteBackend) -> list[tuple[str, Any]]:
    q = ListQuery
    return [
        ("aget", lambda: backend.aget(P, ["a"])),
        ("aget of several", lambda: backend.aget(P, ["c", "a", "b"])),
        ("alist", lambda: backend.alist(P, q())),
        ("alist values=False", lambda: backend.alist(P, q(values=False))),
        ("alist by seq, limit", lambda: backend.alist(P, q(order="seq", descending=True, limit=10))),
        ("alist by tag", lambda: backend.alist(P, q(tags={"kind": "plan"}))),
        ("alist by tag, values=False", lambda: backend.alist(P, q(tags={"kind": "plan"}, values=False))),
        ("alist children", lambda: backend.alist(P, q(depth=0, children=True))),
        ("alist children, values=False", lambda: backend.alist(P, q(depth=0, children=True, values=False))),
    ]


#: Reads that go through the damaged record's row by its name or tags, not by partition:
#: a row whose name is damaged is not found there (as if absent), but wherever it is met
#: (a listing of the whole partition) it is refused.
_BY_NAME = ("get", "aget", "list by prefix", "list by tag", "alist by tag", "list children", "alist children")


def _must_refuse(label: str, damage_id: str) -> bool:
    """Whether this read must see the damage (else it may also return intact records)."""
    if damage_id.startswith("value-"):  # values=False does not read the value column
        return "values=False" not in label
    if damage_id.startswith("name-"):
        return not label.startswith(_BY_NAME)
    return True


def _expect(label: str, damage_id: str, outcome: Any, target: str = "a") -> None:
    """A read's outcome: CorruptItemError naming the record, or intact records only."""
    if isinstance(outcome, CorruptItemError):
        if damage_id.startswith("name-"):  # the key shows the damaged name (a blob, NULL)
            assert outcome.key in (repr(target.encode()), "None"), (label, outcome)
        else:
            assert outcome.key == target, (label, outcome)
        return
    assert not isinstance(outcome, BaseException), f"{label}, {damage_id}: {outcome!r}"
    assert not _must_refuse(label, damage_id), f"{label}: damaged {damage_id} came back as data: {outcome!r}"
    seeded = dict(DAMAGE_SEED)
    for rec in outcome:  # what comes back is intact and each record's own
        if rec is None:
            continue
        assert type(rec.name) is str and type(rec.seq) is int, (label, rec)
        assert type(rec.etag) is str and type(rec.digest) is str, (label, rec)
        assert type(rec.value) is bytes and rec.value in (b"", rec.name.encode() * 10), (label, rec)
        assert rec.tags == seeded[rec.name], (label, rec)


@pytest.mark.parametrize("damage_id,damage,loose", COLUMN_DAMAGE, ids=[d[0] for d in COLUMN_DAMAGE])
def test_each_damaged_column_is_corrupt_item_on_every_sync_read(
    tmp_path: Path, damage_id: str, damage: str, loose: bool
) -> None:
    with _damaged_backend(tmp_path / "d.db", damage, loose) as backend:
        for label, read in _reads(backend):
            try:
                outcome: Any = read()
            except Exception as exc:  # noqa: BLE001 - the type is what is checked
                outcome = exc
            _expect(label, damage_id, outcome)


@pytest.mark.parametrize("damage_id,damage,loose", COLUMN_DAMAGE, ids=[d[0] for d in COLUMN_DAMAGE])
async def test_each_damaged_column_is_corrupt_item_on_every_async_read(
    tmp_path: Path, damage_id: str, damage: str, loose: bool
) -> None:
    backend = _damaged_backend(tmp_path / "d.db", damage, loose)
    try:
        for label, read in _areads(backend):
            try:
                outcome: Any = await read()
            except Exception as exc:  # noqa: BLE001
                outcome = exc
            _expect(label, damage_id, outcome)
    finally:
        await backend.aclose()


@pytest.mark.parametrize("damage", ["tags = '[1,2]'", "seq = 'notanint'", "value = 5", "etag = x'00'"])
async def test_a_damaged_child_is_corrupt_item_in_children_listings(tmp_path: Path, damage: str) -> None:
    backend = _damaged_backend(tmp_path / "d.db", damage, loose=False, target="a/w")
    try:
        for values in (True, False):
            if damage.startswith("value") and not values:
                continue  # the value column is not read
            query = ListQuery(depth=0, children=True, values=values)
            with pytest.raises(CorruptItemError) as info:
                backend.list(P, query)
            assert info.value.key == "a/w"
            with pytest.raises(CorruptItemError) as info:
                await backend.alist(P, query)
            assert info.value.key == "a/w"
        assert [r.name for r in backend.list(P, ListQuery(depth=0))] == ["a", "b", "c"]  # the picks are fine
    finally:
        await backend.aclose()


def test_a_damaged_row_names_its_record_and_column(tmp_path: Path) -> None:
    with _damaged_backend(tmp_path / "d.db", "seq = 'notanint', tags = '{\"kind\":1}'", loose=False) as backend:
        with pytest.raises(CorruptItemError) as info:
            backend.get(P, ["a"])
    message = str(info.value)
    assert info.value.key == "a" and "'a'" in message
    assert "seq is text 'notanint', not an integer" in message
    assert "tags is text" in message and "not a JSON object of strings" in message


@pytest.mark.parametrize(
    "damage",
    [
        "UPDATE tags SET name = 'c' WHERE name = 'a'",  # the index moved to another record
        "INSERT INTO tags (pid, name, k, v, seq) SELECT pid, 'c', k, v, 3 FROM tags WHERE name = 'a'",
        "UPDATE tags SET v = '\"other\"' WHERE name = 'b'",  # b listed under a value it does not carry
    ],
)
async def test_a_damaged_tag_index_never_lists_a_record_under_tags_it_lacks(tmp_path: Path, damage: str) -> None:
    path = tmp_path / "d.db"
    backend = SqliteBackend(path)
    backend.write(P, [make_put(n, n.encode() * 10, tags=t) for n, t in DAMAGE_SEED])
    with sqlite3.connect(path) as conn:
        conn.execute(damage)
    conn.close()
    tag = {"kind": "other"} if "other" in damage else {"kind": "plan"}
    try:
        for query in (ListQuery(tags=tag), ListQuery(tags=tag, values=False, order="seq", limit=3),
                      ListQuery(tags=tag, depth=0, children=True)):
            with pytest.raises(CorruptItemError, match="tag index"):
                backend.list(P, query)
            with pytest.raises(CorruptItemError, match="tag index"):
                await backend.alist(P, query)
    finally:
        await backend.aclose()


#: Damage to a ``partitions`` row: (id, SQL).
PARTITION_DAMAGE = [
    ("name-not-utf8", "UPDATE partitions SET name = x'ff' WHERE name = CAST('runs/r1' AS BLOB)"),
    ("name-text", "UPDATE partitions SET name = 'runs/r1' WHERE name = CAST('runs/r1' AS BLOB)"),
    ("name-int", "UPDATE partitions SET name = 5 WHERE name = CAST('runs/r1' AS BLOB)"),
    (
        "name-another-partitions",
        "UPDATE partitions SET name = CAST('runs/r2' AS BLOB) WHERE name = CAST('runs/r1' AS BLOB)",
    ),
    (
        "row-of-another-user",
        "UPDATE partitions SET user_key = (SELECT user_key FROM partitions WHERE name = CAST('runs/r1' AS BLOB)) "
        "WHERE name = CAST('bobs' AS BLOB)",
    ),
]


@pytest.mark.parametrize("damage", [d[1] for d in PARTITION_DAMAGE], ids=[d[0] for d in PARTITION_DAMAGE])
async def test_a_damaged_partitions_row_is_corrupt_item(tmp_path: Path, damage: str) -> None:
    path = tmp_path / "d.db"
    backend = SqliteBackend(path)
    backend.write(P, [make_put("a", b"1")])
    if "runs/r2" in damage:  # a real partition of that name exists: still not this row's
        backend.write(Partition("alice", "items", "runs/r2"), [make_put("a", b"2")])
    backend.write(Partition("bob", "items", "bobs"), [make_put("a", b"3")])
    assert backend.partitions("alice", "items") == sorted(["runs/r1"] + (["runs/r2"] if "runs/r2" in damage else []))
    with sqlite3.connect(path) as conn:
        assert conn.execute(damage).rowcount == 1
    conn.close()
    # bob's row claiming alice's user is not in alice's range of keys: bob's listing meets it
    another_user = "'bobs'" in damage
    lister = ("bob", "items") if another_user else ("alice", "items")
    try:
        if another_user:
            assert backend.partitions("alice", "items") == ["runs/r1"]
        with pytest.raises(CorruptItemError, match="partitions row is damaged"):
            backend.partitions(*lister)
        with pytest.raises(CorruptItemError, match="partitions row is damaged"):
            await backend.apartitions(*lister)
    finally:
        await backend.aclose()


def test_writes_over_a_damaged_row_replace_it_or_refuse_and_seqs_stay_intact(tmp_path: Path) -> None:
    """An upsert or delete replaces a damaged record; a condition on it is refused as corrupt.

    A seq damaged to text sorts above every integer in ``MAX()``: writes must
    neither fail on it nor count up from it, and ``seq_counter`` never takes it.
    """
    path = tmp_path / "d.db"
    with _damaged_backend(path, "seq = 'notanint', etag = x'00', digest = x'00'", loose=False) as backend:
        top = max(r.seq for r in backend.list(P, ListQuery(prefix="b")) + backend.list(P, ListQuery(prefix="c")))
        # appending over it, or a condition on its etag: refused as corrupt, nothing written
        for put in (make_put("a", b"a" * 10, mode=Mode.APPEND), make_put("a", b"x", mode=Mode.IF_MATCH, if_match="e")):
            with pytest.raises(CorruptItemError):
                backend.write(P, [put, make_put("new", b"n")])
            assert backend.get(P, ["new"]) == [None]
        with pytest.raises(CorruptItemError):
            backend.write(P, [], [Delete("a", if_match="e")])
        # new names count up from the intact seqs (from the memo and from a cold start)
        seq = backend.write(P, [make_put("d", b"d")]).records[0].seq
        assert seq == top + 1
        with SqliteBackend(path) as other:
            assert other.write(P, [make_put("e", b"e", mode=Mode.CREATE)]).records[0].seq == top + 2
        # an upsert replaces it
        fixed = backend.write(P, [make_put("a", b"fixed")]).records[0]
        assert fixed.seq == top + 3 and backend.get(P, ["a"])[0].value == b"fixed"  # type: ignore[union-attr]
        # a delete removes one, and a drop a partition holding one
        with sqlite3.connect(path) as conn:
            conn.execute("UPDATE records SET seq = 'x', tags = '{' WHERE name IN ('a', 'b')")
        conn.close()
        backend.write(P, [], [Delete("a")])
        assert backend.drop(P) == 5
        with sqlite3.connect(path) as conn:  # the highest intact seq ("e"); a damaged one is unknown
            assert conn.execute("SELECT typeof(seq), seq FROM seq_counter").fetchone() == ("integer", top + 2)
        conn.close()
        assert backend.write(P, [make_put("f", b"f")]).records[0].seq == top + 3


# -- 4c. disk space after deletes -----------------------------------------------------------------

MB = 1 << 20
BIG_RECORDS = 20  # of 1 MB: ~20 MB written, then deleted


def _disk(path: Path) -> tuple[int, int, int]:
    """Bytes of the file, bytes of its WAL, and the free pages its header reports."""
    wal = Path(f"{path}-wal")
    conn = sqlite3.connect(path)  # a short read of the header; other connections stay open
    try:
        (free,) = conn.execute("PRAGMA freelist_count").fetchone()
    finally:
        conn.close()
    return path.stat().st_size, wal.stat().st_size if wal.exists() else 0, free


def _fill(backend: SqliteBackend, tag: str, count: int = BIG_RECORDS) -> None:
    for i in range(count):
        backend.write(P, [make_put(f"{tag}{i:03d}", os.urandom(MB), mode=Mode.APPEND)])


def _delete_all(backend: SqliteBackend, how: str, tag: str) -> None:
    if how == "drop":
        assert backend.drop(P) == BIG_RECORDS
    else:
        backend.write(P, [], [Delete(f"{tag}{i:03d}") for i in range(BIG_RECORDS)])


@pytest.mark.parametrize("how", ["drop", "batch"])
def test_deleting_gives_the_disk_space_back(tmp_path: Path, how: str) -> None:
    """A new file shrinks after a large delete, its WAL is emptied, and writing again does not grow it.

    Before: 20 MB written and deleted left the file at 21 MB and the WAL at
    21 MB (the deletes' zeroed pages, ``secure_delete``), with ~5,000 free pages.
    """
    path = tmp_path / "big.db"
    with SqliteBackend(path) as backend:
        keep = Partition("alice", "items", "kept")
        backend.write(keep, [make_put("keep", b"small")])
        _fill(backend, "a")
        file, wal, _ = _disk(path)
        peak = file + wal
        assert file > BIG_RECORDS * MB
        _delete_all(backend, how, "a")
        file, wal, free = _disk(path)
        assert file + wal < peak / 10, (file, wal, peak)  # ~100 KB left of ~25 MB
        assert free < 256
        with sqlite3.connect(path) as conn:  # FULL was for the delete's commit only
            assert conn.execute("PRAGMA auto_vacuum").fetchone() == (2,)
        conn.close()
        _fill(backend, "b")  # the same again: no bigger than the first time
        file, wal, _ = _disk(path)
        assert file + wal <= peak * 1.05, (file, wal, peak)
        assert backend.get(keep, ["keep"])[0].value == b"small"  # type: ignore[union-attr]


def _none_mode_file(path: Path) -> None:
    """A file as releases before auto_vacuum made them (``auto_vacuum=NONE``, already in WAL mode)."""
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.close()


@pytest.mark.parametrize("how", ["drop", "batch"])
def test_a_file_without_auto_vacuum_reuses_its_free_pages_and_empties_its_wal(tmp_path: Path, how: str) -> None:
    """An existing ``auto_vacuum=NONE`` file is left in that mode (converting needs a VACUUM of the
    whole file): it keeps its size, but the WAL is emptied and later writes fill the free pages."""
    path = tmp_path / "old.db"
    _none_mode_file(path)
    with SqliteBackend(path) as backend:
        with sqlite3.connect(path) as conn:
            assert conn.execute("PRAGMA auto_vacuum").fetchone() == (0,)
        conn.close()
        _fill(backend, "a")
        file, wal, _ = _disk(path)
        peak = file + wal
        _delete_all(backend, how, "a")
        file_after, wal_after, free = _disk(path)
        assert wal_after == 0 and file_after == file and free > BIG_RECORDS * MB // 4096
        assert file_after + wal_after <= peak, (file_after, wal_after, peak)  # before: ~2x peak
        _fill(backend, "b")
        file, wal, free = _disk(path)
        assert file <= file_after * 1.02 and file + wal <= peak * 1.05, (file, wal, peak)


def test_a_file_left_in_full_mode_is_vacuumed_and_switched_back(tmp_path: Path) -> None:
    """A large delete commits in ``FULL`` mode and then switches back; a process killed between
    the two leaves the file ``FULL``, which the next large delete (by any process) undoes."""
    path = tmp_path / "full.db"
    SqliteBackend(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA auto_vacuum=FULL")
    conn.close()
    with SqliteBackend(path) as backend:
        _fill(backend, "a")
        _delete_all(backend, "batch", "a")
        file, wal, free = _disk(path)
        assert file + wal < 2 * MB and free < 256, (file, wal, free)
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA auto_vacuum").fetchone() == (2,)
    conn.close()


def _churn_worker(path: str, worker: int, barrier: Any, results: Any) -> None:
    """Child: worker 0 writes and drops 4 MB five times; the others append small records and read them."""
    try:
        barrier.wait(timeout=120)
        with SqliteBackend(path) as backend:
            mine = Partition("alice", "items", f"w{worker}")
            if worker == 0:
                for round_ in range(5):
                    for i in range(4):
                        backend.write(mine, [make_put(f"r{round_}/{i}", os.urandom(MB))])
                    if round_ % 2:
                        backend.drop(mine)
                    else:
                        backend.write(mine, [], [Delete(f"r{round_}/{i}") for i in range(4)])
            else:
                for n in range(150):
                    backend.write(mine, [make_put(f"{n:04d}", f"{worker}:{n}".encode() * 100, mode=Mode.APPEND)])
                    if n % 10 == 0:
                        got = backend.list(mine, ListQuery(values=True))
                        assert [r.value for r in got] == [f"{worker}:{k}".encode() * 100 for k in range(n + 1)]
        results.put((worker, None))
    except BaseException as exc:  # reported to the parent, which fails the test
        results.put((worker, repr(exc)))


def test_processes_writing_while_another_vacuums(tmp_path: Path) -> None:
    """Large deletes (commits in FULL mode, file cut, WAL emptied) beside other processes' writes and reads."""
    path = str(tmp_path / "shared.db")
    SqliteBackend(path).close()  # created here: auto_vacuum=INCREMENTAL
    workers = 3
    barrier = SPAWN.Barrier(workers)
    results = SPAWN.Queue()
    procs = [SPAWN.Process(target=_churn_worker, args=(path, w, barrier, results)) for w in range(workers)]
    for p in procs:
        p.start()
    reports = [results.get(timeout=180) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert [err for _, err in reports if err] == []
    with SqliteBackend(path) as backend:
        assert backend.list(Partition("alice", "items", "w0"), ListQuery()) == []
        for w in (1, 2):
            got = backend.list(Partition("alice", "items", f"w{w}"), ListQuery(order="seq"))
            assert [r.value for r in got] == [f"{w}:{k}".encode() * 100 for k in range(150)]
    file, wal, free = _disk(Path(path))
    assert file < 4 * MB and wal == 0, (file, wal, free)  # the last process out checkpointed and removed it
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA auto_vacuum").fetchone() == (2,)
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    conn.close()


def test_a_reader_holding_an_old_snapshot_delays_the_wal_reset_but_never_blocks(tmp_path: Path) -> None:
    """The checkpoint after a large delete does not wait for readers; the WAL is cut when they are gone."""
    path = tmp_path / "read.db"
    with SqliteBackend(path, timeout=20) as backend:
        _fill(backend, "a")
        reader = sqlite3.connect(path, isolation_level=None)
        reader.execute("BEGIN")
        assert reader.execute("SELECT count(*) FROM records").fetchone() == (BIG_RECORDS,)
        started = time.monotonic()
        assert backend.drop(P) == BIG_RECORDS
        assert time.monotonic() - started < 15  # a checkpoint waiting on the reader would take the 20 s timeout
        assert reader.execute("SELECT count(*) FROM records").fetchone() == (BIG_RECORDS,)  # its snapshot holds
        reader.execute("ROLLBACK")
        reader.close()
        for i in range(3):  # the next writers finish the checkpoint and start the WAL over, cut to its limit
            backend.write(P, [make_put(f"s{i}", b"small")])
        file, wal, free = _disk(path)
        assert wal <= 8 * MB and file < 2 * MB and free < 256, (file, wal, free)


# -- 5. driver errors become library errors -------------------------------------------------

#: Every exception class ``sqlite3`` defines, and whether it means "unavailable".
SQLITE3_ERRORS = {
    "Error": True,
    "DatabaseError": True,
    "OperationalError": True,
    "InternalError": True,
    "InterfaceError": False,
    "ProgrammingError": False,
    "IntegrityError": False,
    "DataError": False,
    "NotSupportedError": False,
    "Warning": False,
}


def test_every_sqlite3_exception_class_is_translated() -> None:
    defined = {
        name
        for name, obj in vars(sqlite3).items()
        if isinstance(obj, type) and issubclass(obj, (sqlite3.Error, sqlite3.Warning))
    }
    assert defined == set(SQLITE3_ERRORS), "a new sqlite3 exception class: decide how to map it"
    for name, unavailable in SQLITE3_ERRORS.items():
        raised = getattr(sqlite3, name)("boom")
        with pytest.raises(CheckpointerError) as info:
            with translate_errors("x.db"):
                raise raised
        assert info.value.__cause__ is raised, name
        assert isinstance(info.value, BackendUnavailableError) is unavailable, name
        assert "x.db" in str(info.value)


def _holder_script(path: Path) -> str:
    return (
        "import sqlite3, sys, time\n"
        f"conn = sqlite3.connect({str(path)!r}, isolation_level=None)\n"
        "conn.execute('BEGIN IMMEDIATE')\n"
        "conn.execute(\"UPDATE seq_counter SET seq = seq WHERE id = 0\")\n"
        "print('locked', flush=True)\n"
        "time.sleep(60)\n"
    )


def test_write_lock_held_by_another_process_gives_unavailable(tmp_path: Path) -> None:
    path = tmp_path / "locked.db"
    with SqliteBackend(path) as setup:
        setup.write(P, [make_put("a", b"1")])
    holder = subprocess.Popen(
        [sys.executable, "-c", _holder_script(path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        with SqliteBackend(path, timeout=0.3) as backend:
            began = time.monotonic()
            with pytest.raises(BackendUnavailableError, match="locked") as info:
                backend.write(P, [make_put("b", b"2")])
            assert time.monotonic() - began >= 0.25  # it waited for the lock first
            assert isinstance(info.value.__cause__, sqlite3.OperationalError)

            async def write_async() -> None:
                with pytest.raises(BackendUnavailableError) as ainfo:
                    await backend.awrite(P, [make_put("b", b"2")])
                assert isinstance(ainfo.value.__cause__, sqlite3.OperationalError)

            asyncio.run(write_async())
            # WAL: readers are not blocked by the writer
            assert backend.get(P, ["a"])[0] is not None
    finally:
        holder.kill()
        holder.wait()
    with SqliteBackend(path) as backend:  # the lock is gone with its process
        assert backend.write(P, [make_put("b", b"2")]).conflict is None


def test_busy_errors_are_retried_until_the_deadline_and_others_are_not() -> None:
    calls: list[int] = []

    def busy_twice() -> str:
        calls.append(1)
        if len(calls) <= 2:
            raise sqlite3.OperationalError("database is locked")
        return "done"

    assert _retrying(5.0, busy_twice) == "done" and len(calls) == 3

    def always_busy() -> None:
        calls.append(1)
        raise sqlite3.OperationalError("database is locked")

    calls.clear()
    with pytest.raises(sqlite3.OperationalError):
        _retrying(0.1, always_busy)
    assert 1 < len(calls) < 50  # retried, but bounded by the deadline

    def io_error() -> None:
        calls.append(1)
        raise sqlite3.OperationalError("disk I/O error")

    calls.clear()
    with pytest.raises(sqlite3.OperationalError):
        _retrying(5.0, io_error)
    assert len(calls) == 1


def test_not_a_database_and_missing_directory_give_unavailable(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not a sqlite file at all" * 200)
    with pytest.raises(BackendUnavailableError, match="garbage.db") as info:
        SqliteBackend(garbage)
    assert isinstance(info.value.__cause__, sqlite3.DatabaseError)
    with pytest.raises(BackendUnavailableError) as info:
        SqliteBackend(tmp_path / "no" / "such" / "dir" / "x.db")
    assert isinstance(info.value.__cause__, sqlite3.OperationalError)


def test_closed_backend_refuses_calls(tmp_path: Path) -> None:
    backend = SqliteBackend(tmp_path / "x.db")
    backend.close()
    backend.close()  # idempotent
    with pytest.raises(BackendUnavailableError, match="closed"):
        backend.get(P, ["a"])
    with pytest.raises(BackendUnavailableError, match="closed"):
        asyncio.run(backend.aget(P, ["a"]))


# -- 6. sync and async faces, several event loops -------------------------------------------


def test_sync_and_async_see_each_other_across_event_loops(tmp_path: Path) -> None:
    backend = SqliteBackend(tmp_path / "x.db")
    try:
        backend.write(P, [make_put("sync", b"s")])

        async def first_loop() -> None:
            assert (await backend.aget(P, ["sync"]))[0].value == b"s"  # type: ignore[union-attr]
            await backend.awrite(P, [make_put("async1", b"a1")])

        async def second_loop() -> None:  # a new loop: the first loop's connection is unusable
            assert len(await backend.alist(P, ListQuery())) == 2
            await backend.awrite(P, [make_put("async2", b"a2")])

        asyncio.run(first_loop())
        assert backend.get(P, ["async1"])[0].value == b"a1"  # type: ignore[union-attr]
        asyncio.run(second_loop())
        assert [r.name for r in backend.list(P, ListQuery(order="seq"))] == ["sync", "async1", "async2"]
        # one worker thread serves both loops (a closed loop leaves nothing to stop)
        assert _wait_until(lambda: len(_worker_threads()) <= 1)
    finally:
        backend.close()
    assert _wait_until(lambda: _worker_threads() == []), "close() left the worker thread"


def test_event_loops_in_several_threads_at_once(tmp_path: Path) -> None:
    backend = SqliteBackend(tmp_path / "x.db")

    def in_own_loop(t: int) -> None:
        async def body() -> None:
            for n in range(30):
                put = make_put(f"t{t}/{n:02d}", b"v", mode=Mode.CREATE)
                assert (await backend.awrite(P, [put])).conflict is None
                backend.write(P, [make_put(f"s{t}/{n:02d}", b"v")])  # sync from a loop's thread too

        asyncio.run(body())

    errors = _in_threads(in_own_loop, 3)
    try:
        assert errors == []
        records = backend.list(P, ListQuery(values=False))
        assert len(records) == 3 * 30 * 2
        assert len({r.seq for r in records}) == len(records)
    finally:
        backend.close()
    assert _wait_until(lambda: _worker_threads() == [])


async def test_aclose_stops_the_worker(tmp_path: Path) -> None:
    backend = SqliteBackend(tmp_path / "x.db")
    await backend.awrite(P, [make_put("a", b"1")])
    assert len(_worker_threads()) == 1
    await backend.aclose()
    assert _worker_threads() == []  # awaited: gone at once
    with pytest.raises(BackendUnavailableError):
        await backend.aget(P, ["a"])



async def test_the_event_loop_runs_no_sqlite_code(tmp_path: Path) -> None:
    """An async write waiting for another connection's write lock leaves its event loop free."""
    backend = SqliteBackend(tmp_path / "x.db", timeout=10)
    other = sqlite3.connect(tmp_path / "x.db", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # holds the write lock
    try:
        task = asyncio.ensure_future(backend.awrite(P, [make_put("a", b"1")]))
        ticks = 0
        for _ in range(20):
            await asyncio.sleep(0.01)
            ticks += 1
        assert ticks == 20 and not task.done()
        other.execute("COMMIT")
        assert (await task).conflict is None
    finally:
        other.close()
        await backend.aclose()


async def test_a_cancelled_call_still_runs_and_the_next_ones_follow(tmp_path: Path) -> None:
    backend = SqliteBackend(tmp_path / "x.db")
    try:
        task = asyncio.ensure_future(backend.awrite(P, [make_put("a", b"1")]))
        await asyncio.sleep(0)  # queued on the worker
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert (await backend.aget(P, ["a"]))[0] is not None  # as on aiosqlite: it ran, its result was dropped
    finally:
        await backend.aclose()


def test_an_event_loop_closed_while_its_call_runs_does_not_stop_the_worker(tmp_path: Path) -> None:
    backend = SqliteBackend(tmp_path / "x.db", timeout=10)
    other = sqlite3.connect(tmp_path / "x.db", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        loop = asyncio.new_event_loop()
        with pytest.raises(asyncio.TimeoutError):
            loop.run_until_complete(asyncio.wait_for(backend.awrite(P, [make_put("a", b"1")]), 0.1))
        loop.close()
        other.execute("COMMIT")  # the write goes on; its result has no loop to go to
        assert asyncio.run(backend.aget(P, ["a"]))[0] is not None
    finally:
        other.close()
        backend.close()


def test_a_backend_dropped_without_close_stops_its_worker(tmp_path: Path) -> None:
    backend = SqliteBackend(tmp_path / "x.db")
    asyncio.run(backend.awrite(P, [make_put("a", b"1")]))
    worker = backend._offload._thread
    assert worker is not None and worker.is_alive()
    del backend
    gc.collect()
    assert _wait_until(lambda: not worker.is_alive())


# -- SQLite-specific details of the contract --------------------------------------------------


def test_prefix_is_literal_with_percent_and_underscore(sqlite_backend: SqliteBackend) -> None:
    names = ["a%b", "a%c", "aXb", "a_b", "a_c", "ab", "a/b", "a-", "b%"]
    sqlite_backend.write(P, [make_put(n, n.encode()) for n in names])

    def listed(prefix: str) -> list[str]:
        return [r.name for r in sqlite_backend.list(P, ListQuery(prefix=prefix))]

    assert listed("a%") == ["a%b", "a%c"]
    assert listed("a_") == ["a_b", "a_c"]
    assert listed("a") == sorted(n for n in names if n.startswith("a"))
    assert listed("%") == []


def _plan(path: Path, query: ListQuery) -> str:
    sql, params = _list_sql(P.key, query)
    with sqlite3.connect(path) as conn:
        conn.create_function("cp_now", 0, time.time)  # what SqliteBackend registers: its clock
        return " | ".join(row[-1] for row in conn.execute("EXPLAIN QUERY PLAN " + sql, params))


def test_tag_queries_walk_the_tag_index_in_their_order(tmp_path: Path) -> None:
    path = tmp_path / "x.db"
    with SqliteBackend(path) as backend:
        tags = [{"kind": f"k{i % 10}", "x": str(i % 4)} for i in range(100)]
        backend.write(P, [make_put(f"n{i:03d}", b"v", tags=t) for i, t in enumerate(tags)])
        backend.write(P, [make_put("n013", b"w", tags={"kind": "k3", "x": "1"})])  # now the newest k3
        newest = ListQuery(tags={"kind": "k3"}, order="seq", descending=True, limit=1)
        assert [r.name for r in backend.list(P, newest)] == ["n013"]
        both = ListQuery(tags={"kind": "k3", "x": "1"}, order="seq", descending=True, limit=3)
        assert [r.name for r in backend.list(P, both)] == ["n013", "n093", "n073"]
        by_name = ListQuery(tags={"kind": "k3"}, order="name", descending=True, limit=2, prefix="n0")
        assert [r.name for r in backend.list(P, by_name)] == ["n093", "n083"]
    # "newest 1 with tag X" is a seek in tags_seq: no partition scan, no sort.
    plan = _plan(path, newest)
    assert "USING COVERING INDEX tags_seq (pid=? AND k=? AND v=?)" in plan, plan
    assert "TEMP B-TREE" not in plan and "SCAN" not in plan, plan
    # name order walks the tags table's own key (pid, k, v, name)
    walks = [(both, "t USING COVERING INDEX tags_seq"), (by_name, "t USING PRIMARY KEY"),
             (ListQuery(tags={"x": "1"}), "t USING PRIMARY KEY")]
    for query, walk in walks:
        plan = _plan(path, query)
        assert walk in plan and "TEMP B-TREE" not in plan and "SCAN" not in plan, plan


def test_tag_rows_carry_their_records_seq_through_rewrites(sqlite_backend: SqliteBackend) -> None:
    sqlite_backend.write(P, [make_put(n, n.encode(), tags={"w": "1", "n": n}) for n in "abc"])
    sqlite_backend.write(P, [make_put("a", b"a2", tags={"w": "1"}), make_put("b", b"b", mode=Mode.APPEND)])
    sqlite_backend.write(P, [make_put("c", b"c2", tags={"w": "2"})], [Delete("b")])
    with sqlite3.connect(sqlite_backend.path) as conn:
        rows = conn.execute(
            "SELECT t.name, t.k, t.seq, r.seq FROM tags AS t LEFT JOIN records AS r "
            "ON r.pid = t.pid AND r.name = t.name ORDER BY t.name, t.k"
        ).fetchall()
    assert [(name, k) for name, k, _, _ in rows] == [("a", '"w"'), ("c", '"w"')]  # b's tags went with it
    assert all(tag_seq == record_seq for _, _, tag_seq, record_seq in rows), rows
    newest = ListQuery(tags={"w": "1"}, order="seq", descending=True, limit=1)
    assert [r.name for r in sqlite_backend.list(P, newest)] == ["a"]


def test_seq_keeps_growing_after_the_newest_record_is_deleted(sqlite_backend: SqliteBackend) -> None:
    a, b = sqlite_backend.write(P, [make_put("a", b"1"), make_put("b", b"2")]).records
    sqlite_backend.write(P, [], [Delete("b")])  # the partition's highest seq is gone
    other = Partition("bob", "items", "x")
    sqlite_backend.write(other, [make_put("c", b"3")])
    (d,) = sqlite_backend.write(P, [make_put("d", b"4")]).records
    assert a.seq < b.seq < d.seq
    noop = sqlite_backend.write(P, [make_put("d", b"4", mode=Mode.APPEND)]).records[0]
    assert noop.seq == d.seq and noop.etag == d.etag  # an append no-op keeps the old record
    # deleted with a newer record in the same batch, then the whole partition dropped
    (e,) = sqlite_backend.write(P, [make_put("e", b"5")], [Delete("d")]).records
    assert e.seq > d.seq
    sqlite_backend.write(P, [], [Delete("a"), Delete("e")])
    (f,) = sqlite_backend.write(P, [make_put("f", b"6")]).records
    assert f.seq > e.seq
    assert sqlite_backend.drop(P) == 1
    (g,) = sqlite_backend.write(P, [make_put("g", b"7")]).records
    assert g.seq > f.seq


def test_partitions_keep_raw_names_and_vanish_with_their_last_record(sqlite_backend: SqliteBackend) -> None:
    long_name = "thread-" + "x" * 400  # hashed in Partition.key
    odd_name = "t\ud800:|/%_*"  # a lone surrogate and glob/LIKE characters
    for name in (long_name, odd_name, "plain"):
        sqlite_backend.write(Partition("alice", "langgraph", name), [make_put("r", b"v")])
    sqlite_backend.write(Partition("alice2", "langgraph", "theirs"), [make_put("r", b"v")])
    assert Partition("alice", "langgraph", long_name).key.rsplit("/", 1)[1].startswith("h")
    assert sqlite_backend.partitions("alice", "langgraph") == sorted([long_name, odd_name, "plain"])

    sqlite_backend.write(Partition("alice", "langgraph", "plain"), [], [Delete("r")])
    assert sqlite_backend.drop(Partition("alice", "langgraph", long_name)) == 1
    assert sqlite_backend.partitions("alice", "langgraph") == [odd_name]
    assert sqlite_backend.partitions("alice2", "langgraph") == ["theirs"]


def test_tags_with_any_characters_round_trip_and_filter(sqlite_backend: SqliteBackend) -> None:
    tags = {"k\ud800": "v\udfff", "quote\"": "é%_*", "empty": ""}
    sqlite_backend.write(P, [make_put("a", b"1", tags=tags), make_put("b", b"2", tags={"empty": "x"})])
    assert sqlite_backend.get(P, ["a"])[0].tags == tags  # type: ignore[union-attr]
    for k, v in tags.items():
        assert [r.name for r in sqlite_backend.list(P, ListQuery(tags={k: v}))] == ["a"]
    # re-tagging replaces the indexed tags in the same transaction
    sqlite_backend.write(P, [make_put("a", b"1", tags={"new": "1"})])
    assert sqlite_backend.list(P, ListQuery(tags={"empty": ""})) == []
    assert [r.name for r in sqlite_backend.list(P, ListQuery(tags={"new": "1"}))] == ["a"]


def test_refused_batch_changes_nothing(sqlite_backend: SqliteBackend) -> None:
    (kept,) = sqlite_backend.write(P, [make_put("a", b"1", tags={"t": "1"})]).records
    result = sqlite_backend.write(
        P, [make_put("new", b"n", tags={"t": "1"}), make_put("a", b"2", mode=Mode.CREATE)], [Delete("gone")]
    )
    assert result.records == [] and result.conflict is not None
    assert result.conflict.index == 1 and result.conflict.existing == kept  # full stored record
    assert sqlite_backend.list(P, ListQuery()) == [kept]
    assert [r.name for r in sqlite_backend.list(P, ListQuery(tags={"t": "1"}))] == ["a"]
    # the seq counter did not move either
    (after,) = sqlite_backend.write(P, [make_put("b", b"b")]).records
    assert after.seq == kept.seq + 1


def test_several_threads_share_one_backend(sqlite_backend: SqliteBackend) -> None:
    def writer(t: int) -> None:
        for n in range(40):
            sqlite_backend.write(P, [make_put(f"t{t}/{n:02d}", b"v", mode=Mode.CREATE)])

    assert _in_threads(writer, 4) == []
    records = sqlite_backend.list(P, ListQuery(order="seq"))
    assert len(records) == 160 and len({r.seq for r in records}) == 160


def test_large_batches_and_gets_span_several_statements(sqlite_backend: SqliteBackend) -> None:
    names = [f"n{i:05d}" for i in range(1000)]  # over the IN-list chunk size
    records = sqlite_backend.write(P, [make_put(n, n.encode()) for n in names]).records
    got = sqlite_backend.get(P, [*names, "absent"])
    assert got == [*records, None]


def test_from_url_paths_and_options(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with SqliteBackend.from_url("sqlite:///relative.db") as rel:
        assert Path(rel.path).resolve() == tmp_path / "relative.db"
    absolute = tmp_path / "sub" / "abs.db"
    absolute.parent.mkdir()
    with open_backend(f"sqlite:///{absolute}?timeout=2.5&synchronous=full") as backend:
        assert isinstance(backend, SqliteBackend) and backend.kind == "sqlite"
        assert backend.path == str(absolute) and backend.timeout == 2.5
        assert backend._run(lambda conn: conn.execute("PRAGMA synchronous").fetchone()[0]) == 2  # FULL
    with SqliteBackend(tmp_path / "d.db") as default:
        assert default._run(lambda conn: conn.execute("PRAGMA synchronous").fetchone()[0]) == 1  # NORMAL
    for bad in ("sqlite:///:memory:", "sqlite://", "sqlite://host/x.db", "sqlite:///x.db?cache=shared"):
        with pytest.raises(ValueError):
            SqliteBackend.from_url(bad)
    with pytest.raises(ValueError, match="file"):
        SqliteBackend(":memory:")


def test_a_backend_never_closed_does_not_hang_interpreter_exit(tmp_path: Path) -> None:
    script = (
        "import asyncio\n"
        "from checkpointers._flows import make_put\n"
        "from checkpointers._names import Partition\n"
        "from checkpointers.backends.sqlite import SqliteBackend\n"
        f"backend = SqliteBackend({str(tmp_path / 'x.db')!r})\n"
        "asyncio.run(backend.awrite(Partition('u', 'items', 's'), [make_put('a', b'1')]))\n"
        "print('written', flush=True)\n"  # and exit without close()
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and done.stdout.strip() == "written", done.stderr
    with SqliteBackend(tmp_path / "x.db") as backend:
        assert backend.get(Partition("u", "items", "s"), ["a"])[0] is not None


#: The read cache's own statements before a read: its version check, and version + expiry lookup.
_CACHE_STATEMENTS = ("PRAGMA data_version", "SELECT data_version, (SELECT expires_at FROM partitions")


def _traced(backend: SqliteBackend) -> list[str]:
    """The SQL statements that read records on the connection the backend reads on from now on."""
    statements: list[str] = []

    def seen(sql: str) -> None:
        if not sql.startswith(_CACHE_STATEMENTS):
            statements.append(sql)

    (backend._wconn or backend._idle[-1]).set_trace_callback(seen)  # the writer reads while free
    return statements


def test_many_reads_agree_with_one_by_one_and_join_prefix_listings(sqlite_backend: SqliteBackend) -> None:
    names = ["c/1", "c/1/a", "c/1/b", "c/1-x", "c/10/a", "c/2/a", "c/2/b/c", "d%/a", "d_/a", "e"]
    sqlite_backend.write(P, [make_put(n, n.encode(), tags={"t": n[0]}) for n in names])
    other = Partition("bob", "items", "runs/r1")  # same names in another partition: never mixed in
    sqlite_backend.write(other, [make_put(n, b"bob") for n in names])
    ops = (
        ListOp(P, ListQuery(prefix="c/1/")),
        ListOp(P, ListQuery(prefix="c/1")),  # overlaps the first: each listing whole
        ListOp(P, ListQuery(prefix="c/2/", values=False)),
        ListOp(P, ListQuery(prefix="d%/")),  # literal, not a pattern
        ListOp(P, ListQuery(prefix="zz/")),  # nothing
        ListOp(P, ListQuery(prefix="c/", depth=0, descending=True, limit=1, children=True)),  # alone
        GetOp(P, ["e", "missing", "c/1/a"]),
        ListOp(other, ListQuery(prefix="c/1/")),
    )
    one_by_one = [op.call(sqlite_backend) for op in ops]
    statements = _traced(sqlite_backend)
    assert sqlite_backend.many(ops) == one_by_one
    assert [r.name for r in one_by_one[1]] == ["c/1", "c/1-x", "c/1/a", "c/1/b", "c/10/a"]
    assert one_by_one[2][0].value == b"" and one_by_one[7][0].value == b"bob"
    # the 6 prefix listings: one statement per (partition, values) group, plus the query and the get
    assert len(statements) == 5, statements
    assert asyncio.run(sqlite_backend.amany(ops)) == one_by_one


@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("tags", [{}, {"t": "c"}])
def test_children_listing_is_one_statement_and_skips_names_that_only_extend_a_pick(
    sqlite_backend: SqliteBackend, descending: bool, tags: dict[str, str]
) -> None:
    # "c/x/1-a" and "c/x/1%b" sort between "c/x/1" and its children: siblings, not children
    names = ["c/x/1", "c/x/1%b", "c/x/1-a", "c/x/1-a/w", "c/x/1/a", "c/x/1/b/c", "c/x/2", "c/x/2/a", "c/x/20/a"]
    reference = MemoryBackend()
    puts = [make_put(n, n.encode(), tags={"t": n[0]}) for n in names]
    for backend in (sqlite_backend, reference):
        backend.write(P, puts)
    for limit in (None, 1, 2, 10):
        query = ListQuery(prefix="c/x/", depth=0, descending=descending, limit=limit, children=True, tags=tags)
        statements = _traced(sqlite_backend)
        assert sqlite_backend.list(P, query) == reference.list(P, query), query
        assert len(statements) == 1, statements


def test_a_v3_file_gains_expiries_and_keeps_its_partitions_forever(tmp_path: Path) -> None:
    """Retention's migration (v4) adds ``partitions.expires_at``: rows written before it are NULL, never expire."""
    path = tmp_path / "v3.db"
    put = make_put("n0", b"old")
    with sqlite3.connect(path) as conn:  # a file left at schema version 3, one partition
        for v in range(4):
            conn.executescript(MIGRATIONS[v])
            conn.execute("INSERT INTO schema_migrations (v) VALUES (?)", (v,))
        conn.execute(
            "INSERT INTO records VALUES (?, ?, 1, ?, ?, '{}', ?)", (P.key, put.name, put.etag, put.digest, put.value)
        )
        conn.execute("INSERT INTO partitions VALUES (?, ?, ?)", (P.key, P.user_key, P.name.encode()))
    with SqliteBackend(path, ttl=10, clock=lambda: time.time() + 3600) as backend:  # an hour on: nothing expired
        assert backend.expiry(P) is None and backend.expired() == []
        assert [r.value for r in backend.list(P, ListQuery())] == [b"old"]
        assert backend.sweep() == 0
        backend.write(P, [make_put("n1", b"new")])  # a write with a ttl sets one
        assert backend.expiry(P) == pytest.approx(time.time() + 3610, abs=5)
    assert _versions(path) == list(range(len(MIGRATIONS)))


def _v4_file(path: Path, puts: list[Any]) -> None:
    """A file as the v4 release left it: text etags and digests, tag rows keyed (pkey, name, k)."""
    with sqlite3.connect(path) as conn:
        for v in range(5):
            conn.executescript(MIGRATIONS[v])
            conn.execute("INSERT INTO schema_migrations (v) VALUES (?)", (v,))
        for seq, put in enumerate(puts, 1):
            conn.execute(
                "INSERT INTO records VALUES (?, ?, ?, ?, ?, ?, ?)",
                (P.key, put.name, seq, put.etag, put.digest, json.dumps(put.tags, separators=(",", ":")), put.value),
            )
            conn.executemany(
                "INSERT INTO tags (pkey, name, k, v, seq) VALUES (?, ?, ?, ?, ?)",
                [(P.key, put.name, json.dumps(k), json.dumps(v), seq) for k, v in put.tags.items()],
            )
        conn.execute("INSERT INTO partitions VALUES (?, ?, ?, NULL)", (P.key, P.user_key, P.name.encode()))
    conn.close()


def test_a_v4_file_is_migrated_to_v5_and_reads_and_rewrites_its_records(tmp_path: Path) -> None:
    """v5 rebuilds the tag rows keyed (pkey, k, v, name) and stores etags/digests packed; v4 rows still read."""
    path = tmp_path / "v4.db"
    old = [make_put(f"n{i}", f"v{i}".encode(), tags={"kind": f"k{i % 2}", "é\ud800": "x"}) for i in range(4)]
    _v4_file(path, old)
    with SqliteBackend(path) as backend:
        assert _versions(path) == list(range(len(MIGRATIONS)))
        got = backend.get(P, [p.name for p in old])
        assert [(r.etag, r.digest, r.value, dict(r.tags)) for r in got if r] == [  # v4's text cells, as written
            (p.etag, p.digest, p.value, p.tags) for p in old
        ]
        for order in ("name", "seq"):
            assert [r.name for r in backend.list(P, ListQuery(tags={"kind": "k1"}, order=order))] == ["n1", "n3"]
            assert [r.name for r in backend.list(P, ListQuery(tags={"é\ud800": "x", "kind": "k0"}, order=order))] == [
                "n0", "n2"]
        # a rewrite and a delete replace the migrated tag rows, by their keys
        backend.write(P, [make_put("n1", b"new", tags={"kind": "k0"})], [Delete("n3")])
        for order in ("name", "seq"):
            assert backend.list(P, ListQuery(tags={"kind": "k1"}, order=order)) == []
            assert [r.name for r in backend.list(P, ListQuery(tags={"kind": "k0"}, order=order))] == (
                ["n0", "n1", "n2"] if order == "name" else ["n0", "n2", "n1"])
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT COUNT(*) FROM tags").fetchone() == (5,)  # n0, n2: 2 each; n1: 1
        assert conn.execute("SELECT typeof(etag), typeof(digest) FROM records WHERE name = 'n1'").fetchone() == (
            "blob", "blob")
    conn.close()


@pytest.mark.parametrize(
    "etag,digest,stored",
    [
        ("0123456789abcdef0123456789abcdef", "ab" * 32, ("blob", 16, "blob", 32)),
        ("0123456789abcdef0123456789abcdef", "ab" * 32 + ".u" + "cd" * 16, ("blob", 16, "blob", 48)),
        ("0123456789ABCDEF0123456789ABCDEF", "AB" * 32, ("text", 32, "text", 64)),  # packing would lower them
        ("0123456789abcdef 123456789abcdef", "ab" * 32 + ".k1" + "cd" * 16, ("text", 32, "text", 99)),
        ("e1", "ab" * 32 + ".u" + "cd" * 15 + "c", ("text", 2, "text", 97)),
    ],
)
def test_etags_and_digests_are_stored_packed_only_when_they_unpack_to_themselves(
    sqlite_backend: SqliteBackend, etag: str, digest: str, stored: tuple[str, int, str, int]
) -> None:
    from checkpointers.backends.base import Put

    (written,) = sqlite_backend.write(P, [Put("a", b"v", digest, etag)]).records
    assert (written.etag, written.digest) == (etag, digest)
    (got,) = sqlite_backend.get(P, ["a"])
    assert got is not None and (got.etag, got.digest) == (etag, digest)
    assert [(r.etag, r.digest) for r in sqlite_backend.list(P, ListQuery(values=False))] == [(etag, digest)]
    with sqlite3.connect(sqlite_backend.path) as conn:
        row = conn.execute("SELECT typeof(etag), length(etag), typeof(digest), length(digest) FROM records").fetchone()
    conn.close()
    assert row == stored


def test_an_unchanged_if_match_reput_is_checked_not_rewritten(sqlite_backend: SqliteBackend) -> None:
    """An IF_MATCH put of the stored record under its own etag (a lease guard) keeps the row and its seq."""
    from checkpointers.backends.base import Put

    (lease,) = sqlite_backend.write(P, [make_put("lease", b"held", tags={"k": "v"})]).records
    reput = Put(lease.name, lease.value, lease.digest, lease.etag, dict(lease.tags), Mode.IF_MATCH, lease.etag)
    wconn = sqlite_backend._wconn
    assert wconn is not None
    statements: list[str] = []
    wconn.set_trace_callback(statements.append)
    result = sqlite_backend.write(P, [reput, make_put("w", b"x", mode=Mode.APPEND)])
    wconn.set_trace_callback(None)
    assert result.conflict is None
    kept, new = result.records
    assert kept == lease and new.seq == lease.seq + 1
    writes = [s for s in statements if s.lstrip().upper().startswith(("INSERT", "UPDATE", "DELETE"))]
    assert len(writes) == 1 and "INSERT INTO records" in writes[0], statements  # only "w"'s row
    assert sqlite_backend.get(P, ["lease"]) == [lease]
    assert [r.name for r in sqlite_backend.list(P, ListQuery(tags={"k": "v"}))] == ["lease"]
    # the condition still holds: a moved etag refuses the batch, and another digest is a rewrite
    moved = Put(lease.name, lease.value, lease.digest, "other", dict(lease.tags), Mode.IF_MATCH, "other")
    assert sqlite_backend.write(P, [moved]).conflict is not None
    # other tags under the same etag and an unsealed digest (which does not bind tags): rewritten
    retagged = Put(lease.name, lease.value, lease.digest, lease.etag, {"k": "w"}, Mode.IF_MATCH, lease.etag)
    (moved_tags,) = sqlite_backend.write(P, [retagged]).records
    assert moved_tags.seq > new.seq and moved_tags.tags == {"k": "w"}
    assert [r.name for r in sqlite_backend.list(P, ListQuery(tags={"k": "w"}))] == ["lease"]
    assert sqlite_backend.list(P, ListQuery(tags={"k": "v"})) == []
    changed = make_put("lease", b"renewed", tags={"k": "v"}, mode=Mode.IF_MATCH, if_match=lease.etag)
    (renewed,) = sqlite_backend.write(P, [changed]).records
    assert renewed.seq > moved_tags.seq and sqlite_backend.get(P, ["lease"])[0] == renewed
