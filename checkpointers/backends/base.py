"""The backend interface: the few storage primitives every backend implements.

A backend stores **records** inside **partitions** and knows nothing about
users, scopes, LangGraph or the Agent Framework. All semantics (isolation,
names, limits, tags, append-only, digests) live above it and reach it already
checked and encoded. A backend only translates five operations to its storage,
each in a sync and an async form:

========================  ====================================================
``get(p, names)``         records by name (``None`` where absent), one round trip
``write(p, puts, dels)``  one **atomic** conditional batch inside partition ``p``
``list(p, query)``        records of ``p`` by name prefix, ordered, filtered, limited
``partitions(user, sp)``  the partition names (raw, decoded) of one user+space
``drop(p)``               delete a whole partition (every record in it)
========================  ====================================================

``many(ops)`` runs independent operations together; its default calls them
one by one (async: concurrently), a backend overrides it to batch them.

A backend over a sync-only driver (SQLite's ``sqlite3``) writes the five
operations once, sync, and gets its async face from :class:`Offload`: each
``a``-method awaits the sync one run on a worker thread, as aiosqlite does
for ``sqlite3``.

Guarantees a backend must give (the conformance suite checks them):

* **Atomic batches.** ``write`` checks every condition first; if one fails,
  nothing of the batch is applied and the result names the conflict. Otherwise
  all puts and deletes become visible together, also under ``kill -9``.
* **Conditions are checked on the server** in the same atomic step as the
  write (a transaction, a Lua script, an S3 conditional request), never
  read-then-write from the client.
* **Append mode**: absent -> write; present with the same digest -> no-op that
  returns the stored record unchanged; present with another digest -> conflict.
* **Sequence numbers**: every applied put gets a ``seq`` greater than any seq
  the partition has handed out before (no-ops keep their old seq).
* **Unchanged re-puts** (:func:`unchanged_reput`): an ``IF_MATCH`` put of the
  stored record itself (its etag is ``if_match``, same digest and tags) may be applied
  as a check only, like an append no-op: the record and its seq stay. The
  layer above re-puts a lease record that way to carry its condition
  (:mod:`checkpointers.leases`); a backend may equally rewrite it.
* **Names** are ASCII from ``[A-Za-z0-9_%/-]`` (see :mod:`checkpointers._names`),
  at most about 700 characters; ``list`` treats ``prefix`` literally.
* **Isolation**: a partition's records are only reachable through its
  :attr:`~checkpointers._names.Partition.key`; ``partitions`` only returns
  partitions whose ``user_key`` matches exactly.

Retention (:class:`Retention`, ``backend.retention``) has one meaning on
every backend. Each constructor takes ``ttl=None, refresh_on_read=False,
clock=None`` (URL: ``?ttl=SECONDS&refresh_on_read=true``):

* a partition expires ``ttl`` seconds after its last write (with
  ``refresh_on_read``, a read also pushes the expiry back, but only once less
  than half the ttl remains, so reads do not write every time);
* reads (``get``, ``list``, ``partitions``, ``many``) never return anything
  of an expired partition, even before it is collected; the check uses the
  expiry stored with the partition, so a backend opened without a ttl still
  hides what another one wrote with a ttl;
* a write to an expired, uncollected partition first removes what it held,
  in the same atomic step: old data never comes back; a write without a ttl
  stores "no expiry";
* :meth:`Backend.sweep` removes up to ``limit`` expired partitions across
  users, each atomically, re-checking the expiry inside the deleting
  transaction or script, so a partition a concurrent write just refreshed
  is never removed; writes run a small sweep at a bounded rate
  (:class:`SweepPacer`);
* :meth:`Backend.users` and :meth:`Backend.expired` are tooling (the
  ``checkpointers`` command's ``stats``/``gc``): they may scan.
"""

from __future__ import annotations

import asyncio
import bisect
import builtins
import enum
import logging
import math
import queue
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from json.encoder import encode_basestring_ascii as _json_str
from types import MappingProxyType
from typing import Any, TypeVar

from .._names import Partition, decode_component
from ..errors import InvalidArgumentError

T = TypeVar("T")

__all__ = [
    "Backend",
    "Conflict",
    "Delete",
    "ExpiredPartition",
    "ListQuery",
    "Mode",
    "Offload",
    "Put",
    "Record",
    "Retention",
    "SweepPacer",
    "WriteResult",
    "content_digest",
    "unchanged_reput",
]


class Mode(enum.Enum):
    """The condition a :class:`Put` is applied under."""

    UPSERT = "upsert"  #: always write
    CREATE = "create"  #: write only if the name is absent
    APPEND = "append"  #: absent -> write; same digest -> no-op; else conflict
    IF_MATCH = "if_match"  #: write only if present with etag == ``if_match``


# Record, Put and ListQuery are built for every record a backend reads or
# writes. They stay frozen dataclasses (fields, equality, repr,
# ``dataclasses.replace``, FrozenInstanceError on assignment), but with an
# ``__init__`` of their own (``init=False``): the generated frozen one sets
# each field with ``object.__setattr__``; these set the instance dict in one
# call, about half the construction time. Same signature, same defaults.
# (WriteResult too: two are built per write, the backend's and the lease layer's.)
_set = object.__setattr__
#: The default of ``Put.tags``: each Put gets a dict of its own, as ``default_factory=dict`` gave.
_FRESH_TAGS: Mapping[str, str] = MappingProxyType({})


@dataclass(frozen=True, init=False)
class Record:
    """One stored record, as a backend returns it.

    ``value`` is ``b""`` when it was not requested (``ListQuery.values=False``).
    ``digest`` is the SHA-256 hex of the full value as written; the layer above
    re-checks it on read and raises ``CorruptItemError`` on a mismatch.
    """

    name: str
    value: bytes
    tags: Mapping[str, str]
    etag: str
    digest: str
    seq: int

    def __init__(self, name: str, value: bytes, tags: Mapping[str, str], etag: str, digest: str, seq: int) -> None:
        _set(self, "__dict__", {"name": name, "value": value, "tags": tags, "etag": etag, "digest": digest, "seq": seq})


@dataclass(frozen=True, init=False)
class Put:
    """Write ``value`` under ``name`` if ``mode`` allows it.

    ``etag`` and ``digest`` are computed by the caller; a backend stores them
    as given.

    ``staged=True`` marks a record that nothing can reach until a later,
    non-staged put of the same batch refers to it (a content-addressed blob).
    A backend without multi-record transactions (S3) may write staged puts
    first, outside the atomic unit; a crash then leaves only unreferenced
    records, which ``prune`` removes. Staged puts must use ``Mode.APPEND``
    and be **content-addressed**: their name is derived from their digest, so
    one name always means the same bytes. A backend may therefore write them
    with a plain set-if-absent, outside its conditional script or transaction,
    without comparing digests; they must still be listed, read and dropped
    like any other record.
    """

    name: str
    value: bytes
    digest: str
    etag: str
    tags: Mapping[str, str] = field(default_factory=dict)
    mode: Mode = Mode.UPSERT
    if_match: str | None = None
    staged: bool = False

    def __init__(
        self,
        name: str,
        value: bytes,
        digest: str,
        etag: str,
        tags: Mapping[str, str] = _FRESH_TAGS,
        mode: Mode = Mode.UPSERT,
        if_match: str | None = None,
        staged: bool = False,
    ) -> None:
        _set(self, "__dict__", {
            "name": name, "value": value, "digest": digest, "etag": etag,
            "tags": {} if tags is _FRESH_TAGS else tags, "mode": mode, "if_match": if_match, "staged": staged,
        })  # fmt: skip


@dataclass(frozen=True)
class Delete:
    """Delete ``name`` (absent is fine) unless ``if_match`` is set and differs."""

    name: str
    if_match: str | None = None


@dataclass(frozen=True)
class Conflict:
    """Why a batch was refused: the operation's position and what is stored.

    ``index`` counts puts first, then deletes, in the order given.
    """

    index: int
    name: str
    existing: Record | None


@dataclass(frozen=True, init=False)
class WriteResult:
    """Outcome of :meth:`Backend.write`.

    On success ``records[i]`` is the stored record of ``puts[i]`` (for an
    append no-op, the record that was already there) and ``conflict`` is None.
    On a refused batch ``records`` is empty and ``conflict`` says why.
    """

    records: Sequence[Record]
    conflict: Conflict | None = None

    def __init__(self, records: Sequence[Record], conflict: Conflict | None = None) -> None:
        _set(self, "__dict__", {"records": records, "conflict": conflict})


@dataclass(frozen=True, init=False)
class ListQuery:
    """What :meth:`Backend.list` returns.

    * ``prefix``: only names starting with it (literal, no patterns).
    * ``order``: ``"name"`` (lexicographic) or ``"seq"`` (write order).
    * ``descending``: newest / highest first.
    * ``limit``: at most this many records (``None`` = all).
    * ``tags``: only records carrying every one of these exact tag values.
    * ``start`` / ``stop``: a half-open range on the ordering field, in the
      field's own type (``str`` for name, ``int`` for seq), applied before
      the limit: ``start <= x < stop``.
    * ``values``: ``False`` lets a backend skip reading values (``b""``).
    * ``depth``: only names with exactly this many ``/`` after ``prefix``
      (``None`` = any). Names form a tree on ``/``; ``depth=0`` under
      ``"c/x/"`` selects ``c/x/1`` but not ``c/x/1/w``.
    * ``children``: each selected record is directly followed, in the
      result, by its *children*: every record whose name starts with the
      selected name plus ``/``, in ascending name order, read in the same
      snapshot. Children are not filtered (prefix aside) and do not count
      towards ``limit``. Requires ``depth`` (so a child is never also a
      selected record). "The newest checkpoint and its writes" is then one
      query: one S3 LIST, one Redis script, one SQLite read transaction.
    """

    prefix: str = ""
    order: str = "name"
    descending: bool = False
    limit: int | None = None
    tags: Mapping[str, str] = field(default_factory=dict)
    start: str | int | None = None
    stop: str | int | None = None
    values: bool = True
    depth: int | None = None
    children: bool = False

    def __init__(
        self,
        prefix: str = "",
        order: str = "name",
        descending: bool = False,
        limit: int | None = None,
        tags: Mapping[str, str] = _FRESH_TAGS,
        start: str | int | None = None,
        stop: str | int | None = None,
        values: bool = True,
        depth: int | None = None,
        children: bool = False,
    ) -> None:
        _set(self, "__dict__", {
            "prefix": prefix, "order": order, "descending": descending, "limit": limit,
            "tags": {} if tags is _FRESH_TAGS else tags, "start": start, "stop": stop, "values": values,
            "depth": depth, "children": children,
        })  # fmt: skip
        if depth is not None or children:
            self.__post_init__()

    def __post_init__(self) -> None:
        if self.depth is not None and self.depth < 0:
            raise ValueError(f"ListQuery.depth must be None or >= 0, got {self.depth!r}")
        if self.children and self.depth is None:
            raise ValueError("ListQuery(children=True) needs a depth: a child must not also be a selected record")

    def matches(self, record: Record) -> bool:
        """Whether ``record`` passes prefix, depth, tag and range filters (not the limit)."""
        if not record.name.startswith(self.prefix):
            return False
        if self.depth is not None and record.name.count("/", len(self.prefix)) != self.depth:
            return False
        if any(record.tags.get(k) != v for k, v in self.tags.items()):
            return False
        pos: str | int = record.name if self.order == "name" else record.seq
        if self.start is not None and pos < self.start:  # type: ignore[operator]
            return False
        if self.stop is not None and pos >= self.stop:  # type: ignore[operator]
            return False
        return True

    def at_depth(self, name: str) -> bool:
        """Whether ``name`` (under ``prefix``) passes the depth filter."""
        return self.depth is None or name.count("/", len(self.prefix)) == self.depth

    def sort_key(self, record: Record) -> str | int:
        """The ordering field of ``record`` under this query."""
        return record.name if self.order == "name" else record.seq


def content_digest(digest: str) -> str:
    """The content part of a stored digest: the SHA-256 hex of the value.

    A record's ``digest`` is ``<sha256 hex of the value>`` (records written
    before 0.2) or ``<sha256 hex>.<seal>``, where the seal binds the record to
    its user, space, partition, name and tags (see
    :mod:`checkpointers._integrity`). Append mode compares **content** digests:
    the same bytes re-appended under a rotated integrity key, or over a record
    written before seals existed, are still a no-op. Backends treat the digest
    as an opaque ASCII string otherwise (no newline, at most 128 characters).
    """
    return digest.split(".", 1)[0]


def tags_json(tags: Mapping[str, str]) -> str:
    """A record's tags as one canonical, ASCII JSON object (keys sorted, no spaces).

    ``json.dumps(tags, sort_keys=True, separators=(",", ":"))`` for str -> str
    tags, built directly: backends that keep the tags next to a record (SQLite's
    ``tags`` column, Redis's metadata) store this and read it with ``json.loads``.
    """
    if not tags:  # most records (blobs, writes)
        return "{}"
    # A list, not a generator: join takes it as is (no generator resumed per tag).
    return "{" + ",".join([f"{_json_str(k)}:{_json_str(v)}" for k, v in sorted(tags.items())]) + "}"


def children_range(name: str) -> tuple[str, str]:
    """The half-open name range ``[lo, hi)`` holding exactly the children of ``name``.

    ``name + "/"`` up to ``name + "0"``: ``"0"`` is the character after ``/``.
    """
    return name + "/", name + "0"


def with_children(query: ListQuery, picked: Sequence[Record], pool: Iterable[Record]) -> list[Record]:
    """``picked`` with, when ``query.children``, each record's children from ``pool`` right after it.

    For a backend that has read every record under the query's prefix anyway
    (``pool``; every child of a pick is under the prefix): the children in
    ascending name order, as :class:`ListQuery` specifies.
    """
    if not query.children:
        return list(picked)
    pool = sorted(pool, key=lambda r: r.name)
    names = [r.name for r in pool]
    out: list[Record] = []
    for rec in picked:
        out.append(rec)
        lo, hi = children_range(rec.name)
        out.extend(pool[bisect.bisect_left(names, lo) : bisect.bisect_left(names, hi)])
    return out


def check_batch(puts: Sequence[Put], deletes: Sequence[Delete]) -> None:
    """Refuse a batch that names one record twice (its outcome would be ambiguous)."""
    if not deletes and len(puts) <= 2:  # the common batches: one record, or a lease record's condition and one
        if len(puts) < 2 or puts[0].name != puts[1].name:
            return
        raise ValueError("a write batch must not name the same record twice")
    names = {p.name for p in puts}
    if len(names) != len(puts) or (deletes and len(names.union(d.name for d in deletes)) != len(puts) + len(deletes)):
        raise ValueError("a write batch must not name the same record twice")


def unchanged_reput(put: Put, stored: Record | None) -> bool:
    """Whether ``put`` re-puts ``stored`` unchanged under its own etag (a condition, nothing to write).

    An ``IF_MATCH`` put whose ``etag`` is its ``if_match`` and whose digest
    and tags are the stored ones (tags compared too: a digest without a seal
    does not bind them) holds exactly the stored record: a backend may check
    it and keep the record (and its seq) instead of rewriting it. Only call
    it once the condition passed.
    """
    return (
        stored is not None
        and put.mode is _IF_MATCH
        and put.etag == put.if_match == stored.etag
        and put.digest == stored.digest
        and put.tags == stored.tags
    )


_UPSERT, _CREATE, _APPEND, _IF_MATCH = Mode.UPSERT, Mode.CREATE, Mode.APPEND, Mode.IF_MATCH


def evaluate(
    puts: Sequence[Put],
    deletes: Sequence[Delete],
    existing: Mapping[str, Record],
) -> tuple[Conflict | None, list[int]]:
    """Check a batch's conditions against what is stored, without I/O.

    Returns ``(conflict, noops)``: the first failing condition (or None) and
    the indexes of puts that are append no-ops. Backends that can run Python
    next to their data (memory, SQLite) call this inside their transaction;
    the others implement the same rules on the server.
    """
    noops: list[int] = []
    stored = existing.get
    for i, put in enumerate(puts):
        mode = put.mode
        if mode is _UPSERT:
            continue
        cur = stored(put.name)
        if cur is None:
            if mode is _IF_MATCH:
                return Conflict(i, put.name, cur), noops
        elif mode is _IF_MATCH:
            if cur.etag != put.if_match:
                return Conflict(i, put.name, cur), noops
        elif mode is _CREATE:
            return Conflict(i, put.name, cur), noops
        elif mode is _APPEND:
            # The same stored digest is the same content; else compare the content parts.
            if cur.digest != put.digest and content_digest(cur.digest) != content_digest(put.digest):
                return Conflict(i, put.name, cur), noops
            noops.append(i)
    if not deletes:  # nearly every batch
        return None, noops
    for j, delete in enumerate(deletes):
        if delete.if_match is not None:
            cur = stored(delete.name)
            if cur is None or cur.etag != delete.if_match:
                return Conflict(len(puts) + j, delete.name, cur), noops
    return None, noops


# -- retention -------------------------------------------------------------------------

_log = logging.getLogger("checkpointers.retention")

#: At most this many partitions per sweep a write triggers (``SweepPacer``).
AUTO_SWEEP_LIMIT = 64
#: Writes trigger at most one sweep per ``min(ttl / 10, AUTO_SWEEP_MAX_INTERVAL)`` seconds.
AUTO_SWEEP_MAX_INTERVAL = 60.0


def check_ttl(ttl: object) -> float | None:
    """``ttl`` as seconds (``None``: no expiry); anything else than a positive finite number is refused."""
    if ttl is None:
        return None
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)):
        raise InvalidArgumentError("ttl", f"must be a number of seconds or None, got {ttl!r}")
    if not math.isfinite(ttl) or ttl <= 0:
        raise InvalidArgumentError("ttl", f"must be a positive, finite number of seconds, got {ttl!r}")
    return float(ttl)


@dataclass(frozen=True)
class Retention:
    """How long a partition lives: ``ttl`` seconds after its last write.

    ``ttl=None`` keeps partitions forever. ``refresh_on_read`` lets reads
    extend the life too, but only when less than half the ttl remains
    (:meth:`refresh_due`), so a hot partition is rewritten at most about once
    per half-ttl. ``clock`` returns seconds since the epoch (``time.time``);
    tests inject their own. Expiries are stored as absolute times from this
    clock (SQLite/PostgreSQL ``expires_at``, Redis ``PEXPIREAT``-equivalent
    ``PEXPIRE``), so every process writing one store needs clocks that agree
    to well under the ttl.

    >>> r = Retention(ttl=10, clock=lambda: 100.0)
    >>> r.deadline(), r.expired(105.0), r.expired(100.0), r.refresh_due(104.0)
    (110.0, False, True, False)
    """

    ttl: float | None = None
    refresh_on_read: bool = False
    clock: Callable[[], float] = time.time

    def __post_init__(self) -> None:
        object.__setattr__(self, "ttl", check_ttl(self.ttl))
        if not isinstance(self.refresh_on_read, bool):
            raise InvalidArgumentError("refresh_on_read", f"must be True or False, got {self.refresh_on_read!r}")
        if self.clock is None:
            object.__setattr__(self, "clock", time.time)

    @classmethod
    def of(
        cls, ttl: object = None, refresh_on_read: bool = False, clock: Callable[[], float] | None = None
    ) -> Retention:
        """The retention a backend constructor's ``ttl``/``refresh_on_read``/``clock`` arguments describe."""
        return cls(check_ttl(ttl), refresh_on_read, clock or time.time)

    def now(self) -> float:
        """The clock's current time (seconds since the epoch)."""
        return float(self.clock())

    def deadline(self, now: float | None = None) -> float | None:
        """The expiry a write made ``now`` stores (``None``: never expires)."""
        if self.ttl is None:
            return None
        return (self.now() if now is None else now) + self.ttl

    def expired(self, expires_at: float | None, now: float | None = None) -> bool:
        """Whether a partition with this stored expiry is gone (``None``: never)."""
        return expires_at is not None and expires_at <= (self.now() if now is None else now)

    def refresh_due(self, expires_at: float | None, now: float | None = None) -> bool:
        """Whether a read should push the expiry back: ``refresh_on_read`` and under half the ttl left."""
        if not self.refresh_on_read or self.ttl is None or expires_at is None:
            return False
        now = self.now() if now is None else now
        return now < expires_at < now + self.ttl / 2

    def pacer(self) -> SweepPacer:
        """A fresh :class:`SweepPacer` for one backend instance."""
        return SweepPacer(self)


class SweepPacer:
    """Decides when a write also runs a small sweep: bounded work at a bounded rate.

    With a ttl, :meth:`due` is true at most once per
    ``min(ttl / 10, 60 s)`` per backend instance (the first time on the first
    write); the write then sweeps at most :data:`AUTO_SWEEP_LIMIT` (64)
    partitions. The cost is one indexed query (SQLite/PostgreSQL) per
    interval plus the deletion of what expired; on S3 a scan of every
    partition (one LIST per user and space, one GET per partition). Redis
    writes never sweep (its keys expire natively).
    Without a ttl it is never due (``gc`` collects then).
    """

    def __init__(self, retention: Retention) -> None:
        self.retention = retention
        ttl = retention.ttl
        self.interval = None if ttl is None else min(ttl / 10, AUTO_SWEEP_MAX_INTERVAL)
        self._next = -math.inf
        self._lock = threading.Lock()

    def due(self) -> bool:
        """True (and the next slot is taken) when a write should sweep now."""
        if self.interval is None:
            return False
        now = self.retention.now()
        with self._lock:
            if now < self._next:
                return False
            self._next = now + self.interval
            return True


@dataclass(frozen=True)
class ExpiredPartition:
    """One expired, not yet collected partition, as :meth:`Backend.expired` lists it.

    ``user``/``space`` are decoded from ``user_key`` (``None`` for a component
    stored hashed because it was too long); ``name`` is the raw partition name;
    ``expires_at`` is ``None`` where the storage expired it on its own and
    keeps no date (Redis: only the registry entry is left to collect).
    """

    key: str
    user_key: str
    name: str
    expires_at: float | None

    @property
    def user(self) -> str | None:
        """The user id, or ``None`` when stored hashed."""
        return split_user_key(self.user_key)[0]

    @property
    def space(self) -> str | None:
        """The space (``"items"``, ``"langgraph"``...)."""
        return split_user_key(self.user_key)[1]


def split_user_key(user_key: str) -> tuple[str | None, str | None]:
    """``(user, space)`` of a :attr:`Partition.user_key` (``None`` for a hashed component)."""
    user, _, rest = user_key.partition("/")
    return decode_component(user), decode_component(rest.rstrip("/"))


def read_partitions(ops: Iterable[Any]) -> builtins.list[Partition]:
    """The distinct partitions the reads (gets and listings) among ``ops`` touch, in first-seen order.

    For ``refresh_on_read`` after a batched read (:meth:`Backend.many`).
    """
    seen: dict[str, Partition] = {}
    for op in ops:
        partition = getattr(op, "partition", None)
        if isinstance(partition, Partition) and (hasattr(op, "names") or hasattr(op, "query")):
            seen.setdefault(partition.key, partition)
    return builtins.list(seen.values())


def users_of(user_keys: Iterable[str], space: str | None) -> builtins.list[str]:
    """The sorted, distinct users of these user keys, in ``space`` (``None``: any).

    Users stored hashed (ids whose encoding passes 160 characters) cannot be
    named and are left out.
    """
    found: set[str] = set()
    for key in user_keys:
        user, sp = split_user_key(key)
        if user is not None and (space is None or sp == space):
            found.add(user)
    return sorted(found)


class Backend(ABC):
    """Base class of every backend; see the module docstring for the rules.

    Subclasses implement the five operations twice (sync and ``a``-prefixed
    async) over their own driver, and ``close``/``aclose``. Drivers' errors are
    translated to :class:`~checkpointers.errors.BackendUnavailableError` at
    this edge.
    """

    #: Short name used in URLs, reports and test ids ("sqlite", "redis", ...).
    kind: str = "backend"
    #: Whether one more condition in a batch (an unchanged ``IF_MATCH`` re-put
    #: of one record, or a ``CREATE``) costs about nothing: checked in the same
    #: transaction / script as the batch. Every backend checks a batch's
    #: conditions atomically (the contract); this only says what one more costs.
    #: True (memory; SQLite, Redis, PostgreSQL can declare it): a write without
    #: a lease carries the "no live lease" condition itself, one backend write
    #: (:func:`checkpointers.leases.unleased_write_flow`). False, the default
    #: (and S3, where it turns one conditional PUT into a fenced batch of
    #: several requests): such a write reads the lease record first and
    #: carries the condition only when a lease record exists.
    inline_conditions: bool = False
    #: How long partitions live (see :class:`Retention`); set by the constructor.
    retention: Retention = Retention()
    #: When writes sweep (see :class:`SweepPacer`); set with ``retention``.
    _pacer: SweepPacer = SweepPacer(Retention())

    def set_retention(
        self, ttl: object = None, refresh_on_read: bool = False, clock: Callable[[], float] | None = None
    ) -> None:
        """Set this backend's retention (constructors call it; tests inject a clock on an open backend).

        A backend that caches retention elsewhere (SQLite's connections)
        overrides it and calls this one.
        """
        self.retention = Retention.of(ttl, refresh_on_read, clock)
        self._pacer = self.retention.pacer()

    def _set_retention(
        self, ttl: object = None, refresh_on_read: bool = False, clock: Callable[[], float] | None = None
    ) -> None:
        """The constructor's retention arguments (call from ``__init__``): :meth:`set_retention`."""
        self.set_retention(ttl, refresh_on_read, clock)

    @abstractmethod
    def get(self, partition: Partition, names: Sequence[str]) -> list[Record | None]:
        """Return the records named ``names`` (``None`` where absent), in order."""

    @abstractmethod
    def write(
        self, partition: Partition, puts: Sequence[Put], deletes: Sequence[Delete] = ()
    ) -> WriteResult:
        """Apply one atomic, conditional batch; see :func:`evaluate` for the rules."""

    @abstractmethod
    def list(self, partition: Partition, query: ListQuery) -> list[Record]:
        """Return the records of ``partition`` that ``query`` selects, ordered."""

    @abstractmethod
    def partitions(self, user: str, space: str) -> builtins.list[str]:
        """Return the names of the non-empty partitions of ``user`` in ``space``."""

    @abstractmethod
    def drop(self, partition: Partition) -> int:
        """Delete every record of ``partition``; return how many were deleted."""

    @abstractmethod
    async def aget(self, partition: Partition, names: Sequence[str]) -> builtins.list[Record | None]:
        """Async :meth:`get`."""

    @abstractmethod
    async def awrite(
        self, partition: Partition, puts: Sequence[Put], deletes: Sequence[Delete] = ()
    ) -> WriteResult:
        """Async :meth:`write`."""

    @abstractmethod
    async def alist(self, partition: Partition, query: ListQuery) -> builtins.list[Record]:
        """Async :meth:`list`."""

    @abstractmethod
    async def apartitions(self, user: str, space: str) -> builtins.list[str]:
        """Async :meth:`partitions`."""

    @abstractmethod
    async def adrop(self, partition: Partition) -> int:
        """Async :meth:`drop`."""

    # -- retention (tooling and collection; see the module docstring) ------------

    def sweep(self, limit: int = 1000) -> int:
        """Remove up to ``limit`` expired partitions across users; return how many.

        Each removal is atomic and re-checks the expiry inside it, so a
        partition a concurrent write has just refreshed stays. Collects by
        the stored expiries, whatever this instance's ``ttl``.
        """
        raise NotImplementedError(f"{self.kind} backend: sweep is not implemented")

    async def asweep(self, limit: int = 1000) -> int:
        """Async :meth:`sweep`."""
        raise NotImplementedError(f"{self.kind} backend: asweep is not implemented")

    def expired(self, limit: int = 1000) -> builtins.list[ExpiredPartition]:
        """Up to ``limit`` expired, uncollected partitions across users, soonest expiry first (``gc --dry-run``)."""
        raise NotImplementedError(f"{self.kind} backend: expired is not implemented")

    async def aexpired(self, limit: int = 1000) -> builtins.list[ExpiredPartition]:
        """Async :meth:`expired`."""
        raise NotImplementedError(f"{self.kind} backend: aexpired is not implemented")

    def users(self, space: str | None = None) -> builtins.list[str]:
        """The users holding live partitions (in ``space``, or any), sorted; tooling, may scan."""
        raise NotImplementedError(f"{self.kind} backend: users is not implemented")

    async def ausers(self, space: str | None = None) -> builtins.list[str]:
        """Async :meth:`users`."""
        raise NotImplementedError(f"{self.kind} backend: ausers is not implemented")

    def expiry(self, partition: Partition) -> float | None:
        """The stored expiry of ``partition`` (``None``: none, or absent); for ``threads``."""
        return None

    async def aexpiry(self, partition: Partition) -> float | None:
        """Async :meth:`expiry`."""
        return self.expiry(partition)

    def _auto_sweep(self) -> None:
        """After a write: a sweep of at most 64 partitions when the pacer says so.

        The write has already committed: a failing sweep is logged, not raised.
        """
        if self._pacer.due():
            try:
                self.sweep(AUTO_SWEEP_LIMIT)
            except Exception:  # noqa: BLE001 - the caller's write succeeded; the next slot retries
                _log.warning("%s: background sweep failed", self.kind, exc_info=True)

    async def _aauto_sweep(self) -> None:
        """Async :meth:`_auto_sweep`."""
        if self._pacer.due():
            try:
                await self.asweep(AUTO_SWEEP_LIMIT)
            except Exception:  # noqa: BLE001 - the caller's write succeeded; the next slot retries
                _log.warning("%s: background sweep failed", self.kind, exc_info=True)

    def many(self, ops: Sequence[Any]) -> builtins.list[Any]:
        """Run independent operations (the flow ops of :mod:`checkpointers._flows`).

        Returns their results in order. The default runs them one by one; a
        backend may send them together (Redis: one pipeline, one round trip).
        """
        return [op.call(self) for op in ops]

    async def amany(self, ops: Sequence[Any]) -> builtins.list[Any]:
        """Async :meth:`many`; the default runs them concurrently (``asyncio.gather``)."""
        return list(await asyncio.gather(*(op.acall(self) for op in ops)))

    def close(self) -> None:  # noqa: B027 - a no-op default on purpose: only backends holding connections override it
        """Release connections (idempotent)."""

    async def aclose(self) -> None:
        """Async :meth:`close`."""
        self.close()

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Backend:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


# -- the async face of a sync driver -----------------------------------------------


class Offload:
    """Run sync calls on one worker thread and await them from any event loop.

    ``await offload.run(fn, *args)`` queues ``fn(*args)`` for the worker
    (started on first use) and awaits its result; the event loop never runs
    driver code. The worker hands the result to the loop that awaits it
    (``call_soon_threadsafe`` on that loop's future), so one worker serves
    every event loop of the process, each in its own thread, and a loop
    that has closed meanwhile simply gets nothing. Calls run one at a time,
    in the order queued (as on an aiosqlite connection); a call whose
    awaiting task is cancelled still runs, and its result is dropped.

    Sync calls never go through the worker (they run on the caller's thread),
    so a thread that runs an event loop can make them without deadlock.

    ``close()`` stops the worker after the calls already queued (without
    waiting); ``aclose()`` waits for that without blocking the loop. Later
    calls raise ``closed()``. The worker is a daemon thread: a backend the
    program forgot to close does not hang interpreter exit, and one that is
    garbage-collected stops its worker.

    >>> async def main(offload):
    ...     try:
    ...         return await offload.run(sum, [1, 2, 3])
    ...     finally:
    ...         await offload.aclose()
    >>> asyncio.run(main(Offload("example")))
    6
    """

    def __init__(self, name: str, closed: Callable[[], BaseException] | None = None) -> None:
        self.name = name
        self._closed_error = closed or (lambda: RuntimeError(f"{name}: closed"))
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._closed = False

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the worker thread, awaited."""
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        with self._lock:
            if self._closed:
                raise self._closed_error()
            if self._thread is None:
                self._thread = threading.Thread(target=_work, args=(self._jobs,), name=self.name, daemon=True)
                self._thread.start()
            self._jobs.put((future, fn, args))
        return await future

    def close(self) -> None:
        """Stop the worker once the calls already queued have run (idempotent, no wait)."""
        self._stop(None)

    async def aclose(self) -> None:
        """:meth:`close`, and wait until the worker has ended, without blocking the loop."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        thread = self._stop(done)
        if thread is None:
            return
        await done
        while thread.is_alive():  # it has run its last call and is returning
            await asyncio.sleep(0.0005)

    def _stop(self, done: asyncio.Future[None] | None) -> threading.Thread | None:
        with self._lock:
            if self._closed:
                return None
            self._closed = True
            thread = self._thread
            if thread is not None:
                self._jobs.put((done, None, ()))
        return thread

    def __del__(self) -> None:
        if self._thread is not None and not self._closed:
            self._jobs.put((None, None, ()))


#: A queued call: the future to complete, the function (``None``: stop), its arguments.
_Job = tuple["asyncio.Future[Any] | None", "Callable[..., Any] | None", "tuple[Any, ...]"]


def _work(jobs: queue.SimpleQueue[_Job]) -> None:
    """The worker of an :class:`Offload`: run the queued calls until told to stop.

    It holds the queue, not the :class:`Offload`, and lets go of a call's
    function and arguments before handing its result over: once a call has
    been awaited, nothing here keeps its backend alive, so a backend dropped
    without ``close()`` is collected and stops its worker.
    """
    while True:
        future, fn, args = jobs.get()
        if fn is None:
            if future is not None:
                _deliver(future, _set_result, None)
            return
        setter: Callable[[asyncio.Future[Any], Any], None]
        try:
            setter, value = _set_result, fn(*args)
        except BaseException as exc:  # noqa: B036 - handed to the awaiting task, as aiosqlite does
            setter, value = _set_exception, exc
        del fn, args
        _deliver(future, setter, value)
        del future, value


def _deliver(
    future: asyncio.Future[Any] | None, setter: Callable[[asyncio.Future[Any], Any], None], value: Any
) -> None:
    """Have ``future``'s own event loop call ``setter(future, value)``."""
    if future is None:
        return
    try:
        future.get_loop().call_soon_threadsafe(setter, future, value)
    except RuntimeError:  # that event loop has closed: nobody awaits the result
        pass


def _set_result(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():  # cancelled meanwhile
        future.set_result(value)


def _set_exception(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
