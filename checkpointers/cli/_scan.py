"""Reading one of our stores record by record, for the command line.

The saver's layout (:mod:`checkpointers._saver_flows`) puts a LangGraph
thread in one partition: ``c/<ns>/<id>`` checkpoint records, their writes as
children ``c/<ns>/<id>/<task>/<i>`` (``w/...`` in formats 1 and 2) and
``b/<sha256>`` blobs. Everything here goes through the backend interface
only, a page of records at a time, so memory does not grow with a thread's
history: a walk is a run of listings in name order, each starting at the last
name of the one before (``start`` is inclusive, so that record is dropped).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .._names import Partition
from .._saver_flows import SPACE
from ..backends.base import Backend, ListQuery, Record
from ..errors import CorruptItemError

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
    last: str | None = None
    while True:
        query = ListQuery(prefix=prefix, depth=depth, values=values, start=last, limit=page + (last is not None))
        got = backend.list(p, query)
        fresh = [r for r in got if r.name != last]
        yield from fresh
        if len(got) < query.limit or not fresh:  # type: ignore[operator]
            return
        last = fresh[-1].name


@dataclass(frozen=True)
class RecordKind:
    """What a record of a thread is, from its name."""

    kind: str  #: "checkpoint", "writes", "blob" or "unknown"
    owner: str | None = None  #: a writes record's checkpoint record name


def kind_of(name: str) -> RecordKind:
    """Classify a record of a LangGraph thread by its name (see the module docstring)."""
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


def walk_resilient(backend: Backend, p: Partition, *, page: int = PAGE) -> Iterator[Record | CorruptItemError]:
    """Like :func:`walk` over every record, but a record the backend cannot read is yielded as its error.

    A page that fails is listed again by name only and its records read one
    by one, so one damaged row does not hide the others.
    """
    last: str | None = None
    while True:
        limit = page + (last is not None)
        try:
            got: list[Record | CorruptItemError] = list(backend.list(p, ListQuery(start=last, limit=limit)))
        except CorruptItemError:
            got = list(_one_by_one(backend, p, last, limit))
        fresh = [r for r in got if (r.name if isinstance(r, Record) else r.key) != last]
        yield from fresh
        names = [r.name if isinstance(r, Record) else r.key for r in fresh]
        if len(got) < limit or not names:
            return
        last = names[-1]


def _one_by_one(backend: Backend, p: Partition, start: str | None, limit: int) -> Iterator[Record | CorruptItemError]:
    for head in backend.list(p, ListQuery(start=start, limit=limit, values=False)):
        try:
            (rec,) = backend.get(p, [head.name])
        except CorruptItemError as exc:
            yield CorruptItemError(head.name, exc.reason)
            continue
        if rec is not None:
            yield rec
