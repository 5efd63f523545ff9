"""In-process backend for tests and quick starts (nothing survives the process)."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence

from .._names import Partition
from .base import (
    Backend,
    Delete,
    ListQuery,
    Put,
    Record,
    WriteResult,
    check_batch,
    evaluate,
)

__all__ = ["MemoryBackend"]


class MemoryBackend(Backend):
    """A dict of partitions guarded by one lock; async methods call the sync ones.

    Keys are the encoded :attr:`Partition.key`, exactly as the persistent
    backends key their data, so the isolation suite exercises the encoding.
    """

    kind = "memory"

    def __init__(self) -> None:
        self._data: dict[str, dict[str, Record]] = {}
        self._names: dict[str, dict[str, str]] = {}  # user_key -> {partition key: raw name}
        self._seq = itertools.count(1)
        self._lock = threading.Lock()

    def get(self, partition: Partition, names: Sequence[str]) -> list[Record | None]:
        with self._lock:
            records = self._data.get(partition.key, {})
            return [records.get(n) for n in names]

    def write(
        self, partition: Partition, puts: Sequence[Put], deletes: Sequence[Delete] = ()
    ) -> WriteResult:
        check_batch(puts, deletes)
        with self._lock:
            records = self._data.get(partition.key, {})
            conflict, noops = evaluate(puts, deletes, records)
            if conflict is not None:
                return WriteResult(records=[], conflict=conflict)
            records = self._data.setdefault(partition.key, {})
            self._names.setdefault(partition.user_key, {})[partition.key] = partition.name
            out: list[Record] = []
            for i, put in enumerate(puts):
                if i in noops:
                    out.append(records[put.name])
                    continue
                rec = Record(put.name, put.value, dict(put.tags), put.etag, put.digest, next(self._seq))
                records[put.name] = rec
                out.append(rec)
            for d in deletes:
                records.pop(d.name, None)
            if not records:
                self._forget(partition)
            return WriteResult(records=out)

    def list(self, partition: Partition, query: ListQuery) -> list[Record]:
        with self._lock:
            found = [r for r in self._data.get(partition.key, {}).values() if query.matches(r)]
        found.sort(key=query.sort_key, reverse=query.descending)
        if query.limit is not None:
            found = found[: query.limit]
        if not query.values:
            found = [Record(r.name, b"", r.tags, r.etag, r.digest, r.seq) for r in found]
        return found

    def partitions(self, user: str, space: str) -> list[str]:
        probe = Partition(user, space, "")
        with self._lock:
            return sorted(self._names.get(probe.user_key, {}).values())

    def drop(self, partition: Partition) -> int:
        with self._lock:
            n = len(self._data.get(partition.key, {}))
            self._forget(partition)
            return n

    def _forget(self, partition: Partition) -> None:
        self._data.pop(partition.key, None)
        self._names.get(partition.user_key, {}).pop(partition.key, None)

    async def aget(self, partition: Partition, names: Sequence[str]) -> list[Record | None]:
        return self.get(partition, names)

    async def awrite(
        self, partition: Partition, puts: Sequence[Put], deletes: Sequence[Delete] = ()
    ) -> WriteResult:
        return self.write(partition, puts, deletes)

    async def alist(self, partition: Partition, query: ListQuery) -> list[Record]:
        return self.list(partition, query)

    async def apartitions(self, user: str, space: str) -> list[str]:
        return self.partitions(user, space)

    async def adrop(self, partition: Partition) -> int:
        return self.drop(partition)
