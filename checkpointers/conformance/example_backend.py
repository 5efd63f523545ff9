"""A minimal backend that passes the conformance suite: SQLite, one table.

This is the example of ``docs/backends.md``, kept as a real module so that a
test runs the suite against it and the guide cannot rot. It is not tuned
(one connection, one lock, filters applied in Python); the real SQLite
backend is :mod:`checkpointers.backends.sqlite`.

Run the suite against it::

    python -m checkpointers.conformance checkpointers.conformance.example_backend:ExampleBackend
"""

from __future__ import annotations

import asyncio
import builtins
import json
import sqlite3
import threading
from collections.abc import Sequence
from dataclasses import replace

from ..backends.base import (
    Backend,
    Delete,
    ListQuery,
    Put,
    Record,
    WriteResult,
    check_batch,
    evaluate,
    with_children,
)
from ..names import Partition

__all__ = ["ExampleBackend"]

SCHEMA = """
CREATE TABLE IF NOT EXISTS records (
    pkey TEXT NOT NULL,    -- Partition.key: encoded, delimited, unique per (user, space, name)
    pname TEXT NOT NULL,   -- the partition's raw name, returned by partitions()
    name TEXT NOT NULL, value BLOB NOT NULL, tags TEXT NOT NULL,
    etag TEXT NOT NULL, digest TEXT NOT NULL, seq INTEGER NOT NULL,
    PRIMARY KEY (pkey, name)
);
CREATE TABLE IF NOT EXISTS counter (n INTEGER NOT NULL);
INSERT INTO counter SELECT 0 WHERE NOT EXISTS (SELECT 1 FROM counter);
"""
COLUMNS = "name, value, tags, etag, digest, seq"


def _record(row: tuple) -> Record:  # type: ignore[type-arg]
    name, value, tags, etag, digest, seq = row
    return Record(name, bytes(value), json.loads(tags), etag, digest, seq)


class ExampleBackend(Backend):
    """Records in one SQLite table keyed by (partition key, record name)."""

    kind = "example"

    def __init__(self, path: str = ":memory:") -> None:
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.executescript(SCHEMA)
        self._lock = threading.Lock()  # one connection: one statement at a time

    def get(self, partition: Partition, names: Sequence[str]) -> list[Record | None]:
        with self._lock:
            found = self._read(partition.key, names)
        return [found.get(n) for n in names]

    def _read(self, pkey: str, names: Sequence[str]) -> dict[str, Record]:
        marks = ",".join("?" * len(names))
        rows = self._db.execute(
            f"SELECT {COLUMNS} FROM records WHERE pkey = ? AND name IN ({marks})", (pkey, *names)
        )
        return {r.name: r for r in map(_record, rows)}

    def write(
        self, partition: Partition, puts: Sequence[Put], deletes: Sequence[Delete] = ()
    ) -> WriteResult:
        check_batch(puts, deletes)
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")  # conditions and writes in one transaction
            try:
                existing = self._read(partition.key, [p.name for p in puts] + [d.name for d in deletes])
                conflict, noops = evaluate(puts, deletes, existing)
                if conflict is not None:
                    self._db.execute("ROLLBACK")
                    return WriteResult(records=[], conflict=conflict)
                out = [self._apply(partition, put, existing, i in noops) for i, put in enumerate(puts)]
                for d in deletes:
                    self._db.execute("DELETE FROM records WHERE pkey = ? AND name = ?", (partition.key, d.name))
                self._db.execute("COMMIT")
                return WriteResult(records=out)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def _apply(self, partition: Partition, put: Put, existing: dict[str, Record], noop: bool) -> Record:
        if noop:  # an append of identical content: keep the stored record and its seq
            return existing[put.name]
        (seq,) = self._db.execute("UPDATE counter SET n = n + 1 RETURNING n").fetchone()
        record = Record(put.name, put.value, dict(put.tags), put.etag, put.digest, seq)
        self._db.execute(
            "INSERT OR REPLACE INTO records VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (partition.key, partition.name, put.name, put.value, json.dumps(record.tags),
             put.etag, put.digest, seq),
        )
        return record

    def list(self, partition: Partition, query: ListQuery) -> list[Record]:
        with self._lock:  # substr() compares the prefix literally (LIKE would treat % and _)
            rows = self._db.execute(
                f"SELECT {COLUMNS} FROM records WHERE pkey = ? AND substr(name, 1, ?) = ?",
                (partition.key, len(query.prefix), query.prefix),
            ).fetchall()
        records = [_record(row) for row in rows]
        found = sorted(
            (r for r in records if query.matches(r)), key=query.sort_key, reverse=query.descending
        )[: query.limit]
        found = with_children(query, found, records)  # each pick's "<name>/..." records after it
        return found if query.values else [replace(r, value=b"") for r in found]

    def partitions(self, user: str, space: str) -> builtins.list[str]:
        prefix = Partition(user, space, "").user_key  # ends with "/": alice/ never matches alice2/
        with self._lock:
            rows = self._db.execute(
                "SELECT DISTINCT pname FROM records WHERE substr(pkey, 1, ?) = ?", (len(prefix), prefix)
            ).fetchall()
        return sorted(name for (name,) in rows)

    def drop(self, partition: Partition) -> int:
        with self._lock:
            return self._db.execute("DELETE FROM records WHERE pkey = ?", (partition.key,)).rowcount

    def close(self) -> None:
        self._db.close()

    # Async: the same calls on a worker thread (aiosqlite does no more than this).
    async def aget(self, partition: Partition, names: Sequence[str]) -> builtins.list[Record | None]:
        return await asyncio.to_thread(self.get, partition, names)

    async def awrite(
        self, partition: Partition, puts: Sequence[Put], deletes: Sequence[Delete] = ()
    ) -> WriteResult:
        return await asyncio.to_thread(self.write, partition, puts, deletes)

    async def alist(self, partition: Partition, query: ListQuery) -> builtins.list[Record]:
        return await asyncio.to_thread(self.list, partition, query)

    async def apartitions(self, user: str, space: str) -> builtins.list[str]:
        return await asyncio.to_thread(self.partitions, user, space)

    async def adrop(self, partition: Partition) -> int:
        return await asyncio.to_thread(self.drop, partition)
