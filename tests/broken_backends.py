"""Deliberately broken backends (and one Store) that the conformance suite must catch.

Each one is the example backend of ``docs/backends.md`` with one realistic
mistake. ``tests/test_conformance_kit.py`` runs the suite against each and
asserts that it fails, naming the check that catches the mistake.

Also here: LangGraph savers and Agent Framework storages "for a user" that
share one store without isolating users (the suite must fail them) and that
keep one store per user (trivially isolated, the suite must pass them).
"""

from __future__ import annotations

import fnmatch
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from checkpointers import Store
from checkpointers._names import Partition, check_size
from checkpointers.backends.base import Delete, ListQuery, Mode, Put, Record, WriteResult, evaluate
from checkpointers.conformance.example_backend import ExampleBackend
from checkpointers.store import encode_value


class _Rekeyed(ExampleBackend):
    """The example backend, with partitions keyed by ``scheme`` instead of Partition.key."""

    scheme: type[Partition]

    def _re(self, p: Partition) -> Partition:
        return self.scheme(p.user, p.space, p.name)

    def get(self, partition: Partition, names: Sequence[str]) -> list[Record | None]:
        return super().get(self._re(partition), names)

    def write(self, partition: Partition, puts: Sequence[Put], deletes: Sequence[Delete] = ()) -> WriteResult:
        return super().write(self._re(partition), puts, deletes)

    def list(self, partition: Partition, query: ListQuery) -> list[Record]:
        return super().list(self._re(partition), query)

    def drop(self, partition: Partition) -> int:
        return super().drop(self._re(partition))

    def _all_partitions(self) -> list[tuple[str, str]]:
        with self._lock:
            return self._db.execute("SELECT DISTINCT pkey, pname FROM records").fetchall()


@dataclass(frozen=True)
class _RawKey(Partition):
    """``user/space/name`` from the raw ids, and the user prefix without a delimiter."""

    @property
    def user_key(self) -> str:
        return self.user

    @property
    def key(self) -> str:
        return f"{self.user}/{self.space}/{self.name}"


class UndelimitedPrefixBackend(_Rekeyed):
    """(i) Keys are raw ``user/space/name`` and a user's prefix is the bare user id.

    So ``alice`` lists ``alice2``'s partitions, and ids containing ``/`` collide.
    """

    scheme = _RawKey

    def partitions(self, user: str, space: str) -> list[str]:
        prefix = _RawKey(user, space, "").user_key
        return sorted(
            name for key, name in self._all_partitions()
            if key.startswith(prefix) and f"/{space}/" in key
        )


def _slash_escape(value: str) -> str:
    return value.replace("%", "%25").replace("/", "%2F")


@dataclass(frozen=True)
class _SlashEscaped(Partition):
    """Injective and delimited: only ``%`` and ``/`` are escaped (glob characters are not)."""

    @property
    def user_key(self) -> str:
        return f"{_slash_escape(self.user)}/{_slash_escape(self.space)}/"

    @property
    def key(self) -> str:
        return self.user_key + _slash_escape(self.name)


class GlobListingBackend(_Rekeyed):
    """(ii) Lists a user's partitions with an unescaped glob, like ``SCAN MATCH user/*``.

    A user id ``a*`` or ``[a]lice`` then matches ``alice``'s partitions.
    """

    scheme = _SlashEscaped

    def partitions(self, user: str, space: str) -> list[str]:
        pattern = _SlashEscaped(user, space, "").user_key + "*"
        return sorted(name for key, name in self._all_partitions() if fnmatch.fnmatchcase(key, pattern))


class NonAtomicBackend(ExampleBackend):
    """(iii) Applies a batch put by put and stops at the first conflict.

    The puts before the conflict stay written: a refused batch is half applied.
    """

    def write(self, partition: Partition, puts: Sequence[Put], deletes: Sequence[Delete] = ()) -> WriteResult:
        out: list[Record] = []
        ops: list[tuple[list[Put], list[Delete]]] = [([p], []) for p in puts] + [([], [d]) for d in deletes]
        for index, (put, delete) in enumerate(ops):
            result = super().write(partition, put, delete)
            if result.conflict is not None:
                return WriteResult([], replace(result.conflict, index=index))
            out.extend(result.records)
        return WriteResult(out)


class TornWriteBackend(ExampleBackend):
    """(iii') Checks every condition first, then writes the checkpoint before its blobs.

    Puts are applied last-first (the referencing record before the records it
    names), each in its own transaction, so a concurrent reader sees a batch
    half applied: a checkpoint whose blobs are not there yet.
    """

    def write(self, partition: Partition, puts: Sequence[Put], deletes: Sequence[Delete] = ()) -> WriteResult:
        existing = {r.name: r for r in self.get(partition, [p.name for p in puts] + [d.name for d in deletes]) if r}
        conflict, noops = evaluate(puts, deletes, existing)
        if conflict is not None:
            return WriteResult([], conflict)
        records: dict[int, Record] = {}
        for i in reversed(range(len(puts))):
            if i in noops:
                records[i] = existing[puts[i].name]
                continue
            records[i] = super().write(partition, [replace(puts[i], mode=Mode.UPSERT)]).records[0]
            time.sleep(0.002)  # the window a crash or a reader falls into
        if deletes:
            super().write(partition, [], [replace(d, if_match=None) for d in deletes])
        return WriteResult([records[i] for i in range(len(puts))])


class AppendOverwritesBackend(ExampleBackend):
    """(iv) Treats append-only puts as upserts: a recomputed step silently replaces the stored one."""

    def write(self, partition: Partition, puts: Sequence[Put], deletes: Sequence[Delete] = ()) -> WriteResult:
        puts = [replace(p, mode=Mode.UPSERT) if p.mode is Mode.APPEND else p for p in puts]
        return super().write(partition, puts, deletes)


class ConditionAfterWriteBackend(ExampleBackend):
    """(v') Writes first, checks the conditions after: reports the conflict but keeps the write."""

    def write(self, partition: Partition, puts: Sequence[Put], deletes: Sequence[Delete] = ()) -> WriteResult:
        existing = {r.name: r for r in self.get(partition, [p.name for p in puts] + [d.name for d in deletes]) if r}
        applied = super().write(
            partition, [replace(p, mode=Mode.UPSERT) for p in puts], [replace(d, if_match=None) for d in deletes]
        )
        conflict, _ = evaluate(puts, deletes, existing)
        return applied if conflict is None else WriteResult([], conflict)


class CapAfterWriteStore(Store):
    """(v) A Store that checks the size cap after writing (e.g. measuring what it stored).

    The error is right (key, size, limit) but the oversized item is already in the store.
    """

    def for_user(self, user: str) -> CapAfterWriteStore:
        return CapAfterWriteStore(self.backend, user=user, max_item_bytes=self.max_item_bytes)

    def _uncapped(self) -> Store:
        return Store(self.backend, user=self.user, max_item_bytes=1 << 40)

    def _check_after(self, key: str, value: Any) -> None:
        check_size(key, len(encode_value(key, value, 1 << 40)) - 1, self.max_item_bytes)

    def set_item(self, scope: str, key: str, value: Any, **kwargs: Any) -> Any:
        item = self._uncapped().set_item(scope, key, value, **kwargs)
        self._check_after(key, value)
        return item

    async def aset_item(self, scope: str, key: str, value: Any, **kwargs: Any) -> Any:
        item = await self._uncapped().aset_item(scope, key, value, **kwargs)
        self._check_after(key, value)
        return item


# -- framework faces -----------------------------------------------------------

_SHARED: dict[str, Any] = {}
_PER_USER: dict[tuple[str, str], Any] = {}


def shared_saver(user: str) -> Any:
    """Every user gets the same InMemorySaver: no isolation at all."""
    from langgraph.checkpoint.memory import InMemorySaver

    return _SHARED.setdefault("saver", InMemorySaver())


def per_user_saver(user: str) -> Any:
    """One InMemorySaver per user: isolated (trivially); lacks the optional methods."""
    from langgraph.checkpoint.memory import InMemorySaver

    return _PER_USER.setdefault(("saver", user), InMemorySaver())


def shared_storage(user: str) -> Any:
    """Every user gets the same InMemoryCheckpointStorage: no isolation at all."""
    from agent_framework import InMemoryCheckpointStorage

    return _SHARED.setdefault("storage", InMemoryCheckpointStorage())


def per_user_storage(user: str) -> Any:
    """One InMemoryCheckpointStorage per user: isolated (trivially)."""
    from agent_framework import InMemoryCheckpointStorage

    return _PER_USER.setdefault(("storage", user), InMemoryCheckpointStorage())


__all__ = [
    "AppendOverwritesBackend",
    "CapAfterWriteStore",
    "ConditionAfterWriteBackend",
    "GlobListingBackend",
    "NonAtomicBackend",
    "TornWriteBackend",
    "UndelimitedPrefixBackend",
    "per_user_saver",
    "per_user_storage",
    "shared_saver",
    "shared_storage",
]
