"""Sync and async without duplicated logic.

Every multi-step semantic (conditional writes, append-only checks, digest
verification, the LangGraph saver's reads and writes) is written once as a
generator that yields backend operations and receives their results, through
the typed helpers of :mod:`checkpointers.backends.ops` (``get``, ``write``,
``listing``, ``partitions``, ``drop``, ``parallel``). ``run`` drives such a
flow with a backend's sync methods, ``arun`` with its async methods; neither
knows what the flow does::

    def append_flow(partition, put):
        result = yield from write(partition, [put])   # typed: a WriteResult
        ...

    run(append_flow(p, put), backend)          # sync
    await arun(append_flow(p, put), backend)   # async
"""

from __future__ import annotations

import hashlib
import itertools
import os
from collections.abc import Sequence

from ._names import Partition
from .backends.base import Delete, Mode, Put, Record, WriteResult, content_digest
from .backends.ops import (
    DropOp,
    Flow,
    GetOp,
    ListOp,
    Op,
    Parallel,
    PartitionsOp,
    SingleOp,
    Step,
    WriteOp,
    arun,
    drop,
    get,
    get_and_lists,
    listing,
    parallel,
    partitions,
    run,
    write,
)
from .errors import ConcurrencyError, CorruptItemError, StepMismatchError

__all__ = [
    "DELETE_ATTEMPTS",
    "DropOp",
    "Flow",
    "GetOp",
    "ListOp",
    "Op",
    "Parallel",
    "PartitionsOp",
    "SingleOp",
    "Step",
    "WriteOp",
    "arun",
    "delete_present_flow",
    "digest",
    "drop",
    "get",
    "get_and_lists",
    "listing",
    "make_put",
    "new_etag",
    "parallel",
    "partitions",
    "raise_conflict",
    "run",
    "verified",
    "write",
    "write_flow",
]

def digest(data: bytes) -> str:
    """SHA-256 hex digest: the content digest of every stored value."""
    return hashlib.sha256(data).hexdigest()


class _Etags:
    """Etags unique across processes: a random 96-bit prefix per process + a counter.

    Cheaper than drawing random bytes per write (a system call each); the
    prefix is drawn again in a forked child so parent and child never share it.
    """

    def __init__(self) -> None:
        self.reset()
        os.register_at_fork(after_in_child=self.reset)

    def reset(self) -> None:
        self.prefix = os.urandom(12).hex()
        self.counter = itertools.count()

    def __call__(self) -> str:
        return f"{self.prefix}{next(self.counter):08x}"


_ETAGS = _Etags()


def new_etag() -> str:
    """A fresh etag; every applied write gets a new one (a plain function: cheaper to call than ``_ETAGS()``)."""
    return f"{_ETAGS.prefix}{next(_ETAGS.counter):08x}"


def make_put(
    name: str,
    value: bytes,
    *,
    tags: dict[str, str] | None = None,
    mode: Mode = Mode.UPSERT,
    if_match: str | None = None,
    staged: bool = False,
) -> Put:
    """Build an unsealed :class:`Put` (content digest only) with a new etag.

    For backend-level code and tests; the store, the savers and the adapters
    write sealed records (:meth:`checkpointers._integrity.Integrity.put`).
    """
    return Put(name, value, digest(value), new_etag(), tags or {}, mode, if_match, staged)


def verified(record: Record, label: str | None = None) -> Record:
    """Return ``record`` if its value matches its digest, else raise CorruptItemError."""
    if digest(record.value) != record.digest:
        raise CorruptItemError(label or record.name, "content does not match its sha256 digest")
    return record


def raise_conflict(
    result: WriteResult,
    puts: Sequence[Put],
    deletes: Sequence[Delete],
    labels: Sequence[str] | None = None,
) -> None:
    """Turn a refused batch into the error its condition calls for.

    ``labels`` gives the caller-facing name of each put then delete (defaults to
    the backend names), so messages name the user's key, not an encoding.
    """
    c = result.conflict
    if c is None:
        return
    label = labels[c.index] if labels else c.name
    actual = c.existing.etag if c.existing else None
    if c.index >= len(puts):
        raise ConcurrencyError(label, deletes[c.index - len(puts)].if_match, actual)
    put = puts[c.index]
    if put.mode is Mode.APPEND and c.existing is not None:
        raise StepMismatchError(label, content_digest(c.existing.digest), content_digest(put.digest))
    if put.mode is Mode.CREATE:
        raise ConcurrencyError(label, None, actual)
    raise ConcurrencyError(label, put.if_match, actual)


def write_flow(
    partition: Partition,
    puts: Sequence[Put],
    deletes: Sequence[Delete] = (),
    labels: Sequence[str] | None = None,
) -> Flow[list[Record]]:
    """Write one atomic batch; raise the matching error if a condition fails."""
    result = yield from write(partition, tuple(puts), tuple(deletes))
    raise_conflict(result, puts, deletes, labels)
    return list(result.records)


#: How often :func:`delete_present_flow` reads again when the record keeps changing under it.
DELETE_ATTEMPTS = 16


def delete_present_flow(partition: Partition, name: str, label: str) -> Flow[bool]:
    """Delete record ``name`` if present; return whether *this call* deleted it.

    The delete is conditioned on the etag just read, and read again if the
    record changed in between, so of concurrent deletes exactly one returns
    True. After :data:`DELETE_ATTEMPTS` changes in a row: ``ConcurrencyError``.
    """
    expected: str | None = None
    changed: str | None = None
    for _ in range(DELETE_ATTEMPTS):
        (record,) = yield from get(partition, [name])
        if record is None:
            return False
        expected = record.etag
        result = yield from write(partition, (), (Delete(name, expected),))
        if result.conflict is None:
            return True
        changed = result.conflict.existing.etag if result.conflict.existing else None
    raise ConcurrencyError(label, expected, changed)
