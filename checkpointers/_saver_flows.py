"""The LangGraph saver's storage layout and its flows, written once.

Everything of one LangGraph thread lives in one partition
``Partition(user, "langgraph", thread_id)``, so a thread is one atomic unit
and ``delete_thread`` is one ``drop``. Inside it (``<x>`` is
:func:`~checkpointers._names.encode_component` of a caller's value, so names
never contain a caller's ``/`` and two different values never share a name)::

    c/<ns>/<checkpoint id>                 checkpoint record      APPEND
    c/<ns>/<checkpoint id>/<task id>/<i>   a task's writes        APPEND (i >= 0: the regular writes
                                                                  of one put_writes call, packed)
                                                                  UPSERT (i < 0: one special write)
    b/<sha256>                             a channel value        APPEND, staged

A checkpoint's writes are its *children* in the name tree, so "the latest
checkpoint with its pending writes" is one listing
(``ListQuery(depth=0, children=True)``): one SQLite read transaction, one
Redis script, one S3 LIST (an S3 key's children sort right next to it).
Listings of checkpoints alone say ``depth``. Records of format 1 and 2 had
their writes under ``w/<ns>/<checkpoint id>/``; they are still read there.

A checkpoint record holds the checkpoint without its channel values, the
merged metadata, the parent id and, per channel with a value, the digest of
the blob holding it. Blobs are content-addressed: a value that does not change
between checkpoints (or between threads copied from one another) is stored
once. Blob puts come first in the batch and the checkpoint record last, so a
backend that writes staged records ahead of the atomic unit (S3) never shows a
checkpoint whose blobs are missing.

Metadata scalars become tags (``m.<key>`` -> canonical JSON) so ``list(filter=)``
can push them down; see :func:`metadata_tags` for why the pushdown never
misses a record. Checkpoint ids are LangGraph's uuid6 strings, which sort by
time, and ``encode_component`` keeps ``[A-Za-z0-9_-]`` as is, so name order
is time order and the latest checkpoint is one ``list(limit=1)``.

The module is in two parts. Pure planners (no I/O, tested on their own in
``tests/test_saver_plan.py``): the names and tags above, where each channel
value of a put goes (:class:`ChannelPlan`,
:func:`checkpoint_payload`), which writes are special (:func:`split_writes`),
which listings a load needs (:func:`writes_queries`, :func:`writes_by_owner`)
and the bounded list walks (:func:`list_starts`, :func:`list_next`, ...).
Then :class:`CheckpointLayout`, the object a saver holds (serializer, size
cap, seals, the :class:`ParentChannels` cache, the :class:`VerifiedRecords` memo),
whose methods are the flows:
generators of backend operations yielded through the typed helpers of
:mod:`checkpointers.flows`, which the saver drives with ``run`` in its sync
methods and ``arun`` in its async ones.
"""

from __future__ import annotations

import json
import logging
import math
import operator
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from json.encoder import encode_basestring_ascii as _json_str
from typing import Any, NamedTuple, Protocol, TypeVar

from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    PendingWrite,
    writes_sort_key,
)
from langgraph.checkpoint.serde import jsonplus as _jsonplus
from langgraph.checkpoint.serde.base import SerializerProtocol
from ormsgpack import unpackb as _unpackb

from ._flows import (
    Flow,
    GetOp,
    ListOp,
    digest,
    get,
    get_and_lists,
    listing,
    new_etag,
    parallel,
    partitions,
    raise_conflict,
    write,
)
from ._integrity import Integrity
from ._names import MAX_TAG_KEY_LENGTH, MAX_TAG_VALUE_LENGTH, MAX_TAGS, Partition, check_size
from ._names import encode_component as enc
from ._serde import UNPACK_OPTION, SafeSerializer
from .backends.base import Delete, ListQuery, Mode, Put, Record, WriteResult, content_digest
from .errors import (
    ConcurrencyError,
    CorruptItemError,
    DisallowedTypeError,
    InvalidArgumentError,
    ItemTooLargeError,
    StepMismatchError,
    UnserializableValueError,
)

__all__ = [
    "SPACE",
    "BatchWriter",
    "CheckpointLayout",
    "CheckpointRecord",
    "LoadedCheckpoint",
    "ParentChannels",
    "VerifiedRecords",
    "WriteMismatch",
    "ckpt_name",
    "metadata_tags",
    "tag_value",
    "writes_prefix",
]

#: The partition space of every LangGraph thread.
SPACE = "langgraph"
_CKPT, _OLD_WRITE, _BLOB = "c/", "w/", "b/"
_TAG_PREFIX = "m."
_OVERFLOW = "~overflow"
#: Metadata keys always tagged first (``delete_for_runs`` relies on ``run_id``).
_PRIORITY = ("run_id", "source", "step")
#: Record format written. 1: every channel value in a blob. 2: also ``inline``,
#: small values kept inside the record. 3: writes are the record's children
#: only (1 and 2: also under ``w/``). All are read.
_FORMAT = 3
_FORMATS = (1, 2, 3)
#: Writes of records of formats below this may also be under ``w/``.
_CHILD_WRITES = 3
#: A channel value whose framed serialization is at most this many bytes is
#: kept inside the checkpoint record instead of a blob of its own (one record
#: less per put and per read: one SQLite row, Redis field or S3 request); at
#: most :data:`_INLINE_BUDGET` bytes of them per record, so records stay small
#: and the size cap keeps its meaning. The price: an unchanged inline value is
#: copied into each later record (at most the budget per record), where a blob
#: would be referenced. Raised from 256 B / 4 KiB: a ~1 KiB value now needs
#: no blob (SQLite put/s +10-15% on benchmark (b), two runs).
_INLINE_MAX = 2048
_INLINE_BUDGET = 8192
_CACHE_SIZE = 1024
#: Up to this many checkpoints of one namespace get one writes listing each;
#: more share one listing of the namespace's writes.
_PER_CHECKPOINT_LISTINGS = 64
#: Bytes a packed writes record needs besides its task id, task path and
#: writes (field names, framing), and an upper bound per write besides its
#: channel name and value (msgpack headers of the entry, index, name, bytes).
_PACK_OVERHEAD = 128
_WRITE_OVERHEAD = 24
#: Rounds of "write, find what is stored already, write the rest" in put_writes
#: before giving up with ConcurrencyError (each round means another writer
#: stored writes of the same task in between).
_WRITE_ATTEMPTS = 4
_APPEND = Mode.APPEND

logger = logging.getLogger("checkpointers.savers")
_T = TypeVar("_T")


# -- names --------------------------------------------------------------------


def ckpt_prefix(ns: str) -> str:
    """``c/<encoded ns>/``: where namespace ``ns``'s checkpoints are (remembered: every put and read names one)."""
    prefix = _NS_PREFIXES.get(ns)
    if prefix is None:
        prefix = f"{_CKPT}{enc(ns)}/"
        if len(_NS_PREFIXES) < _LATEST_KEPT:  # a graph has a handful of namespaces; never grow without bound
            _NS_PREFIXES[ns] = prefix
    return prefix


#: :func:`ckpt_prefix` by namespace, at most :data:`_LATEST_KEPT`.
_NS_PREFIXES: dict[str, str] = {}


def ckpt_name(ns: str, cid: str) -> str:
    return ckpt_prefix(ns) + enc(cid)


def writes_prefix(ns: str, cid: str) -> str:
    return f"{ckpt_prefix(ns)}{enc(cid)}/"  # ckpt_name(ns, cid) + "/"


def _old_writes_prefix(ns: str, cid: str) -> str:
    """Where records of formats 1 and 2 had their writes."""
    return f"{_OLD_WRITE}{enc(ns)}/{enc(cid)}/"


def _latest_query(ns: str) -> ListQuery:
    """The listing of namespace ``ns``'s latest checkpoint record and its writes (remembered: built once)."""
    q = _LATEST.get(ns)
    if q is None:
        q = ListQuery(prefix=ckpt_prefix(ns), depth=0, descending=True, limit=1, children=True)
        if len(_LATEST) < _LATEST_KEPT:  # a graph has a handful of namespaces per thread; never grow without bound
            _LATEST[ns] = q
    return q


#: :func:`_latest_query` by namespace (a ListQuery is immutable), at most :data:`_LATEST_KEPT`.
_LATEST: dict[str, ListQuery] = {}
_LATEST_KEPT = 256


#: Levels of the name tree below ``c/``: ``<ns>/<cid>`` and ``<ns>/<cid>/<task>/<i>``.
_CKPT_DEPTH, _WRITES_DEPTH = 1, 3


def _is_writes(name: str) -> bool:
    """A writes record's name, in either layout."""
    return name.startswith(_OLD_WRITE) or (name.startswith(_CKPT) and name.count("/") == _WRITES_DEPTH + 1)


def _owner(name: str) -> str:
    """The checkpoint record a writes record belongs to (either layout)."""
    head = name.rsplit("/", 2)[0]
    return _CKPT + head[len(_OLD_WRITE) :] if head.startswith(_OLD_WRITE) else head


def _blob_name(digest_: str) -> str:
    return _BLOB + digest_


def _mode_of(name: str) -> Mode:
    """The write mode a record of this name was written with (used by copy)."""
    if _is_writes(name) and name.rsplit("/", 1)[1].startswith("-"):
        return Mode.UPSERT
    return Mode.APPEND


# -- metadata tags ------------------------------------------------------------


def tag_value(value: object) -> str | None:
    """Canonical JSON of a scalar, or None if ``value`` cannot be a tag.

    Equal scalars get equal encodings (``True``, ``1`` and ``1.0`` all give
    ``"1"``, as they are ``==`` in Python) and unequal ones different
    encodings (``"1"`` gives ``'"1"'``), so a tag match is exactly a Python
    ``==`` match. NaN (never equal to anything) and values over the tag length
    limit are not tags.
    """
    if isinstance(value, bool):
        out = str(int(value))
    elif isinstance(value, int):
        if value.bit_length() > 1024:  # str() of a huge int is slow or refused: not a tag
            return None
        out = str(int(value))
    elif isinstance(value, float):
        if math.isnan(value):
            return None
        out = str(int(value)) if value.is_integer() else json.dumps(float(value))
    elif isinstance(value, str):
        out = _json_str(str(value))  # == json.dumps(value), without building an encoder
    else:
        return None
    return out if len(out) <= MAX_TAG_VALUE_LENGTH else None


def _tag_key(key: object) -> str | None:
    """``m.<key>``, or None when ``key`` cannot be a tag key (remembered for the few keys metadata has)."""
    known = _TAG_KEYS.get(key) if type(key) is str else None
    if known is not None:
        return known
    if not isinstance(key, str) or "\x00" in key:
        return None
    out = _TAG_PREFIX + key
    if len(out) > MAX_TAG_KEY_LENGTH:
        return None
    if len(_TAG_KEYS) < _TAG_KEYS_KEPT and type(key) is str:
        _TAG_KEYS[key] = out
    return out


#: Tag keys of metadata keys seen (str keys only), at most :data:`_TAG_KEYS_KEPT`.
_TAG_KEYS: dict[str, str] = {}
_TAG_KEYS_KEPT = 256
#: Ints this small are tagged as ``str(value)`` directly (what :func:`tag_value` gives them).
_SMALL_INT = 2**63


def metadata_tags(metadata: Mapping[str, Any]) -> dict[str, str]:
    """The tags of a checkpoint record: its taggable metadata scalars.

    Up to 16 taggable keys are all tagged. With more, the ``run_id``,
    ``source`` and ``step`` keys and then the others by name fill 15 tags and
    the 16th marks the record ``~overflow``. A filter is pushed down as two
    queries, records carrying every filtered tag and ``~overflow`` records,
    so a record that matches is always found; results are then checked
    against the full filter, so both paths give exactly the brute-force result.
    """
    eligible: dict[str, str] = {}
    known = _TAG_KEYS
    for key, value in metadata.items():
        tkey = known.get(key) if type(key) is str else None  # nearly every key: no call
        if tkey is None:
            tkey = _tag_key(key)
            if tkey is None:
                continue
        kind = type(value)  # the common kinds inline; tag_value gives the same for them
        if kind is str:
            tval: str | None = _json_str(value)
            if len(tval) > MAX_TAG_VALUE_LENGTH:  # type: ignore[arg-type]
                continue
        elif kind is int and -_SMALL_INT < value < _SMALL_INT:
            tval = str(value)
        elif kind is dict or value is None:  # never a tag ("parents" is a dict)
            continue
        else:
            tval = tag_value(value)
            if tval is None:
                continue
        eligible[tkey] = tval  # type: ignore[assignment]
    if len(eligible) <= MAX_TAGS:
        return eligible
    first = [_TAG_PREFIX + k for k in _PRIORITY if _TAG_PREFIX + k in eligible]
    order = first + sorted(k for k in eligible if k not in first)
    tags = {k: eligible[k] for k in order[: MAX_TAGS - 1]}
    tags[_OVERFLOW] = "1"
    return tags


def _filter_queries(
    prefix: str,
    flt: Mapping[str, Any],
    *,
    depth: int,
    descending: bool,
    stop: str | None,
    limit: int | None,
    children: bool = False,
) -> list[ListQuery]:
    """The queries whose union holds every checkpoint record matching ``flt`` (see above).

    ``children``: a query with a limit also returns the writes of what it picks.
    """
    pushed: dict[str, str] = {}
    for key, value in flt.items():
        tkey, tval = _tag_key(key), tag_value(value)
        if tkey is not None and tval is not None:
            pushed[tkey] = tval
    exact = len(pushed) == len(flt)  # every filter key is in the tags: no post-filter loss
    bound = limit if exact else None
    main = ListQuery(
        prefix=prefix,
        descending=descending,
        stop=stop,
        tags=pushed,
        limit=bound,
        depth=depth,
        children=children and bound is not None,
    )
    if not pushed:
        return [main]
    always = {k: v for k, v in pushed.items() if k[len(_TAG_PREFIX) :] in _PRIORITY}
    overflow = ListQuery(
        prefix=prefix, descending=descending, stop=stop, tags={_OVERFLOW: "1", **always}, depth=depth
    )
    return [main, overflow]


def matches(metadata: Mapping[str, Any], flt: Mapping[str, Any] | None) -> bool:
    """The brute-force filter: every key equal (``==``), as LangGraph's savers do."""
    return not flt or all(k in metadata and metadata[k] == v for k, v in flt.items())


# -- records ------------------------------------------------------------------


class CheckpointRecord(NamedTuple):
    """A decoded checkpoint record (channel values not loaded yet).

    A NamedTuple, as :class:`LoadedCheckpoint`: one is built per checkpoint
    read, and a tuple is cheaper to build than a frozen dataclass.
    """

    name: str
    ns: str
    cid: str
    parent: str | None
    checkpoint: dict[str, Any]
    metadata: dict[str, Any]
    blobs: dict[str, str]
    inline: dict[str, bytes]
    format: int = _FORMAT


class LoadedCheckpoint(NamedTuple):
    """A checkpoint with its channel values and pending writes, ready to return."""

    thread: str
    ns: str
    cid: str
    parent: str | None
    checkpoint: Checkpoint
    metadata: CheckpointMetadata
    pending_writes: list[PendingWrite]


@dataclass(frozen=True)
class WriteMismatch:
    """A regular write re-written with a different value; the stored one was kept.

    ``kind`` is ``"edit"`` when the re-write carries no task path (what
    ``update_state``, forks and ``Command(resume=..., update=...)`` send) and
    ``"recomputation"`` when a task re-ran and produced something else (two
    workers that ran the same task and disagree look like this).
    """

    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str
    task_id: str
    task_path: str
    idx: int
    stored_channel: str
    new_channel: str
    stored_digest: str
    new_digest: str

    @property
    def kind(self) -> str:
        """``"edit"`` (no task path) or ``"recomputation"``."""
        return "recomputation" if self.task_path else "edit"


class Channels(NamedTuple):
    """Where a checkpoint's channel values are: their versions, blob digests and inline bytes."""

    versions: Mapping[str, Any]
    blobs: Mapping[str, str]
    inline: Mapping[str, bytes]


#: The sort key of a super-step's writes, each ``(task_path, task_id, idx, channel, value)``:
#: LangGraph's ``writes_sort_key``, which is ``(task_path, task_id, idx)``, as one C call
#: per write (should a later LangGraph key them otherwise, its function is called).
#: The shortcut is taken only if LangGraph's key is the identity on samples of every kind of
#: write: special ones (negative idx, see ``WRITES_IDX_MAP``), empty and nested task paths.
_WRITES_KEY_SAMPLES = (("", "", 0), ("p", "t", 1), ("p", "t", -1), ("p", "t", -4), ("~", "a", 2),
                       ("~__pregel_pull, a", "b", 0), ("~__pregel_push, 0, False", "c", 3))
_WRITES_ORDER: Callable[[tuple[Any, ...]], Any] = (
    operator.itemgetter(0, 1, 2)
    if all(writes_sort_key(*w) == w for w in _WRITES_KEY_SAMPLES)
    else lambda w: writes_sort_key(w[0], w[1], w[2])
)

#: Frame headers (length byte + type name) by serializer type name.
_HEADERS: dict[str, bytes] = {}


def _frame(typed: tuple[str, bytes]) -> bytes:
    header = _HEADERS.get(typed[0])
    if header is None:
        kind = typed[0].encode("utf-8")
        if len(kind) > 255:
            raise TypeError(f"serializer type name {typed[0]!r} is over 255 bytes")
        header = bytes([len(kind)]) + kind
        if len(_HEADERS) < 64:  # a serializer has a handful of type names; never grow without bound
            _HEADERS[typed[0]] = header
    return header + bytes(typed[1])


_MSGPACK_FRAME = b"\x07msgpack"


def _unframe(data: bytes) -> tuple[str, bytes]:
    if data[:8] == _MSGPACK_FRAME:  # nearly every record
        return "msgpack", data[8:]
    if not data:
        raise ValueError("empty record")
    n = data[0]
    if len(data) < 1 + n:
        raise ValueError("truncated type header")
    return data[1 : 1 + n].decode("utf-8"), data[1 + n :]


class ChannelPlan:
    """Where each channel value of a checkpoint being written goes (pure: no I/O).

    A serialized value of at most ``inline_max`` bytes goes inside the record
    while the record's ``budget`` of inline bytes lasts; any other becomes a
    content-addressed blob (``blobs``: channel -> digest; ``new_blobs``: digest
    -> bytes to write, each once). A channel the put did not change keeps the
    parent's place when its version is the parent's (:meth:`inherit`).
    """

    def __init__(self, inline_max: int, budget: int) -> None:
        self.inline_max = inline_max
        self.budget = budget
        self.blobs: dict[str, str] = {}
        self.inline: dict[str, bytes] = {}
        self.new_blobs: dict[str, bytes] = {}

    def add(self, channel: str, data: bytes) -> None:
        """Place ``channel``'s serialized value ``data``: inline if it fits, else a blob."""
        if len(data) <= self.inline_max and len(data) <= self.budget:
            self.inline[channel] = data
            self.budget -= len(data)
            return
        sha = digest(data)
        self.new_blobs.setdefault(sha, data)
        self.blobs[channel] = sha

    def inherit(self, channel: str, version: Any, parent: Channels) -> bool:
        """Reuse the parent's blob or inline value of an unchanged channel; False when it must be added."""
        return not self.inherit_all((channel,), {channel: version}, parent)

    def inherit_all(self, channels: Iterable[str], versions: Mapping[str, Any], parent: Channels) -> list[str]:
        """:meth:`inherit` each of ``channels`` (at its version in ``versions``), in order; those it could not.

        One call for a put's unchanged channels, not one each.
        """
        left: list[str] = []
        known, blobs, inline = parent.versions, parent.blobs, parent.inline
        for channel in channels:
            if channel not in known or known[channel] != versions[channel]:
                left.append(channel)
            elif channel in blobs:
                self.blobs[channel] = blobs[channel]
            else:
                old = inline.get(channel)
                if old is not None and len(old) <= self.budget:
                    self.inline[channel] = old
                    self.budget -= len(old)
                else:
                    left.append(channel)
        return left


def checkpoint_payload(
    ns: str, cid: str, parent: str | None, checkpoint: Checkpoint, metadata: CheckpointMetadata, plan: ChannelPlan
) -> dict[str, Any]:
    """The checkpoint record's content: the checkpoint without its values, and subject they are."""
    saved: dict[str, Any] = dict(checkpoint)
    saved.pop("channel_values", None)
    return {
        "v": _FORMAT,
        "ns": ns,
        "id": cid,
        "parent": parent,
        "checkpoint": saved,
        "metadata": dict(metadata),
        "blobs": plan.blobs,
        "inline": plan.inline,
    }


def split_writes(writes: Sequence[tuple[str, Any]]) -> tuple[dict[int, tuple[str, Any]], list[tuple[int, str, Any]]]:
    """A put_writes call's writes by index: the special ones (idx < 0, the last of each wins), the regular ones.

    Each write is checked to be a ``(channel name, value)`` pair here, in the
    one pass over them (``InvalidArgumentError`` naming ``writes[i]``), before
    the flow's first step: nothing is written when one is not.
    """
    special: dict[int, tuple[str, Any]] = {}
    regular: list[tuple[int, str, Any]] = []
    for i, pair in enumerate(writes):
        if type(pair) is not tuple or len(pair) != 2 or type(pair[0]) is not str:  # nearly every write: a pair
            _check_write(i, pair)
        channel, value = pair
        idx = WRITES_IDX_MAP.get(channel, i)
        if idx < 0:
            special.pop(idx, None)  # a repeated special write: the last one wins
            special[idx] = (channel, value)
        else:
            regular.append((idx, channel, value))
    return special, regular


def _check_write(i: int, write: object) -> None:
    """Raise unless ``write`` (``writes[i]``) is a ``(channel name, value)`` tuple or list."""
    if not isinstance(write, (tuple, list)) or len(write) != 2 or not isinstance(write[0], str):
        raise InvalidArgumentError(f"writes[{i}]", "must be a (channel name, value) pair")


class WritePolicy(Protocol):
    """What to do with a re-written write whose value differs from the stored one (the saver is one).

    ``_report_mismatch`` is called with each :class:`WriteMismatch`;
    ``strict_writes`` raises :class:`~checkpointers.errors.StepMismatchError`
    instead when the re-write comes from a recomputation (a ``task_path``).
    """

    strict_writes: bool

    def _report_mismatch(self, mismatch: WriteMismatch, /) -> None: ...


def writes_queries(checkpoints: Sequence[CheckpointRecord], listed: Mapping[str, object]) -> list[ListQuery]:
    """The listings that find the pending writes of ``checkpoints`` (one thread) not ``listed`` yet.

    One listing per checkpoint (and one more under ``w/`` for records of
    formats 1 and 2); for more than :data:`_PER_CHECKPOINT_LISTINGS`
    checkpoints of one namespace, one listing of the namespace's writes.
    """
    if all(s.name in listed and s.format >= _CHILD_WRITES for s in checkpoints):
        return []  # nearly always: every checkpoint listed with its children
    by_ns: dict[str, list[CheckpointRecord]] = {}
    for s in checkpoints:
        by_ns.setdefault(s.ns, []).append(s)
    queries: list[ListQuery] = []
    for ns, group in by_ns.items():
        old = [s for s in group if s.format < _CHILD_WRITES]
        todo = [s for s in group if s.name not in listed]
        if len(group) > _PER_CHECKPOINT_LISTINGS:
            if todo:
                queries.append(ListQuery(prefix=ckpt_prefix(ns), depth=_WRITES_DEPTH - _CKPT_DEPTH))
            if old:
                queries.append(ListQuery(prefix=f"{_OLD_WRITE}{enc(ns)}/"))
        else:
            queries.extend(ListQuery(prefix=writes_prefix(s.ns, s.cid)) for s in todo)
            queries.extend(ListQuery(prefix=_old_writes_prefix(s.ns, s.cid)) for s in old)
    return queries


def writes_by_owner(listings: Iterable[Iterable[Record]]) -> dict[str, dict[str, Record]]:
    """Writes records by the name of the checkpoint record they belong to, then by their own name."""
    writes: dict[str, dict[str, Record]] = {}
    for recs in listings:
        for rec in recs:
            writes.setdefault(_owner(rec.name), {})[rec.name] = rec
    return writes


# -- list: bounded walks, pure planning (list_flow drives them) ------------------

def list_starts(
    ns: str | None, flt: Mapping[str, Any], before: str | None, limit: int | None
) -> list[tuple[ListQuery, bool, str | None]]:
    """Each walk over one thread: its query without stop and limit, whether it is *sifted*, its first stop.

    One walk per query of :func:`_filter_queries` (the records carrying
    the pushed-down tags, and the ``~overflow`` records): over every
    namespace (``c/``, depth 1) when ``ns`` is None, else over
    ``c/<ns>/``, from ``before`` down. A sifted walk selects records that
    the post-filter may drop (overflow records, or a filter that is not
    all tags): its limit grows while it reads on inside one namespace
    (see :func:`list_next`), and it lists children (a pick's writes) only
    when :meth:`CheckpointLayout._load_flow` would otherwise list a whole namespace's writes.
    """
    plain = not flt and not before  # nearly every call: the same few walks, remembered (ListQuery is immutable)
    if plain:
        hit = _STARTS.get((ns, limit))
        if hit is not None:
            return list(hit)
    if ns is None:
        prefix, depth, stop = _CKPT, _CKPT_DEPTH, None
    else:
        prefix, depth = ckpt_prefix(ns), 0
        stop = ckpt_name(ns, before) if before else None
    out: list[tuple[ListQuery, bool, str | None]] = []
    for i, q in enumerate(_filter_queries(prefix, flt, depth=depth, descending=True, stop=None, limit=limit)):
        sifted = i > 0 or q.limit is None
        children = limit is not None and (not sifted or limit > _PER_CHECKPOINT_LISTINGS)
        walk = ListQuery(prefix=prefix, descending=True, tags=q.tags, depth=depth, children=children)
        out.append((walk, sifted, stop))
    if plain and len(_STARTS) < _LATEST_KEPT:  # bounded, as _LATEST
        _STARTS[(ns, limit)] = tuple(out)
    return out


#: :func:`list_starts` without a filter or ``before``, by (namespace, limit), at most :data:`_LATEST_KEPT`.
_STARTS: dict[tuple[str | None, int | None], tuple[tuple[ListQuery, bool, str | None], ...]] = {}

def list_query(walk: ListQuery, stop: str | None, limit: int | None) -> ListQuery:
    """The listing of ``walk``'s records below ``stop``, at most ``limit``.

    With a stop, the walk's prefix becomes ``start`` (and ``depth``
    counts from the name's start): the same records, as a stop is always
    a name under the prefix and so is everything from the prefix up to
    it, but one upper bound instead of two. SQLite's planner ends its index range at the first ``name <`` term of
    a query (the prefix's), so ``prefix + stop`` would scan every name
    between ``stop`` and the prefix's end (measured: 2.4 ms against
    0.005 ms for "nothing below the root namespace" at 5,000 checkpoints).
    """
    if stop is None:
        return ListQuery(
            prefix=walk.prefix,
            descending=True,
            tags=walk.tags,
            limit=limit,
            values=walk.values,
            depth=walk.depth,
            children=walk.children,
        )
    assert walk.depth is not None
    return ListQuery(
        descending=True,
        tags=walk.tags,
        start=walk.prefix,
        stop=stop,
        limit=limit,
        values=walk.values,
        depth=walk.prefix.count("/") + walk.depth,
        children=walk.children,
    )

def list_next(
    walk: ListQuery,
    asked: int | None,
    limit: int | None,
    sifted: bool,
    picks: int,
    last: tuple[str, str] | None,
    floor: str | None,
    before: str | None,
) -> tuple[str, int | None] | None:
    """The next ``(stop, limit)`` of a walk over ``walk.prefix``, or None when it is over.

    The listing asked for ``asked`` and selected ``picks`` checkpoint
    records, the last (lowest name) being ``last`` = (name, checkpoint
    id); ``floor`` is the ``limit``-th highest id among the checkpoints
    kept so far (None while fewer). A listing that selected fewer than it
    asked for held every record below its stop: the walk is over.
    Otherwise, with ``X`` the last record's namespace and ``c/<X>/`` its
    *head*, the next listing stops (exclusive) at:

    * ``c/<X>/`` when the last id is ``<= floor``: X's other records
      are below the last one, so their ids are lower (name order is id
      order), under ``floor``: ``limit`` kept checkpoints are newer;
    * else ``c/<X>/<before>`` when that is lower than the last name: X's
      records in between are not older than ``before``;
    * else the last name.

    The jump to the head skips X's records only: every name of X starts
    with ``c/<X>/``, so is ``>=`` it, and a name below the last one that
    is ``>= c/<X>/`` starts with it too (it lies between a string and
    one of its extensions). Names of other namespaces are never
    skipped, and never a prefix of one another: an encoded namespace has
    no ``/``, so ``c/<W>/`` starts ``c/<X>/`` only if W is X
    (namespaces ``a:b``, ``a-b``, ``a``: ``c/_a%3Ab/`` < ``c/_a-b/`` <
    ``c/_a/``, as ``%`` < ``-`` < ``/``, three separate blocks). The
    stop always falls (it is at most the last name), so a walk ends.
    """
    if asked is None or last is None or picks < asked:
        return None
    name, cid = last
    head = name[: name.index("/", len(_CKPT)) + 1]
    stop = name
    if before:
        stop = min(stop, head + enc(before))
    if floor is not None and cid <= floor:
        stop = head
    if stop <= walk.prefix:  # a walk over one namespace: nothing of it is left
        return None
    grow = sifted and stop == name  # still inside X, where the post-filter kept too little
    return stop, 2 * asked if grow else limit

def list_floor(cids: Iterable[str], limit: int | None) -> str | None:
    """The ``limit``-th highest of ``cids``: None without a limit or while there are fewer."""
    if limit is None:
        return None
    ranked = sorted(cids, reverse=True)
    return ranked[limit - 1] if len(ranked) >= limit else None


def list_newest(
    found: Mapping[tuple[int, str], CheckpointRecord], limit: int | None
) -> list[tuple[int, CheckpointRecord]]:
    """The first ``limit`` of ``found`` ((thread index, record name) -> checkpoint), newest first.

    Highest checkpoint id first; equal ids (one id in two namespaces or
    threads) in thread order, then in descending name order.
    """
    # One sort of (id, -thread, name): descending, that is id down, thread up, name down.
    # (thread, name) is unique, so the comparison never reaches the checkpoint itself.
    ranked = sorted([(s.cid, -i, name, s) for (i, name), s in found.items()], reverse=True)
    return [(-i, s) for _, i, _, s in ranked[:limit]]


@dataclass(frozen=True)
class ListSelection:
    """What a listing keeps, as a read of every checkpoint would (pure).

    Checkpoints of namespace ``ns`` (every one when None), of id ``cid`` if
    given, older than ``before`` if given, whose metadata matches ``flt``.
    """

    ns: str | None
    cid: str | None
    before: str | None
    flt: Mapping[str, Any]

    def keeps(self, s: CheckpointRecord) -> bool:
        """Whether checkpoint ``s`` is selected."""
        return (
            (self.ns is None or s.ns == self.ns)
            and (not self.cid or s.cid == self.cid)
            and (not self.before or s.cid < self.before)
            and (not self.flt or matches(s.metadata, self.flt))
        )


#: The root namespace's head, and a names-only probe for any checkpoint record sorting below it.
_ROOT_HEAD = f"{_CKPT}{enc('')}/"
_BELOW_ROOT = list_query(ListQuery(prefix=_CKPT, depth=_CKPT_DEPTH, values=False), _ROOT_HEAD, 1)


class Walk(NamedTuple):
    """One walk over one thread (see :func:`list_starts`): where its next listing stops, how many it asks."""

    thread: int
    query: ListQuery
    sifted: bool
    stop: str | None
    asked: int | None


class ParentChannels:
    """Where each channel of the last checkpoint written per (thread, namespace) is.

    A bounded, thread-safe cache shared by a saver and its views: a put whose
    parent is the checkpoint just written finds the blob digests and inline
    values of the channels it did not change here instead of reading the
    parent's record. Only this process's own writes go in; a thread that is
    deleted, copied over or pruned is forgotten (:meth:`forget`), and a miss
    only costs that one read.
    """

    def __init__(self, size: int = _CACHE_SIZE) -> None:
        self._size = size
        self._last: OrderedDict[tuple[str, str], tuple[str, Channels]] = OrderedDict()
        self._lock = threading.Lock()

    def written(self, p: Partition, ns: str, cid: str, channels: Channels) -> None:
        """Checkpoint ``cid`` of ``p``'s namespace ``ns`` was written with ``channels``."""
        with self._lock:
            self._last[(p.key, ns)] = (cid, channels)
            self._last.move_to_end((p.key, ns))
            while len(self._last) > self._size:
                self._last.popitem(last=False)

    def of(self, p: Partition, ns: str, cid: str) -> Channels | None:
        """The channels of checkpoint ``cid`` if it is the last one written there, else None.

        One ``get`` of the dict, atomic by itself: no lock (the writers take it).
        """
        hit = self._last.get((p.key, ns))
        return hit[1] if hit and hit[0] == cid else None

    def forget(self, p: Partition) -> None:
        """Drop what is known of thread ``p`` (it was deleted, pruned or written over)."""
        with self._lock:
            for key in [k for k in self._last if k[0] == p.key]:
                del self._last[key]

    def clear(self) -> None:
        """Drop everything (checkpoints of unknown threads were deleted)."""
        with self._lock:
            self._last.clear()


#: What names a record in errors: a string, or a callable building it only when one is raised.
Label = str | Callable[[], str]


def _text(label: Label) -> str:
    return label if isinstance(label, str) else label()


class _Lazy:
    """A name for error messages, built the first time one needs it (``str()``, an f-string, a call).

    A :data:`Label` (it is callable), and as ``subject`` of labels built from it.
    """

    __slots__ = ("_make", "_made")

    def __init__(self, make: Callable[[], str]) -> None:
        self._make = make
        self._made: str | None = None

    def __str__(self) -> str:
        if self._made is None:
            self._made = self._make()
        return self._made

    __call__ = __str__


#: What :meth:`CheckpointLayout._payload` returns when the record is to be loaded with its label.
_SLOW: Any = object()

#: At most this many records, and this many bytes of their values, in a :class:`VerifiedRecords`.
_VERIFIED_SIZE = 4096
_VERIFIED_BYTES = 16 * 1024 * 1024


def _channel_label(channel: str, cid: str, subject: Label) -> Label:
    return lambda: f"channel {channel!r} of checkpoint {cid!r} of {_text(subject)}"


def _record_label(kind: str, record: Record, p: Partition) -> Label:
    return lambda: f"{kind} {record.name!r} of thread {p.name!r}"


def _write_label(record: Record, subject: Label) -> Label:
    return lambda: f"write {record.name!r} of {_text(subject)}"


def _value_label(channel: str, subject: Callable[[], str]) -> str:
    """How errors name a channel value of the checkpoint ``subject`` names.

    Put builds its label as ``partial(_value_label, channel, subject)`` (a C
    call, not a Python one per value): called only when one is raised.
    """
    return f"channel {channel!r} of {subject()}"


class VerifiedRecords:
    """Records whose check passed, so reading one again byte for byte needs no re-hash.

    A bounded, thread-safe memo a saver and its views share. :meth:`check`
    runs :meth:`Integrity.check` on a record unless one with the same
    integrity settings, place (partition), name, stored digest (content
    digest and seal), tags and a *byte-identical* value passed it before:
    the check is a function of exactly these, so it would pass again.
    Nothing is served from here: the backend's read still returns the
    record (one another process deleted is not found, whatever is
    remembered), and each caller decodes the bytes it read (no object is
    shared between callers). Only ``bytes`` values are remembered (never a
    mutable ``bytearray``), oldest first out past :data:`_VERIFIED_SIZE`
    records or :data:`_VERIFIED_BYTES` bytes; a miss costs one check.
    """

    def __init__(self, size: int = _VERIFIED_SIZE, max_bytes: int = _VERIFIED_BYTES) -> None:
        self._size = size
        self._max_bytes = max_bytes
        self._bytes = 0
        self._seen: dict[tuple[object, ...], tuple[bytes, dict[str, str]]] = {}
        self._lock = threading.Lock()

    def check(self, integrity: Integrity, p: Partition, record: Record, label: Label) -> None:
        """Raise CorruptItemError (naming ``label()``) unless ``record`` holds for place ``p``."""
        value = record.value
        key = (integrity, integrity.accept_unsealed, p.key, record.name, record.digest)
        hit = self._seen.get(key)
        if hit is not None and (hit[0] is value or hit[0] == value) and hit[1] == record.tags:
            return
        try:
            integrity.check(p, record)
        except CorruptItemError as exc:
            raise CorruptItemError(_text(label), exc.reason) from None
        if type(value) is bytes and len(value) <= self._max_bytes // 8:
            self._remember(key, value, dict(record.tags))

    def _remember(self, key: tuple[object, ...], value: bytes, tags: dict[str, str]) -> None:
        with self._lock:
            old = self._seen.pop(key, None)
            if old is not None:
                self._bytes -= len(old[0])
            self._seen[key] = (value, tags)
            self._bytes += len(value)
            while len(self._seen) > self._size or self._bytes > self._max_bytes:
                first = next(iter(self._seen))
                self._bytes -= len(self._seen.pop(first)[0])

    def clear(self) -> None:
        """Forget every record."""
        with self._lock:
            self._seen.clear()
            self._bytes = 0


def _packer(serde: SerializerProtocol) -> Callable[[Any], bytes] | None:
    """The function ``serde.dumps_typed`` packs a dict, list or str with, when calling it directly is the same.

    That is LangGraph's ``JsonPlusSerializer.dumps_typed`` without pickle
    fallback: ``("msgpack", _msgpack_enc(obj))`` for anything but None and
    bytes, an encoding error raised as is. Any other serializer, or a
    LangGraph without that function, gets None: ``dumps_typed`` is called.
    ``tests/test_h1_write_path.py`` checks both give the same bytes.
    """
    enc = getattr(_jsonplus, "_msgpack_enc", None)
    if (
        callable(enc)
        and isinstance(serde, _jsonplus.JsonPlusSerializer)
        and type(serde).dumps_typed is _jsonplus.JsonPlusSerializer.dumps_typed
        and getattr(serde, "pickle_fallback", True) is False
    ):
        return enc  # type: ignore[no-any-return]
    return None


class BatchWriter(Protocol):
    """How a layout's writes reach the backend: one atomic batch of ``p``, its result.

    The saver installs one (:attr:`CheckpointLayout.writer`) to fence its
    writes with the thread's lease (:mod:`checkpointers.leases`); it must
    return the batch's own result (a refused condition is a ``conflict``
    with the index in ``puts`` then ``deletes``, as :func:`write` does).
    """

    def __call__(self, p: Partition, puts: Sequence[Put], deletes: Sequence[Delete], /) -> Flow[WriteResult]: ...


#: Records of a thread that :meth:`CheckpointLayout.copy_flow` never copies (its lease: the copy is a new thread).
_NOT_COPIED = frozenset({"lease"})


@dataclass(frozen=True)
class CheckpointLayout:
    """The saver's record layout and its flows: what :class:`~checkpointers.savers.Checkpointer` holds.

    ``serde`` serializes values (framed with their type name), every record
    is at most ``max_item_bytes``, ``integrity`` seals and checks records,
    ``parents`` is the :class:`ParentChannels` cache and ``verified`` the
    :class:`VerifiedRecords` memo (both shared by the layouts a saver's views
    and clones derive with :func:`dataclasses.replace`). The flows below are
    its methods; they hold no other state.
    """

    serde: SerializerProtocol
    max_item_bytes: int
    integrity: Integrity
    parents: ParentChannels = field(default_factory=ParentChannels)
    writer: BatchWriter | None = None
    verified: VerifiedRecords = field(default_factory=lambda: VerifiedRecords())
    #: ``serde.loads_msgpack`` when ``serde`` is a :class:`SafeSerializer` decoding as it does, else None.
    _msgpack: Callable[[bytes], Any] | None = field(init=False, repr=False, compare=False, default=None)
    #: ``serde.msgpack_hook()`` then (see :meth:`_payload`), else None.
    _hook: Callable[[int, bytes], Any] | None = field(init=False, repr=False, compare=False, default=None)
    #: What ``serde.dumps_typed`` packs a dict, list or str with when it is LangGraph's own (see :meth:`_dump`).
    _pack: Callable[[Any], bytes] | None = field(init=False, repr=False, compare=False, default=None)

    def __post_init__(self) -> None:
        serde = self.serde
        if isinstance(serde, SafeSerializer) and type(serde).loads_typed is SafeSerializer.loads_typed:
            object.__setattr__(self, "_msgpack", serde.loads_msgpack)
            object.__setattr__(self, "_hook", serde.msgpack_hook())
        object.__setattr__(self, "_pack", _packer(serde))

    def write_batch(self, p: Partition, puts: Sequence[Put], deletes: Sequence[Delete] = ()) -> Flow[WriteResult]:
        """Every write of the layout goes through here: :attr:`writer` if set, else a plain :func:`write`.

        It returns that flow itself (``yield from`` it): no generator of its own per write.
        """
        if self.writer is None:
            return write(p, tuple(puts), tuple(deletes))
        return self.writer(p, puts, deletes)

    # -- encoding ---------------------------------------------------------

    def _dump(self, label: Label, obj: Any) -> bytes:
        """Serialize with the saver's serde, then enforce the size cap (no I/O).

        ``label`` names the value in errors (a callable: built only then).
        A dict, list or str goes straight to :attr:`_pack` when set (what
        ``dumps_typed`` would do with it, without its calls).
        """
        kind = type(obj)
        typed: tuple[str, bytes] | None = None
        try:
            if self._pack is not None and (kind is dict or kind is str or kind is list):  # nearly every value
                data = _MSGPACK_FRAME + self._pack(obj)
            else:
                typed = self.serde.dumps_typed(obj)
        except Exception as exc:  # RecursionError included: nesting too deep
            raise UnserializableValueError(
                _text(label),
                f"{type(self.serde).__name__} cannot serialize a value of type {kind.__name__} "
                f"({type(exc).__name__}: {str(exc)[:200]})",
            ) from None
        if typed is not None:
            data = _MSGPACK_FRAME + typed[1] if typed[0] == "msgpack" and type(typed[1]) is bytes else _frame(typed)
        if len(data) > self.max_item_bytes:
            check_size(_text(label), len(data), self.max_item_bytes)
        return data

    def _load(self, p: Partition, label: Label, record: Record) -> Any:
        """Check the record's seal for its place in ``p`` and deserialize; any failure is CorruptItemError.

        ``label`` names the record in errors (a callable: built only then).
        """
        self.verified.check(self.integrity, p, record, label)
        return self._loads(label, record.value)

    def _loads(self, label: Label, data: bytes) -> Any:
        """Deserialize framed bytes (already verified); any failure is CorruptItemError."""
        try:
            if self._msgpack is not None and data.startswith(_MSGPACK_FRAME):  # nearly every record
                return self._msgpack(data[8:])
            return self.serde.loads_typed(_unframe(data))
        except DisallowedTypeError as exc:
            raise DisallowedTypeError(_text(label), exc.module, exc.name) from None
        except CorruptItemError as exc:
            raise CorruptItemError(_text(label), exc.reason) from None
        except Exception as exc:
            raise CorruptItemError(_text(label), f"cannot be decoded ({type(exc).__name__}: {exc})") from exc

    def _inline_values(self, s: CheckpointRecord, subject: Label) -> dict[str, Any]:
        """The channel values kept inside checkpoint ``s``: one decoding call for all when they are msgpack.

        Any failure decodes them one by one again, so the error names its channel.
        """
        inline = s.inline
        hook = self._hook
        if hook is not None:
            values: dict[str, Any] = {}
            try:
                for ch, data in inline.items():
                    if not data.startswith(_MSGPACK_FRAME):
                        break
                    values[ch] = _unpackb(data[8:], ext_hook=hook, option=UNPACK_OPTION)
                else:
                    return values
            except Exception:  # noqa: BLE001, S110 - decoded again below, one by one, to name the channel
                pass
        return {ch: self._loads(_channel_label(ch, s.cid, subject), data) for ch, data in inline.items()}

    def _payload(self, p: Partition, record: Record) -> Any:
        """``_load`` of a record with msgpack bytes, in one frame and with no label built, or :data:`_SLOW`.

        :data:`_SLOW` when the record is not such a record, or its check or
        decoding failed: the caller loads it again with :meth:`_load` and
        its label, which raises the error naming it (both are deterministic).
        """
        hook = self._hook
        data = record.value
        if hook is None or type(data) is not bytes or not data.startswith(_MSGPACK_FRAME):
            return _SLOW
        try:
            self.verified.check(self.integrity, p, record, record.name)
            return _unpackb(data[8:], ext_hook=hook, option=UNPACK_OPTION)
        except Exception:  # noqa: BLE001 - loaded again by the caller, with its label, to raise the error
            return _SLOW

    def _decode_checkpoint(self, p: Partition, record: Record) -> CheckpointRecord:
        payload = self._payload(p, record)
        if payload is _SLOW:
            payload = self._load(p, _record_label("checkpoint record", record, p), record)
        try:
            if payload["v"] not in _FORMATS:
                raise ValueError(f"unknown record format {payload['v']!r}")
            inline = payload["inline"] if "inline" in payload else {}  # format 1: none
            for b in inline.values():  # decoded for this call alone: kept as is when every value is bytes
                if type(b) is not bytes:
                    inline = {ch: bytes(b) for ch, b in inline.items()}
                    break
            return CheckpointRecord(
                record.name,
                payload["ns"],
                payload["id"],
                payload["parent"],
                payload["checkpoint"],
                payload["metadata"],
                payload["blobs"],
                inline,
                payload["v"],
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            label = _record_label("checkpoint record", record, p)
            raise CorruptItemError(_text(label), f"unexpected layout ({exc!r})") from exc

    # -- put ----------------------------------------------------------------

    def put_flow(
        self,
        p: Partition,
        ns: str,
        parent: str | None,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
        done: _T = None,  # type: ignore[assignment]
    ) -> Flow[_T]:
        """Store a checkpoint: new blobs then the record, in one atomic batch; return ``done``.

        Small channel values go inside the record (``inline``), the others
        into content-addressed blobs; unchanged channels reuse the parent's
        (see :class:`ChannelPlan`).
        """
        cid = checkpoint["id"]

        def subject() -> str:  # names the checkpoint in errors only
            return f"checkpoint {cid!r} (thread {p.name!r}, namespace {ns!r})"

        values: dict[str, Any] = checkpoint.get("channel_values") or {}
        versions: dict[str, Any] = dict(checkpoint.get("channel_versions") or {})
        plan = ChannelPlan(_INLINE_MAX, _INLINE_BUDGET)
        # One pass in the checkpoint's order: the changed values are placed first, the others after.
        inherited: list[str] = []
        for channel in versions:
            if channel not in new_versions:
                inherited.append(channel)
            elif channel in values:
                plan.add(channel, self._dump(partial(_value_label, channel, subject), values[channel]))
        if inherited:
            prior = self.parents.of(p, ns, parent) if parent else None
            if prior is None:
                prior = yield from self._parent_record_flow(p, ns, parent)
            for channel in plan.inherit_all(inherited, versions, prior):  # nearly always none left
                if channel in values:
                    plan.add(channel, self._dump(partial(_value_label, channel, subject), values[channel]))
        payload = checkpoint_payload(ns, cid, parent, checkpoint, metadata, plan)
        record = self.integrity.put(
            p,
            ckpt_name(ns, cid),
            self._dump(subject, payload),
            etag=new_etag(),
            tags=metadata_tags(metadata),  # valid by construction: at most 16, lengths checked, no NUL
            mode=Mode.APPEND,
        )
        puts = [
            self.integrity.put(p, _blob_name(sha), data, etag=new_etag(), mode=Mode.APPEND, staged=True, sha=sha)
            for sha, data in plan.new_blobs.items()
        ] if plan.new_blobs else []  # most puts: no new blob (small values are inline)
        puts.append(record)
        result = yield from self.write_batch(p, puts)
        if result.conflict is not None:
            labels = [f"blob {_blob_name(sha)} of {subject()}" for sha in plan.new_blobs] + [subject()]
            raise_conflict(result, puts, (), labels)
        self.parents.written(p, ns, cid, Channels(versions, plan.blobs, plan.inline))
        return done

    def _parent_record_flow(self, p: Partition, ns: str, parent: str | None) -> Flow[Channels]:
        """Where the parent's channels are, from its record (no parent or none stored: nowhere)."""
        if parent:
            (rec,) = yield from get(p, [ckpt_name(ns, parent)])
            if rec is not None:
                got = self._decode_checkpoint(p, rec)
                return Channels(got.checkpoint.get("channel_versions", {}), got.blobs, got.inline)
        return Channels({}, {}, {})

    def put_writes_flow(
        self,
        p: Partition,
        ns: str,
        cid: str,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str,
        policy: WritePolicy,
    ) -> Flow[None]:
        """Store one task's writes in one atomic batch (before or after its checkpoint).

        The regular writes of the call (``idx >= 0``) are packed into one
        APPEND record named after the first one's index (more records only
        when they would pass the size cap together); each special write
        (``idx < 0``) is its own UPSERT record, since the runtime replaces them.

        A regular write whose (checkpoint, task, idx) is already stored keeps
        the stored value, as every LangGraph saver does (``update_state``,
        forks and ``Command(resume=..., update=...)`` re-write them); the new
        ones of the call are written. A re-write with a *different* value is
        reported (``policy._report_mismatch``), and raised as
        :class:`~checkpointers.errors.StepMismatchError` with ``policy.strict_writes``
        when it comes from a task's recomputation (a ``task_path``).
        """
        task = (task_id, task_path)
        subject = _Lazy(lambda: f"task {task_id!r} at checkpoint {cid!r} (thread {p.name!r}, namespace {ns!r})")
        prefix = f"{writes_prefix(ns, cid)}{enc(task_id)}/"
        special, regular = split_writes(writes)
        special_puts = self._special_puts(p, prefix, special, task, subject) if special else []
        for _ in range(_WRITE_ATTEMPTS):
            regular_puts, chunks = self._regular_puts(p, prefix, regular, task_id, task_path, subject)
            puts = [*regular_puts, *special_puts] if special_puts else regular_puts
            if not puts:
                return
            result = yield from self.write_batch(p, puts)
            conflict = result.conflict
            if conflict is None:
                return
            if conflict.index >= len(regular_puts) or conflict.existing is None:
                labels = [f"writes {c[0][0]}..{c[-1][0]} of {subject}" for c in chunks]
                labels += [f"write {idx} ({channel!r}) of {subject}" for idx, (channel, _) in special.items()]
                raise_conflict(result, puts, (), labels)
            # Some of these (task, idx) are stored already: keep them, write the others.
            stored = yield from self._stored_writes_flow(p, prefix, subject)
            for idx, channel, value in regular:
                if idx in stored:
                    self._check_rewrite(p, ns, cid, task, policy, idx, stored[idx], (channel, value), subject)
            regular = [w for w in regular if w[0] not in stored]
        raise ConcurrencyError(f"writes of {subject}", None)

    def _special_puts(
        self, p: Partition, prefix: str, special: Mapping[int, tuple[str, Any]], task: tuple[str, str], subject: Label
    ) -> list[Put]:
        """One UPSERT record per special write."""
        puts: list[Put] = []
        for idx, (channel, value) in special.items():
            payload = {"task_id": task[0], "task_path": task[1], "w": [[idx, channel, value]]}
            data = self._dump(f"write {idx} ({channel!r}) of {_text(subject)}", payload)
            puts.append(self.integrity.put(p, f"{prefix}{idx}", data, etag=new_etag(), mode=Mode.UPSERT))
        return puts

    def _stored_writes_flow(self, p: Partition, prefix: str, subject: Label) -> Flow[dict[int, tuple[str, Any]]]:
        """The regular writes stored under ``prefix`` (one task's): idx -> (channel, value)."""
        stored: dict[int, tuple[str, Any]] = {}
        for rec in (yield from listing(p, ListQuery(prefix=prefix))):
            if not rec.name.rsplit("/", 1)[1].startswith("-"):
                stored.update({w[2]: (w[3], w[4]) for w in self._pending(p, rec, subject)})
        return stored

    def _regular_puts(
        self,
        p: Partition,
        prefix: str,
        regular: list[tuple[int, str, Any]],
        task_id: str,
        task_path: str,
        subject: Label,
    ) -> tuple[list[Put], list[list[tuple[int, str, Any]]]]:
        """One APPEND record per chunk of the regular writes (see :meth:`_packed`), and the chunks.

        Nearly every call: all of them in one record, serialized once here;
        :meth:`_packed` splits them only when that one does not fit.
        """
        if not regular:
            return [], []
        try:
            data = self._dump(
                lambda: f"writes {regular[0][0]}..{regular[-1][0]} of {_text(subject)}",
                {"task_id": task_id, "task_path": task_path, "w": list(map(list, regular))},
            )
        except (ItemTooLargeError, TypeError):
            if len(regular) == 1:
                raise  # already names the write
        else:
            return [self.integrity.put(p, f"{prefix}{regular[0][0]}", data, etag=new_etag(), mode=_APPEND)], [regular]
        puts: list[Put] = []
        chunks: list[list[tuple[int, str, Any]]] = []
        for chunk, data in self._packed(regular, task_id, task_path, subject):
            puts.append(self.integrity.put(p, f"{prefix}{chunk[0][0]}", data, etag=new_etag(), mode=_APPEND))
            chunks.append(chunk)
        return puts, chunks

    def _check_rewrite(
        self,
        p: Partition,
        ns: str,
        cid: str,
        task: tuple[str, str],
        policy: WritePolicy,
        idx: int,
        stored: tuple[str, Any],
        new: tuple[str, Any],
        subject: Label,
    ) -> None:
        """Compare a re-written write with the stored one; report (or raise) if they differ."""
        label = f"write {idx} of {_text(subject)}"
        old_digest, new_digest = digest(self._dump(label, list(stored))), digest(self._dump(label, list(new)))
        if old_digest == new_digest:
            return
        task_id, task_path = task
        if policy.strict_writes and task_path:
            raise StepMismatchError(label, old_digest, new_digest)
        policy._report_mismatch(
            WriteMismatch(p.name, ns, cid, task_id, task_path, idx, stored[0], new[0], old_digest, new_digest)
        )

    def _packed(
        self, writes: list[tuple[int, str, Any]], task_id: str, task_path: str, subject: Label
    ) -> list[tuple[list[tuple[int, str, Any]], bytes]]:
        """``writes`` (two or more, together over the size cap or not serializable: see
        :meth:`_regular_puts`) as records of at most the cap: ``(writes, serialized record)`` each.

        Each write is serialized alone (a write over the cap or that cannot be
        serialized raises, naming it) and consecutive runs are packed while
        their sizes fit.
        """

        def dump(chunk: list[tuple[int, str, Any]]) -> bytes:
            payload = {"task_id": task_id, "task_path": task_path, "w": list(map(list, chunk))}  # no frame of its own
            return self._dump(lambda: f"writes {chunk[0][0]}..{chunk[-1][0]} of {_text(subject)}", payload)

        fixed = len(f"{task_id}{task_path}".encode("utf-8", "surrogatepass")) + _PACK_OVERHEAD
        budget = self.max_item_bytes - fixed
        chunks: list[list[tuple[int, str, Any]]] = []
        size = budget
        for idx, channel, value in writes:
            alone = self._dump(f"write {idx} ({channel!r}) of {_text(subject)}", value)
            need = len(channel.encode("utf-8", "surrogatepass")) + len(alone) + _WRITE_OVERHEAD
            if size + need > budget:
                chunks.append([])
                size = 0
            chunks[-1].append((idx, channel, value))
            size += need
        return [(chunk, dump(chunk)) for chunk in chunks]

    def _pending(self, p: Partition, rec: Record, subject: Label) -> list[tuple[str, str, int, str, Any]]:
        """The writes of one writes record as ``(task_path, task_id, idx, channel, value)``.

        Reads both layouts: a packed record (``w``: ``[idx, channel, value]``
        each) and the earlier one-write record.
        """
        payload = self._payload(p, rec)
        if payload is _SLOW:
            payload = self._load(p, _write_label(rec, subject), rec)
        try:
            if "w" not in payload:  # written by 0.1: one write per record
                return [
                    (payload["task_path"], payload["task_id"], payload["idx"], payload["channel"], payload["value"])
                ]
            return [(payload["task_path"], payload["task_id"], idx, ch, value) for idx, ch, value in payload["w"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptItemError(_text(_write_label(rec, subject)), f"unexpected layout ({exc!r})") from exc

    # -- read -----------------------------------------------------------------

    def get_flow(self, p: Partition, ns: str, cid: str | None) -> Flow[LoadedCheckpoint | None]:
        """The checkpoint ``cid``, or the latest of the namespace: a bounded number of calls."""
        if cid:
            # The record and its writes in one listing: the lowest name at depth 0
            # under its own name is the record itself when it is stored (a longer
            # id extending it sorts after it, and is not it).
            name = ckpt_name(ns, cid)
            q = ListQuery(prefix=name, depth=0, limit=1, children=True)
        else:
            q = _latest_query(ns)
        recs: list[Record] = yield ListOp(p, q)  # ``listing``, without its generator (one per get)
        rec = recs[0] if recs and (not cid or recs[0].name == name) else None
        if rec is None:
            return None
        s = self._decode_checkpoint(p, rec)
        kids = recs[1:]  # one pick (limit=1): the rest are its children, its writes
        if not s.blobs and s.format >= _CHILD_WRITES:  # everything is read already
            return self._assemble(p, s, {}, kids, lambda: f"thread {p.name!r}")
        loaded = yield from self._load_flow(p, [s], {rec.name: kids})
        return loaded[0]

    def _load_flow(
        self,
        p: Partition,
        checkpoints: Sequence[CheckpointRecord],
        listed: Mapping[str, list[Record]] | None = None,
    ) -> Flow[list[LoadedCheckpoint]]:
        """Load the blobs and the pending writes of checkpoints of one thread.

        ``listed``: the writes records of checkpoints listed with their
        children, by checkpoint record name. One :class:`Parallel` step: a get
        of every blob, and the listings of :func:`writes_queries`.
        """
        subject = f"thread {p.name!r}"
        listed = listed or {}
        digests = sorted({d for s in checkpoints for d in s.blobs.values()})
        queries = writes_queries(checkpoints, listed)
        blobs = GetOp(p, [_blob_name(d) for d in digests]) if digests else None
        blob_recs: list[Record | None] = []
        listings: list[list[Record]] = []
        if blobs or queries:  # (the latest checkpoint with inline values only: nothing to read)
            blob_recs, listings = yield from get_and_lists(blobs, [ListOp(p, q) for q in queries])
        values: dict[str, Any] = {}
        for d, rec in zip(digests, blob_recs, strict=True):
            values[d] = self._blob_value(p, d, rec, subject)
        if listings:
            writes = writes_by_owner([*listed.values(), *listings])
            return [self._assemble(p, s, values, list(writes.get(s.name, {}).values()), subject) for s in checkpoints]
        return [self._assemble(p, s, values, listed.get(s.name, ()), subject) for s in checkpoints]

    def _blob_value(self, p: Partition, sha: str, rec: Record | None, subject: str) -> Any:
        """The value a checkpoint's blob ``sha`` holds, checked against its name and seal."""
        if rec is None:
            raise CorruptItemError(_blob_name(sha), f"blob referenced by a checkpoint of {subject} is missing")
        if content_digest(rec.digest) != sha:
            raise CorruptItemError(_blob_name(sha), "stored digest does not match its name")
        return self._load(p, lambda: f"blob {sha} of {subject}", rec)

    def _assemble(
        self,
        p: Partition,
        s: CheckpointRecord,
        values: Mapping[str, Any],
        writes: Sequence[Record],
        subject: Label,
    ) -> LoadedCheckpoint:
        """The checkpoint ``s`` with its channel values (blob ``values`` by digest) and pending ``writes``.

        ``writes``: its writes records, each once.
        """
        pending: list[PendingWrite] = []
        if writes:
            if len(writes) == 1:  # nearly always: one put_writes call per checkpoint
                found = self._pending(p, writes[0], subject)
            else:
                found = [w for rec in writes for w in self._pending(p, rec, subject)]
            if len(found) > 1:
                found.sort(key=_WRITES_ORDER)
            pending = [(w[1], w[3], w[4]) for w in found]
        if not s.blobs:
            channel_values = self._inline_values(s, subject) if s.inline else {}
        else:
            channel_values = {ch: values[d] for ch, d in s.blobs.items()}
            if s.inline:
                channel_values.update(self._inline_values(s, subject))
        # ``s`` was decoded for this call alone (each call decodes the bytes it read):
        # its checkpoint dict is completed in place, not copied.
        checkpoint: Any = s.checkpoint
        checkpoint["channel_values"] = channel_values
        metadata: Any = s.metadata
        return LoadedCheckpoint(p.name, s.ns, s.cid, s.parent, checkpoint, metadata, pending)

    # The list planners, under their earlier names (tests call them so).
    _list_starts = staticmethod(list_starts)
    _list_query = staticmethod(list_query)
    _list_next = staticmethod(list_next)
    _list_floor = staticmethod(list_floor)
    _list_newest = staticmethod(list_newest)

    def list_flow(
        self,
        parts: Sequence[Partition] | None,
        user: str,
        ns: str | None,
        cid: str | None,
        flt: Mapping[str, Any] | None,
        before: str | None,
        limit: int | None,
    ) -> Flow[list[LoadedCheckpoint]]:
        """Checkpoints newest first (highest id, across namespaces); ``parts=None``: every thread of ``user``.

        Keeps exactly what a read of every checkpoint would: those of
        namespace ``ns`` (every namespace when None), with id ``cid`` if
        given, older than ``before``, matching ``flt``; then the first ``limit``.

        **With a limit, reads do not grow with history.** Name order groups
        checkpoints by namespace, so each thread is *walked*: listings down
        the name order from the highest name, ``limit`` checkpoints (and their
        writes) each, one walk per tag query of :func:`_filter_queries`, every
        walk of every thread in one :class:`Parallel` per step. The
        checkpoints kept so far give a *floor* (the ``limit``-th highest id);
        once a namespace's last listed checkpoint is at or under it, the walk
        jumps past the rest of that namespace, which is older (see
        :func:`list_next` for the arithmetic). Per namespace a walk reads
        fewer than ``2 * limit`` checkpoints (plus up to ``limit`` not older
        than ``before``), and a listing of ``limit`` covers several small
        namespaces, so the cost grows with the number of namespaces and
        threads, never with one namespace's history: a thread with only the
        root namespace costs two listings (the second finds nothing below
        it), one with ``checkpoint_ns`` given costs one.

        Subgraphs are the catch: LangGraph makes one namespace per subgraph
        *call* (``node:<task id>``, in no time order), and every namespace is
        looked at. A thread that called a subgraph N times, ``k``
        checkpoints a call, costs about ``k * N`` records (at most ``2 *
        limit`` a call) in ``k * N / limit`` listings: that still grows with
        such a thread's history. The layout has no cheaper exact answer: no
        index orders checkpoints by id across namespaces.

        A filter that is not all tags, and the ``~overflow`` records, are
        checked after reading: such a walk reads on, doubling its listing
        inside a namespace, until it has kept enough; as exact as the rest.

        With ``cid`` and no namespace: one listing of one name per namespace
        (``values=False``), then one get of ``c/<ns>/<cid>`` in each.
        Without a limit, one listing per tag query reads everything, as the
        result holds everything.

        Name order is id order within a namespace because LangGraph's ids are
        uuid6 strings, which :func:`~checkpointers._names.encode_component`
        keeps as they are (as ``get_flow`` and ``before`` rely on too).
        """
        if limit is not None and limit <= 0:
            return []
        if parts is None:
            names = yield from partitions(user, SPACE)
            parts = [Partition(user, SPACE, n) for n in names]
        selection = ListSelection(ns, cid, before, dict(flt or {}))
        if cid:
            found = yield from self._list_by_id_flow(parts, selection)
            listed: dict[int, dict[str, list[Record]]] = {}
        else:
            found, listed = yield from self._walk_flow(parts, selection, limit)
        picked = list_newest(found, limit)
        return (yield from self._load_picked_flow(parts, picked, listed))

    def _list_by_id_flow(
        self, parts: Sequence[Partition], selection: ListSelection
    ) -> Flow[dict[tuple[int, str], CheckpointRecord]]:
        """The checkpoints of id ``selection.cid`` in each thread: a get in each namespace."""
        assert selection.cid
        heads = yield from self._namespace_heads_flow(parts, selection.ns)
        wanted = [(i, [h + enc(selection.cid) for h in hs]) for i, hs in heads.items() if hs]
        got = yield from parallel([GetOp(parts[i], names) for i, names in wanted])
        found: dict[tuple[int, str], CheckpointRecord] = {}
        for (i, names), recs in zip(wanted, got, strict=True):
            for name, rec in zip(names, recs, strict=True):
                if rec is not None:
                    s = self._decode_checkpoint(parts[i], rec)
                    if selection.keeps(s):
                        found[(i, name)] = s
        return found

    @staticmethod
    def _namespace_heads_flow(parts: Sequence[Partition], ns: str | None) -> Flow[dict[int, list[str]]]:
        """The ``c/<ns>/`` heads of each thread's namespaces (just ``ns``'s when given).

        One names-only listing of one record per step and thread: the highest
        namespace below the last one found.
        """
        heads: dict[int, list[str]] = {i: [] if ns is None else [ckpt_prefix(ns)] for i in range(len(parts))}
        names_only = ListQuery(prefix=_CKPT, depth=_CKPT_DEPTH, values=False)
        probes: list[tuple[int, str | None]] = [(i, None) for i in range(len(parts))] if ns is None else []
        while probes:
            queries = [list_query(names_only, stop, 1) for _, stop in probes]
            got = yield from parallel([ListOp(parts[i], q) for (i, _), q in zip(probes, queries, strict=True)])
            nxt: list[tuple[int, str | None]] = []
            for (i, _), recs in zip(probes, got, strict=True):
                if recs:
                    head = recs[0].name[: recs[0].name.index("/", len(_CKPT)) + 1]
                    heads[i].append(head)
                    nxt.append((i, head))
            probes = nxt
        return heads

    def _walk_flow(
        self, parts: Sequence[Partition], selection: ListSelection, limit: int | None
    ) -> Flow[tuple[dict[tuple[int, str], CheckpointRecord], dict[int, dict[str, list[Record]]]]]:
        """Walk every thread (see :meth:`list_flow`): the checkpoints kept, and the writes listed with them."""
        found: dict[tuple[int, str], CheckpointRecord] = {}  # (thread index, record name) -> a checkpoint kept
        listed: dict[int, dict[str, list[Record]]] = {}  # writes listed with their checkpoint, per thread
        walks = [
            Walk(i, walk, sifted, stop, limit)
            for i in range(len(parts))
            for walk, sifted, stop in list_starts(selection.ns, selection.flt, selection.before, limit)
        ]
        # Over every namespace, the root's (``c/_/``) is nearly always the last a walk
        # reaches, and what sorts below it (namespaces encoded ``_%...``, ``_-...``)
        # nearly always nothing: one names-only probe per thread in the first step
        # says so, instead of one more step whose listings find nothing.
        probes = list(range(len(parts))) if selection.ns is None and limit is not None else []
        bare: set[int] = set()  # threads with nothing below the root namespace
        while walks:
            queries = [list_query(w.query, w.stop, w.asked) for w in walks]
            ops = [ListOp(parts[w.thread], q) for w, q in zip(walks, queries, strict=True)]
            ops += [ListOp(parts[i], _BELOW_ROOT) for i in probes]
            results = yield from parallel(ops)
            bare.update(i for i, recs in zip(probes, results[len(walks) :], strict=True) if not recs)
            probes = []
            steps: list[tuple[Walk, int, tuple[str, str] | None]] = []
            for w, q, recs in zip(walks, queries, results[: len(walks)], strict=True):
                picks, last = self._read_listing(parts[w.thread], w.thread, q, recs, selection, found, listed)
                steps.append((w, picks, last))
            floor = list_floor((s.cid for s in found.values()), limit)
            walks = []
            for w, picks, last in steps:
                follow = list_next(w.query, w.asked, limit, w.sifted, picks, last, floor, selection.before)
                if follow is not None and not (w.thread in bare and follow[0] <= _ROOT_HEAD):
                    walks.append(Walk(w.thread, w.query, w.sifted, follow[0], follow[1]))
        return found, listed

    def _read_listing(
        self,
        p: Partition,
        thread: int,
        q: ListQuery,
        recs: Sequence[Record],
        selection: ListSelection,
        found: dict[tuple[int, str], CheckpointRecord],
        listed: dict[int, dict[str, list[Record]]],
    ) -> tuple[int, tuple[str, str] | None]:
        """Keep what one walk's listing selects (into ``found``, its writes into ``listed``).

        Returns how many checkpoint records it held and the last one's
        (name, checkpoint id), for :func:`list_next`.
        """
        picks, last = 0, None
        depth, start = q.depth, len(q.prefix)  # q.at_depth, inline: one test per record
        kids: list[Record] | None = None  # the last pick's children (its writes), when listed
        with_kids = listed.setdefault(thread, {}) if q.children else None
        decode, keeps = self._decode_checkpoint, selection.keeps
        for rec in recs:
            name = rec.name
            if depth is not None and name.count("/", start) != depth:
                if kids is not None:
                    kids.append(rec)
                continue
            picks += 1
            s = decode(p, rec)
            last = (name, s.cid)
            key = (thread, name)
            if key not in found and keeps(s):
                found[key] = s
            if with_kids is not None:
                kids = with_kids[name] = []
        return picks, last

    def _load_picked_flow(
        self,
        parts: Sequence[Partition],
        picked: Sequence[tuple[int, CheckpointRecord]],
        listed: Mapping[int, Mapping[str, list[Record]]],
    ) -> Flow[list[LoadedCheckpoint]]:
        """Load the ``picked`` checkpoints ((thread index, checkpoint) each), in their order."""
        groups: dict[int, list[CheckpointRecord]] = {}
        for i, s in picked:
            groups.setdefault(i, []).append(s)
        loaded: dict[tuple[int, str], LoadedCheckpoint] = {}
        for i, group in groups.items():
            mine = listed.get(i, {})
            with_writes = {s.name: mine[s.name] for s in group if s.name in mine}
            done = yield from self._load_flow(parts[i], group, with_writes)
            if len(groups) == 1:  # one thread: its group is ``picked``, in order
                return done
            for s, f in zip(group, done, strict=True):
                loaded[(i, s.name)] = f
        return [loaded[(i, s.name)] for i, s in picked]

    # -- thread management ------------------------------------------------------

    def copy_flow(self, src: Partition, dst: Partition) -> Flow[int]:
        """Copy every record of ``src`` into ``dst`` in one batch (blobs first)."""
        recs = [r for r in (yield from listing(src, ListQuery())) if r.name not in _NOT_COPIED]

        def rank(name: str) -> int:  # blobs, then writes, then the checkpoints that show them
            return 0 if name.startswith(_BLOB) else 1 if _is_writes(name) else 2

        recs = sorted(recs, key=lambda r: (rank(r.name), r.name))
        puts = [
            self.integrity.put(
                dst,
                r.name,
                self.integrity.check(src, r, f"record {r.name!r} of thread {src.name!r}").value,
                etag=new_etag(),
                tags=dict(r.tags),
                mode=_mode_of(r.name),
                staged=r.name.startswith(_BLOB),
                sha=content_digest(r.digest),
            )
            for r in recs
        ]
        if puts:
            labels = [f"record {r.name!r} copied to thread {dst.name!r}" for r in recs]
            raise_conflict((yield from self.write_batch(dst, puts)), puts, (), labels)
            self.parents.forget(dst)
        return len(puts)

    def prune_flow(self, p: Partition) -> Flow[None]:
        """Keep the latest checkpoint per namespace and its writes; drop the rest."""
        recs = yield from listing(p, ListQuery(prefix=_CKPT, depth=_CKPT_DEPTH, values=False))
        names = [r.name for r in recs]
        latest: dict[str, str] = {}
        for n in names:
            group = n.rsplit("/", 1)[0]
            if n > latest.get(group, ""):
                latest[group] = n
        keep = set(latest.values())
        yield from self._collect_flow(p, names, {n for n in names if n not in keep}, orphans=True)

    def delete_runs_flow(self, user: str, run_ids: Iterable[Any]) -> Flow[None]:
        """Delete every checkpoint of ``user`` made by one of ``run_ids`` (with its writes)."""
        run_ids = list(run_ids)
        if not run_ids:
            return
        tagged = {tag_value(r): r for r in run_ids}
        threads = yield from partitions(user, SPACE)
        for thread in threads:
            p = Partition(user, SPACE, thread)
            doomed: set[str] = set()
            if None in tagged:  # a run id that cannot be a tag: read every record
                for rec in (yield from listing(p, ListQuery(prefix=_CKPT, depth=_CKPT_DEPTH))):
                    if self._decode_checkpoint(p, rec).metadata.get("run_id", object()) in run_ids:
                        doomed.add(rec.name)
            for tval in tagged:
                if tval is None:
                    continue
                q = ListQuery(prefix=_CKPT, depth=_CKPT_DEPTH, tags={_TAG_PREFIX + "run_id": tval}, values=False)
                doomed.update(r.name for r in (yield from listing(p, q)))
            if doomed:
                recs = yield from listing(p, ListQuery(prefix=_CKPT, depth=_CKPT_DEPTH, values=False))
                yield from self._collect_flow(p, [r.name for r in recs], doomed, orphans=False)

    def _collect_flow(self, p: Partition, names: Sequence[str], doomed: set[str], *, orphans: bool) -> Flow[None]:
        """Delete ``doomed`` checkpoints, their writes and unreferenced blobs, atomically.

        ``orphans=True`` also deletes writes whose checkpoint is not kept
        (``prune``); otherwise only the doomed checkpoints' writes go.
        """
        remaining = [n for n in names if n not in doomed]
        referenced: set[str] = set()
        if remaining:
            for rec in (yield from get(p, remaining)):
                if rec is not None:
                    referenced.update(self._decode_checkpoint(p, rec).blobs.values())
        kept = set(remaining)
        deletes = [Delete(n) for n in sorted(doomed)]
        writes, old_writes, blobs = yield from parallel(
            [
                ListOp(p, ListQuery(prefix=_CKPT, depth=_WRITES_DEPTH, values=False)),
                ListOp(p, ListQuery(prefix=_OLD_WRITE, values=False)),
                ListOp(p, ListQuery(prefix=_BLOB, values=False)),
            ]
        )
        for rec in [*writes, *old_writes]:
            owner = _owner(rec.name)
            if (owner not in kept) if orphans else (owner in doomed):
                deletes.append(Delete(rec.name))
        for rec in blobs:
            if rec.name[len(_BLOB) :] not in referenced:
                deletes.append(Delete(rec.name))
        if deletes:
            raise_conflict((yield from self.write_batch(p, (), deletes)), (), deletes, None)
        self.parents.forget(p)


#: The earlier name of :class:`CheckpointLayout` (tests call its list planners through it).
SaverFlows = CheckpointLayout
