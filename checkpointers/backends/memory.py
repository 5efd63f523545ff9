"""In-process backend for tests and quick starts (nothing survives the process)."""

from __future__ import annotations

import bisect
import builtins
import itertools
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from .._names import Partition
from .base import (
    Backend,
    Delete,
    ExpiredPartition,
    ListQuery,
    Put,
    Record,
    WriteResult,
    check_batch,
    children_range,
    evaluate,
    unchanged_reput,
    users_of,
)

__all__ = ["MemoryBackend"]


class _Part:
    """One partition: records in seq order plus a sorted list of names.

    ``records`` is a dict kept in write order (a rewrite moves the name to the
    end), so iterating it, or ``reversed()`` of it, walks seq order; ``names``
    is kept sorted with ``bisect`` for name order and prefix ranges. Both make
    "newest N" and "prefix range" walks stop after N matches instead of
    sorting the whole partition. :meth:`MemoryBackend.write` keeps both
    itself (its hot loop); ``delete`` removes a record from both.
    """

    __slots__ = ("names", "raw", "records")

    def __init__(self, raw: str) -> None:
        self.raw = raw
        self.records: dict[str, Record] = {}
        self.names: list[str] = []

    def delete(self, name: str) -> None:
        if self.records.pop(name, None) is not None:
            del self.names[bisect.bisect_left(self.names, name)]

    def children(self, name: str) -> list[Record]:
        """The records named ``<name>/...``, in name order."""
        lo, hi = children_range(name)
        i, j = bisect.bisect_left(self.names, lo), bisect.bisect_left(self.names, hi)
        return [self.records[n] for n in self.names[i:j]]

    def walk(self, query: ListQuery) -> Iterator[Record]:
        """Seq-order candidates (every record, every filter still to apply); name order is :func:`_name_walk`."""
        # Consumed under the backend lock (see ``list``): no copy needed.
        return iter(reversed(self.records.values()) if query.descending else self.records.values())


def _prefix_end(prefix: str) -> str | None:
    """The lowest string above every string starting with ``prefix`` (None: no bound, as for ``""``).

    ``prefix`` without its trailing U+10FFFF characters, its last character
    then one code point up: a string ``>= prefix`` and below this starts
    with ``prefix``. (``prefix + "\U0010ffff"`` would leave out the names
    that continue with U+10FFFF.)
    """
    stem = prefix.rstrip("\U0010ffff")
    return stem[:-1] + chr(ord(stem[-1]) + 1) if stem else None


def _name_walk(part: _Part, query: ListQuery, found: list[Record]) -> list[Record]:
    """A name-order listing of ``part`` into ``found`` (under the backend lock).

    Exactly the names under the prefix (``[prefix, _prefix_end(prefix))``)
    and in the start/stop range, walked by index in place: only depth and
    tags are left to check; a pick's children are bisected for from its own
    index on.
    """
    names, records = part.names, part.records
    lo = query.prefix
    if query.start is not None and str(query.start) > lo:
        lo = str(query.start)
    i = bisect.bisect_left(names, lo)
    end = _prefix_end(query.prefix)
    j = len(names) if end is None else bisect.bisect_left(names, end, i)
    if query.stop is not None:
        j = min(j, bisect.bisect_left(names, str(query.stop), i))
    depth, tags, at, limit = query.depth, query.tags, len(query.prefix), query.limit
    values, children, count = query.values, query.children, 0
    for k in range(j - 1, i - 1, -1) if query.descending else range(i, j):
        name = names[k]
        if depth is not None and name.count("/", at) != depth:
            continue
        record = records[name]
        if tags and not all(record.tags.get(t) == v for t, v in tags.items()):
            continue
        found.append(record if values else _without_value(record))
        if children:
            # From the pick's own index on (not always right after it:
            # ``name-x`` sorts between ``name`` and ``name/``).
            first, past = children_range(name)
            c = bisect.bisect_left(names, first, k + 1)
            kids = [records[n] for n in names[c : bisect.bisect_left(names, past, c)]]
            found.extend(kids if values else map(_without_value, kids))
        count += 1
        if limit is not None and count >= limit:
            break
    return found


#: What ``evaluate`` checks a batch against in a partition not yet created.
_NO_RECORDS: dict[str, Record] = {}


def _without_value(record: Record) -> Record:
    """``record`` with ``value=b""`` (``dataclasses.replace`` costs several times more per record)."""
    return Record(record.name, b"", record.tags, record.etag, record.digest, record.seq)


class MemoryBackend(Backend):
    """Partitions in a dict guarded by one lock; async methods call the sync ones.

    Keys are the encoded :attr:`Partition.key`, exactly as the persistent
    backends key their data, so the isolation suite exercises the encoding.
    """

    kind = "memory"
    inline_conditions = True  # one lock around the whole batch

    def __init__(
        self, *, ttl: float | None = None, refresh_on_read: bool = False, clock: Callable[[], float] | None = None
    ) -> None:
        self._set_retention(ttl, refresh_on_read, clock)
        self._data: dict[str, _Part] = {}
        self._users: dict[str, set[str]] = {}  # user_key -> partition keys
        self._expiry: dict[str, float] = {}  # partition key -> expires_at (absent: never)
        self._seq = itertools.count(1)
        self._lock = threading.Lock()

    def _live(self, partition: Partition, now: float | None = None) -> _Part | None:
        """The partition if present and not expired (a read; refreshed when due). Under the lock.

        ``now`` None: the clock is read only for a partition with an expiry (the only one it can change).
        """
        key = partition.key
        part = self._data.get(key)
        if part is None:
            return None
        expires_at = self._expiry.get(key)
        if expires_at is None:  # never expires, nothing to refresh
            return part
        if now is None:
            now = self.retention.now()
        if self.retention.expired(expires_at, now):
            return None
        if self.retention.refresh_due(expires_at, now):
            self._expiry[key] = now + self.retention.ttl  # type: ignore[operator]
        return part

    def get(self, partition: Partition, names: Sequence[str]) -> list[Record | None]:
        with self._lock:
            part = self._live(partition)
            return [part.records.get(n) if part else None for n in names]

    def write(
        self, partition: Partition, puts: Sequence[Put], deletes: Sequence[Delete] = ()
    ) -> WriteResult:
        # The hot path of every put: one pass to check (``evaluate``), one to
        # apply, with the partition's dict and name list held in locals.
        check_batch(puts, deletes)
        key = partition.key
        retention = self.retention
        with self._lock:
            expires_at = self._expiry.get(key)
            # The clock is read only when it matters: a stored expiry to check, or one to set.
            now = retention.now() if expires_at is not None or retention.ttl is not None else 0.0
            if expires_at is not None and retention.expired(expires_at, now):
                self._forget(partition)  # old data never comes back
            part = self._data.get(key)
            records = part.records if part is not None else _NO_RECORDS
            conflict, noops = evaluate(puts, deletes, records)
            if conflict is not None:
                return WriteResult(records=[], conflict=conflict)
            if part is None:
                part = self._data[key] = _Part(partition.name)
                self._users.setdefault(partition.user_key, set()).add(key)
                records = part.records
            names, seq = part.names, self._seq
            out: list[Record] = []
            for i, put in enumerate(puts):
                name = put.name
                stored = records.get(name)
                if stored is not None:
                    if i in noops or unchanged_reput(put, stored):  # kept as stored
                        out.append(stored)
                        continue
                    del records[name]  # re-inserted last: dict order is seq order
                else:
                    bisect.insort(names, name)
                rec = records[name] = Record(name, put.value, dict(put.tags), put.etag, put.digest, next(seq))
                out.append(rec)
            for d in deletes:
                part.delete(d.name)
            # The partition's new expiry, or its removal when empty.
            if not records:
                self._forget(partition)
            elif retention.ttl is not None:
                self._expiry[key] = now + retention.ttl
            elif expires_at is not None:  # written with a ttl before set_retention dropped it
                self._expiry.pop(key, None)
        if self._pacer.interval is not None:  # no ttl: never due (saves a call per write)
            self._auto_sweep()
        return WriteResult(out)

    def list(self, partition: Partition, query: ListQuery) -> list[Record]:
        found: list[Record] = []
        if query.limit == 0:
            return found
        with self._lock:
            part = self._live(partition)
            if part is None:
                return found
            if query.order == "name":
                return _name_walk(part, query, found)
            count = 0
            for record in part.walk(query):
                if query.matches(record):
                    found.append(record if query.values else _without_value(record))
                    if query.children:
                        kids = part.children(record.name)
                        found.extend(kids if query.values else map(_without_value, kids))
                    count += 1
                    if query.limit is not None and count >= query.limit:
                        break
        return found

    def partitions(self, user: str, space: str) -> builtins.list[str]:
        probe = Partition(user, space, "")
        now = self.retention.now()
        with self._lock:
            keys = self._users.get(probe.user_key, ())
            return sorted(self._data[k].raw for k in keys if not self.retention.expired(self._expiry.get(k), now))

    def drop(self, partition: Partition) -> int:
        now = self.retention.now()
        with self._lock:
            part = self._live(partition, now)
            self._forget(partition)
            return len(part.records) if part else 0

    def _forget(self, partition: Partition) -> None:
        self._data.pop(partition.key, None)
        self._expiry.pop(partition.key, None)
        self._users.get(partition.user_key, set()).discard(partition.key)

    def expired(self, limit: int = 1000) -> builtins.list[ExpiredPartition]:
        now = self.retention.now()
        with self._lock:
            due = sorted((at, key) for key, at in self._expiry.items() if at <= now)[:limit]
            return [self._described(key, at) for at, key in due]

    def _described(self, key: str, expires_at: float) -> ExpiredPartition:
        user_key = key[: key.rindex("/", 0, len(key)) + 1]
        return ExpiredPartition(key, user_key, self._data[key].raw, expires_at)

    def sweep(self, limit: int = 1000) -> int:
        now = self.retention.now()
        with self._lock:  # the check and the removal in one step
            due = sorted((at, key) for key, at in self._expiry.items() if at <= now)[:limit]
            for _, key in due:
                user_key = key[: key.rindex("/") + 1]
                self._data.pop(key, None)
                self._expiry.pop(key, None)
                self._users.get(user_key, set()).discard(key)
            return len(due)

    def users(self, space: str | None = None) -> builtins.list[str]:
        now = self.retention.now()
        with self._lock:
            held = [
                uk
                for uk, keys in self._users.items()
                if any(not self.retention.expired(self._expiry.get(k), now) for k in keys)
            ]
        return users_of(held, space)

    async def asweep(self, limit: int = 1000) -> int:
        return self.sweep(limit)

    async def aexpired(self, limit: int = 1000) -> builtins.list[ExpiredPartition]:
        return self.expired(limit)

    async def ausers(self, space: str | None = None) -> builtins.list[str]:
        return self.users(space)

    def expiry(self, partition: Partition) -> float | None:
        with self._lock:
            return self._expiry.get(partition.key)

    async def aget(self, partition: Partition, names: Sequence[str]) -> builtins.list[Record | None]:
        return self.get(partition, names)

    async def amany(self, ops: Sequence[Any]) -> builtins.list[Any]:
        """One by one, as :meth:`many`: each operation is done at its first step (no I/O to overlap).

        The default's ``asyncio.gather`` would wrap each in a Task for nothing
        (nearly all of an async listing's cost over the sync one). Each still
        runs through its ``acall``, so a subclass's async methods are used.
        """
        return [await op.acall(self) for op in ops]

    async def awrite(
        self, partition: Partition, puts: Sequence[Put], deletes: Sequence[Delete] = ()
    ) -> WriteResult:
        return self.write(partition, puts, deletes)

    async def alist(self, partition: Partition, query: ListQuery) -> builtins.list[Record]:
        return self.list(partition, query)

    async def apartitions(self, user: str, space: str) -> builtins.list[str]:
        return self.partitions(user, space)

    async def adrop(self, partition: Partition) -> int:
        return self.drop(partition)
