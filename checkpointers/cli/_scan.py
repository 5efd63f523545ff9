"""Reading one of our stores record by record, for the command line.

The saver's layout (:mod:`checkpointers._saver_flows`) puts a LangGraph
thread in one partition: ``c/<ns>/<id>`` checkpoint records, their writes as
children ``c/<ns>/<id>/<task>/<i>`` (``w/...`` in formats 1 and 2) and
``b/<sha256>`` blobs. Everything here goes through the backend interface
only, a page of records at a time, so memory does not grow with a thread's
history: a walk is a run of listings in name order, each starting right after
the last name of the one before.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .._names import Partition
from .._saver_flows import SPACE
from ..backends.base import Backend, ListQuery, Record
from ..errors import CorruptItemError
from ..leases import LEASE_NAME

__all__ = [
    "PAGE",
    "RecordKind",
    "decode_checkpoint",
    "kind_of",
    "layout_of",
    "thread_partitions",
    "walk",
    "walk_resilient",
]

#: Records per listing.
PAGE = 256
CKPT, OLD_WRITES, BLOB = "c/", "w/", "b/"
#: The lowest character of the name alphabet (``[A-Za-z0-9_%/-]``, see :mod:`checkpointers.backends.base`):
#: ``name + _LOWEST`` is below every name that sorts after ``name``, and above ``name``.
_LOWEST = "%"


def layout_of(saver: Any) -> Any:
    """The object holding the saver's record layout and its flows (``_pending``, ``_load``, ``_collect_flow``...).

    The saver itself, or the ``layout`` it holds (where the flows are a
    :class:`~checkpointers._saver_flows.CheckpointLayout` of their own).
    """
    return getattr(saver, "layout", saver)


def decode_checkpoint(saver: Any, p: Partition, record: Record) -> Any:
    """The saver's decoding of a checkpoint record (its ``ns``, ``cid``, ``parent``, ``checkpoint``,
    ``metadata``, ``blobs`` and ``inline``), channel values not loaded; damage raises ``CorruptItemError``."""
    layout = layout_of(saver)
    decode = getattr(layout, "_decode_checkpoint", None) or layout._stored
    return decode(p, record)


def thread_partitions(backend: Backend, user: str) -> list[Partition]:
    """The LangGraph threads of ``user``, in name order."""
    return [Partition(user, SPACE, name) for name in sorted(backend.partitions(user, SPACE))]


def walk(
    backend: Backend,
    p: Partition,
    prefix: str = "",
    *,
    depth: int | None = None,
    values: bool = True,
    page: int = PAGE,
) -> Iterator[Record]:
    """Every record of ``p`` under ``prefix`` (at ``depth``), ascending by name, ``page`` per listing."""
    start: str | None = None
    while True:
        got = backend.list(p, ListQuery(prefix=prefix, depth=depth, values=values, start=start, limit=page))
        yield from got
        if len(got) < page:
            return
        start = got[-1].name + _LOWEST


@dataclass(frozen=True)
class RecordKind:
    """What a record of a thread is, from its name."""

    kind: str  #: "checkpoint", "writes", "blob" or "unknown"
    owner: str | None = None  #: a writes record's checkpoint record name


def kind_of(name: str) -> RecordKind:
    """Classify a record of a LangGraph thread by its name (see the module docstring)."""
    if name == LEASE_NAME:
        return RecordKind("lease")
    if name.startswith(BLOB):
        return RecordKind("blob")
    if name.startswith(OLD_WRITES) and name.count("/") == 4:
        head = name.rsplit("/", 2)[0]
        return RecordKind("writes", CKPT + head[len(OLD_WRITES) :])
    if name.startswith(CKPT):
        slashes = name.count("/")
        if slashes == 2:
            return RecordKind("checkpoint")
        if slashes == 4:
            return RecordKind("writes", name.rsplit("/", 2)[0])
    return RecordKind("unknown")


def walk_resilient(
    backend: Backend, p: Partition, start: str | None = None, stop: str | None = None, *, page: int = PAGE
) -> Iterator[Record | CorruptItemError]:
    """Every record of ``p`` in ``[start, stop)`` by name, a record the backend refuses yielded as its error.

    When a listing fails on a damaged record that the error names, the
    records before it are walked on their own, the error is yielded in its
    place and the walk goes on after it; so one damaged row does not hide
    the others. An error that names no record of the range is raised.
    """
    while True:
        try:
            got = backend.list(p, ListQuery(start=start, stop=stop, limit=page))
        except CorruptItemError as exc:
            where = exc.key
            if (start is not None and where < start) or (stop is not None and where >= stop):
                raise
            yield from walk_resilient(backend, p, start, where, page=page)
            yield exc
            start = where + _LOWEST
            continue
        yield from got
        if len(got) < page:
            return
        start = got[-1].name + _LOWEST
