"""Redis / Valkey 7+ backend: plain data structures, no modules, Cluster-ready.

Every key of a partition carries the partition's key as a Cluster hash tag,
so all five live in one slot and one Lua script touches them all::

    P:{pk}:r      hash    "m:<name>" -> metadata [+ value], "v:<name>" -> value bytes
    P:{pk}:n      zset    every name, score 0          (name order, ZRANGEBYLEX)
    P:{pk}:x      zset    "<anc>|<seq16>|<name>"       (seq order, per first-level ancestor)
    P:{pk}:t      zset    "s<tag>|<seq16>|<name>", "n<tag>|<name>"  (tag indexes)
    P:{pk}:seq    string  the partition's sequence counter (INCR)
    P:{<user_key>}:parts  hash  pk -> raw partition name (the user's registry)

``get`` is one ``HMGET``, ``list`` one script, ``write`` one pipeline around
one atomic script (``lua/write.lua``) that checks every condition before it
applies anything; the user registry is kept right with idempotent commands
around it. This module is the key layout and the translation of the contract
(arguments, replies, damaged data as :class:`CorruptItemError`); the wire
(clients, round trips, retries, the lean and stock transports) is in
:mod:`._redis_transport`, the scripts in ``lua/``. The whole design: the
layout, round trips, the registry protocol, ``ttl``, retries, damaged data
and the transports, is in ``docs/redis.md``.
"""

from __future__ import annotations

import asyncio
import builtins
import functools
import json
import zlib
from collections.abc import Callable, Generator, Iterable, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any, Generic, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from .._names import Partition, decode_component, encode_component
from ..errors import CorruptItemError
from . import retention_options, url_flag
from ._redis_transport import (
    DRIVER_ERRORS,
    TRANSIENT_ERRORS,
    TRANSPORTS,
    Command,
    Eval,
    Link,
    Script,
    is_transient,
    kept_in_place,
    translate_errors,
)
from .base import (
    Backend,
    Conflict,
    Delete,
    ExpiredPartition,
    ListQuery,
    Mode,
    Put,
    Record,
    WriteResult,
    check_batch,
    content_digest,
    read_partitions,
    tags_json,
    users_of,
)
from .ops import DropOp, GetOp, ListOp, PartitionsOp, WriteOp, arun, run

__all__ = ["DRIVER_ERRORS", "RedisBackend", "TRANSIENT_ERRORS", "is_transient", "translate_errors"]

#: How many ``/``-terminated ancestors of a name get their own seq index: one
#: (``c/`` for ``c/_ns/...``). A seq-order query under a deeper prefix walks that
#: index, skipping the names outside the prefix, or reads the names under the
#: prefix and sorts them, whichever the counts say is cheaper; no face of the
#: package asks for one (a checkpoint listing is in name order), and each
#: level costs every record one member (~170 bytes at rest) and every write
#: one more ``ZADD`` argument. Members of the second level that records written
#: before still have are never read: :func:`_legacy_sweep` removes them.
ANCESTOR_DEPTH = 1
_SEQ_DIGITS = 16
#: How many partitions a backend remembers having filled (then it starts over).
_FILLED_MAX = 10_000
_TOP = b"\xff"  # above every name byte: "p" + _TOP bounds the names starting with p
#: A value of at least this many bytes that is not a staged blob is stored
#: zlib-compressed (level 1) when that saves at least an eighth of it.
_SQUEEZE_MIN = 1024
#: The metadata's last line when the value is stored compressed in its own
#: ``v:`` field (records without a last line keep it raw there).
_SQUEEZED = b"\nz"
#: The metadata's last line opening with one of these holds the value itself,
#: after that byte: raw (``=``) or compressed (``~``). One hash field a record
#: instead of two (the field name, the name again, and its entry cost ~160 B).
_INLINE, _INLINE_SQUEEZED = b"\n=", b"\n~"
#: A value stored in at most this many bytes (compressed or not) that is not a
#: staged blob is stored inline; a larger one keeps its own field, so reading
#: metadata (conditions, filters, a listing without values) never copies it.
_INLINE_MAX = 8192
#: A value is stored compressed only if it expands at most this many times, and a
#: reader refuses one that would expand more: bytes written straight into Redis
#: cannot make a read inflate a small field into an unbounded one (a zip bomb).
_SQUEEZE_RATIO = 256


def _inflate(packed: bytes) -> bytes:
    """A compressed field's value; ``zlib.error`` if damaged or past :data:`_SQUEEZE_RATIO`."""
    inflater = zlib.decompressobj()
    value = inflater.decompress(packed, _SQUEEZE_RATIO * len(packed))
    if not inflater.eof or inflater.unconsumed_tail or inflater.unused_data:
        raise zlib.error(f"the value does not end within {_SQUEEZE_RATIO}x its stored size")
    return value
_T = TypeVar("_T")


def _lua(*names: str) -> Script:
    """The script made of ``lua/<name>.lua`` files (package data), in order."""
    folder = resources.files(__package__).joinpath("lua")
    return Script("".join(folder.joinpath(f"{name}.lua").read_text("utf-8") for name in names))


# One source for the sync and the async client (same SHA, one cache entry).
WRITE_SCRIPT = _lua("common", "write")
LIST_SCRIPT = _lua("common", "list")
DROP_SCRIPT = _lua("drop")
_SCRIPTS = (WRITE_SCRIPT, LIST_SCRIPT, DROP_SCRIPT)


@dataclass(frozen=True)
class _RoundTrip:
    """A request to the transport: one pipeline of commands, sent in one round trip.

    The operations below are generators of these (:data:`_RoundTrips`),
    driven by the package's one driver (:func:`.ops.run` / :func:`.ops.arun`)
    with the backend as target. A command that met a key of ours holding the
    wrong type makes the round trip raise its :class:`CorruptItemError` into
    the operation that sent it; ``raw`` (the merged round trips of
    :meth:`RedisBackend._parallel_op`) hands the replies back as they are,
    for the parallel operation to route each one to its sender.
    """

    commands: Sequence[Command]
    raw: bool = False

    def call(self, backend: RedisBackend) -> _Replies:
        return self._checked(backend._execute(self))

    async def acall(self, backend: RedisBackend) -> _Replies:
        return self._checked(await backend._aexecute(self))

    def _checked(self, replies: _Replies) -> _Replies:
        if replies.corrupt is not None and not self.raw:
            raise replies.corrupt
        return replies


@dataclass(frozen=True)
class _Replies:
    """A round trip's replies; ``retried`` when an earlier attempt failed.

    ``corrupt``: a command met a key of ours holding the wrong type; its
    reply is that error (see :meth:`RedisBackend._replies`), also raised
    into the operation that sent it.
    """

    values: list[Any]
    retried: bool
    corrupt: CorruptItemError | None = None


#: An operation of this backend: a generator of round trips that returns its result.
_RoundTrips = Generator[_RoundTrip, _Replies, Any]
#: Earlier names (tests build round trips by hand).
_Call, _Reply = _RoundTrip, _Replies


# -- pure helpers: key names, arguments, parsing ------------------------------


def _ancestors(name: str) -> list[str]:
    """The first :data:`ANCESTOR_DEPTH` ``/``-terminated prefixes of ``name``."""
    out: list[str] = []
    at = -1
    for _ in range(ANCESTOR_DEPTH):
        at = name.find("/", at + 1)
        if at < 0:
            break
        out.append(name[: at + 1])
    return out


def _tag_pairs(tags: Any) -> list[str]:
    """Index members of tags: ``enc(k)=enc(v)`` (no space, ``|``, ``{``, ``}``)."""
    return [_tag_pair(k, v) for k, v in sorted(tags.items())]


@functools.lru_cache(maxsize=4096)
def _tag_pair(key: str, value: str) -> str:
    return f"{encode_component(key)}={encode_component(value)}"


def _legacy_sweep(x_key: str, names: Iterable[str]) -> list[Command]:
    """The commands removing the seq index members of earlier layouts: those of
    the whole partition (``|<seq16>|<name>``, ``[|`` .. ``(}``) and those of a
    second ancestor level (``c/_ns/|<seq16>|<name>``, written before
    :data:`ANCESTOR_DEPTH` was 1) under the first-level ancestors of ``names``:
    ``[A/`` .. ``(A/|`` holds exactly the members under ``A/`` but not of
    ``A/`` itself (a name byte after ``A/`` sorts below ``|``: encoded
    components are ``[A-Za-z0-9_%-]``). A range with nothing left costs one
    lookup. (The write script does not sweep them: members an older release
    adds later are never read, and go at the next backend's first write.)"""
    families = {a for name in names for a in _ancestors(name)}
    sweep: list[Command] = [("ZREMRANGEBYLEX", x_key, "[|", "(}")]
    return sweep + [("ZREMRANGEBYLEX", x_key, f"[{a}", f"({a}|") for a in sorted(families)]


def _pad(seq: int) -> str:
    return f"{seq:0{_SEQ_DIGITS}d}"


def _record(name: str | bytes, meta: bytes, value: bytes | None, stored: bool = True) -> Record:
    """The record stored as ``meta`` and ``value``; damage raises :class:`CorruptItemError`.

    ``stored``: ``value`` is the field as stored (decompressed when the
    metadata says so); else it is the record's value already (the put's own
    value, or ``b""`` for a listing without values). On every read, so only
    cheap checks; :func:`_damage` says what is wrong.
    """
    try:
        seq, etag, digest, _pairs, tags = meta.split(b"\n", 4)
        tags, flag, inline = tags.partition(b"\n")
        if flag:
            how, inline = inline[:1], inline[1:]
            if how == b"z" and not inline:
                if stored and value is not None:
                    value = _inflate(value)
            elif how == b"=":
                if stored:
                    value = inline
            elif how == b"~":
                if stored:
                    value = _inflate(inline)
            else:
                raise ValueError
        if tags == b"{}":
            parsed: Any = {}
        else:
            parsed = json.loads(tags)
            if parsed.__class__ is not dict:
                raise ValueError
            for v in parsed.values():
                if v.__class__ is not str:
                    raise ValueError
        if seq.isdigit() and value is not None:
            if name.__class__ is not str:
                name = name.decode("ascii")  # type: ignore[union-attr]
            return Record(name, value, parsed, etag.decode(), digest.decode("ascii"), int(seq))
    except (ValueError, TypeError, AttributeError, RecursionError, zlib.error):  # UnicodeDecodeError, JSONDecodeError
        pass
    raise CorruptItemError(_label(name), _damage(meta, value, stored))


def _label(name: str | bytes) -> str:
    return name if isinstance(name, str) else name.decode("ascii", "backslashreplace")


def _damage(meta: Any, value: Any, stored: bool = True) -> str:
    """What is wrong with a record stored as ``meta`` and ``value`` (that :func:`_record` refused)."""
    if not isinstance(meta, bytes):
        return f"its metadata is a {type(meta).__name__}, not bytes"
    fields = meta.split(b"\n", 4)
    if len(fields) < 5:
        return f"its metadata has {len(fields)} of its 5 newline-separated fields (seq, etag, digest, tag pairs, tags)"
    seq, etag, digest, _pairs, tags = fields
    tags, flag, last = tags.partition(b"\n")
    if flag and last != b"z" and last[:1] not in (b"=", b"~"):
        return f"its metadata's last line {last[:20]!r} is not z, =<value> or ~<value>"
    squeezed = last == b"z"
    if last[:1] in (b"=", b"~"):
        value = last[1:]
        squeezed = last[:1] == b"~"
    if not seq.isdigit():
        return f"its seq {seq[:40]!r} is not an integer"
    for what, raw, codec in (("etag", etag, "utf-8"), ("digest", digest, "ascii")):
        try:
            raw.decode(codec)
        except UnicodeDecodeError:
            return f"its {what} {raw[:40]!r} is not {codec.upper()}"
    try:
        parsed = json.loads(tags)
    except (ValueError, RecursionError) as exc:
        return f"its tags {tags[:60]!r} are not JSON ({type(exc).__name__}: {exc})"
    if not isinstance(parsed, dict):
        return f"its tags are a JSON {type(parsed).__name__}, not an object"
    for k, v in parsed.items():
        if not isinstance(v, str):
            return f"its tag {k!r} has a {type(v).__name__} value, not a string"
    if value is None:
        return "its value is missing (the metadata is there)"
    if not isinstance(value, bytes):
        return f"its value is a {type(value).__name__}, not bytes"
    if squeezed and stored:
        try:
            _inflate(value)
        except zlib.error as exc:
            return f"its value does not decompress (its metadata says zlib: {exc})"
    return "its name is not ASCII"


def _script_damage(reply: Sequence[Any]) -> CorruptItemError:
    """The error a script's damage reply ``[code, name, reason, meta]`` stands for (see ``guarded``).

    With the record's metadata, the client's own parse says what is wrong
    when it finds something too.
    """
    name, reason, meta = _label(reply[1]), reply[2], reply[3]
    if meta is not None:
        try:
            _record(name, meta, b"", stored=False)
        except CorruptItemError as exc:
            return exc
    return CorruptItemError(name, reason.decode("utf-8", "replace") if isinstance(reason, bytes) else str(reason))


def _wrong_type(command: Any, exc: BaseException) -> CorruptItemError:
    """A command's WRONGTYPE reply (a key of ours holding another type) as the damage it is.

    Names the first record the command reads (an ``HMGET``/``HGET`` of
    ``m:``/``v:`` fields), else the key.
    """
    if isinstance(command, Eval):
        return CorruptItemError(str(command.keys[0]), f"a key of this partition has the wrong type ({exc})")
    key = command[1] if len(command) > 1 else "?"
    key = key.decode("utf-8", "replace") if isinstance(key, bytes) else str(key)
    if command[0] in ("HMGET", "HGET") and len(command) > 2 and str(command[2])[:2] in ("m:", "v:"):
        return CorruptItemError(str(command[2])[2:], f"the Redis key {key!r} holding it is not a hash ({exc})")
    return CorruptItemError(key, f"the Redis key has the wrong type for {command[0]} ({exc})")


def _written(put: Put, meta: bytes) -> Record:
    """The record a successful batch returns for ``put`` (``meta`` as the script returned it).

    A record carrying the put's etag holds exactly the put's fields (etags are
    unique per write), so only its seq is parsed; an append that found the
    same digest stored keeps what was there, parsed in full.
    """
    seq, etag, _ = meta.split(b"\n", 2)
    if etag == put.etag.encode():
        return Record(put.name, put.value, dict(put.tags), put.etag, put.digest, int(seq))
    return _record(put.name, meta, put.value, stored=False)


_MODES = {Mode.UPSERT: "u", Mode.CREATE: "c", Mode.APPEND: "a", Mode.IF_MATCH: "i"}
_PREFIX_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-.:")
_OUR_URL_OPTIONS = ("prefix", "ttl", "refresh_on_read", "cluster", "transport")
_OWN_OPTIONS = frozenset(
    {
        "prefix", "ttl", "refresh_on_read", "clock", "cluster", "retry_attempts", "retry_backoff",
        "retry_backoff_max", "transport",
    }
)  # fmt: skip


def _sent_ahead(put: Put) -> bool:
    """Whether ``put``'s value goes ahead of the script, set-if-absent (staged appends)."""
    return put.staged and put.mode is Mode.APPEND


def _is_guard(put: Put) -> bool:
    """Whether ``put`` only says "the record is still this one" (a lease guard): an
    ``IF_MATCH`` put whose etag is its ``if_match`` (etags are unique per write)."""
    return put.mode is Mode.IF_MATCH and put.etag == put.if_match and not put.staged


def _guards(puts: Sequence[Put]) -> int:
    """How many leading puts of ``puts`` go to the write script as guards (two arguments
    each, not nine): those before every other put, and never all of them."""
    count = 0
    while count < len(puts) - 1 and _is_guard(puts[count]):
        count += 1
    return count


def _write_args(
    ttl_ms: int, puts: Sequence[Put], deletes: Sequence[Delete], ahead: bool, guards: int = 0
) -> list[Any]:
    """The write script's arguments; ``ahead``: staged values are sent ahead (mode ``s``);
    the first ``guards`` puts go as guards, after the deletes (see ``lua/write.lua``)."""
    args: list[Any] = [ttl_ms, len(puts) - guards, len(deletes)]
    for put in puts[guards:]:
        _check_lines(put)
        staged = ahead and _sent_ahead(put)
        value, tags = _squeezed(put)
        args += [
            put.name,
            "s" if staged else _MODES[put.mode],
            put.if_match if put.if_match is not None else "",
            put.etag,
            put.digest,
            " ".join(_tag_pairs(put.tags)) if put.tags else "",
            tags,
            " ".join(_ancestors(put.name)),
            b"" if staged else value,
        ]
    for d in deletes:
        args += [d.name, "0" if d.if_match is None else "1", d.if_match or "", " ".join(_ancestors(d.name))]
    for put in puts[:guards]:
        _check_lines(put)  # the guard's string is split at newlines too
        pairs = " ".join(_tag_pairs(put.tags)) if put.tags else ""
        args += [put.name, f"\n{put.etag}\n{put.digest}\n{pairs}\n"]
    return args


def _check_lines(put: Put) -> None:
    """Refuse an etag or digest the script's newline-separated metadata could not hold."""
    if "\n" in put.etag or "\n" in put.digest:
        raise ValueError(f"put {put.name!r}: etag and digest must not contain a newline")


def _in_batch_order(index: int, guards: int, puts: int, deletes: int) -> int:
    """The batch index (puts, then deletes) of the write script's record ``index`` (the
    puts it got as puts, the deletes, then the guards: the batch's first puts)."""
    sent = puts - guards + deletes
    return index - sent if index >= sent else index + guards


def _squeezed(put: Put) -> tuple[bytes, str | bytes]:
    """The value to store for ``put`` and the metadata's tags line (which says how it is stored).

    A large value is compressed when that pays (:data:`_SQUEEZE_MIN`); a
    value stored in at most :data:`_INLINE_MAX` bytes goes inline (the script
    appends it to the metadata). A staged blob is neither: its field may be
    shared with writers that send it ahead, raw.
    """
    tags = tags_json(put.tags)
    if put.staged:
        return put.value, tags
    if len(put.value) >= _SQUEEZE_MIN:
        packed = zlib.compress(put.value, 1)
        if len(packed) <= len(put.value) - (len(put.value) >> 3) and len(packed) * _SQUEEZE_RATIO >= len(put.value):
            return packed, tags.encode() + (_INLINE_SQUEEZED if len(packed) <= _INLINE_MAX else _SQUEEZED)
    if len(put.value) <= _INLINE_MAX:
        return put.value, tags.encode() + _INLINE
    return put.value, tags


def _list_args(query: ListQuery) -> list[Any] | None:
    """Script arguments for ``query``, or ``None`` when it selects nothing."""
    if query.order not in ("name", "seq"):
        raise ValueError(f"ListQuery.order must be 'name' or 'seq', got {query.order!r}")
    if query.limit is not None and query.limit <= 0:
        return None
    prefix = query.prefix.encode()
    name_lo, name_hi = prefix, (prefix + _TOP if prefix else None)
    seq_lo = seq_hi = ""
    if query.order == "name":
        if query.start is not None:
            name_lo = max(name_lo, _as_bytes(query.start))
        if query.stop is not None:
            name_stop = _as_bytes(query.stop)
            name_hi = name_stop if name_hi is None else min(name_hi, name_stop)
        if name_hi is not None and name_hi <= name_lo:
            return None
    else:
        start, stop = _as_int(query.start), _as_int(query.stop)
        if start is not None and start > 0:
            if start >= 10**_SEQ_DIGITS:
                return None
            seq_lo = _pad(start)
        if stop is not None:
            if stop <= max(start or 0, 0):
                return None
            if stop < 10**_SEQ_DIGITS:
                seq_hi = _pad(stop)
    ancestors = _ancestors(query.prefix)
    return [
        query.order,
        "1" if query.descending else "0",
        -1 if query.limit is None else query.limit,
        "1" if query.values else "0",
        prefix,
        name_lo,
        name_hi or b"",
        "0" if name_hi is None else "1",
        seq_lo,
        seq_hi,
        ancestors[-1] if ancestors else "",
        -1 if query.depth is None else query.depth,
        "1" if query.children else "0",
        *_tag_pairs(query.tags),
    ]


def _as_bytes(bound: object) -> bytes:
    if not isinstance(bound, str):
        raise ValueError(f"a name-order ListQuery bound must be a str, got {bound!r}")
    return bound.encode()


def _as_int(bound: object) -> int | None:
    if bound is not None and (not isinstance(bound, int) or isinstance(bound, bool)):
        raise ValueError(f"a seq-order ListQuery bound must be an int, got {bound!r}")
    return bound


def _applied_before(
    puts: Sequence[Put], deletes: Sequence[Delete], stored: Sequence[Record | None]
) -> bool:
    """Whether what is stored is exactly what this batch writes (so it was applied).

    Etags are unique per write, so a stored record carrying a put's own etag
    was written by this batch, and the batch is atomic.
    """
    own = False
    for put, rec in zip(puts, stored, strict=False):
        if rec is None:
            return False
        if rec.etag == put.etag:
            own = True
        elif not (put.mode is Mode.APPEND and content_digest(rec.digest) == content_digest(put.digest)):
            return False
    if any(rec is not None for rec in stored[len(puts) :]):
        return False
    return own or not puts


# --------------------------------------------------------------------------


class _OnLink(Generic[_T]):
    """An attribute of the backend kept on its :class:`~._redis_transport.Link`, read and set there."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, backend: RedisBackend | None, owner: type | None = None) -> _T:
        if backend is None:  # the class's attribute: this descriptor
            return self  # type: ignore[return-value]
        return getattr(backend._link, self.name)  # type: ignore[no-any-return]

    def __set__(self, backend: RedisBackend, value: _T) -> None:
        setattr(backend._link, self.name, value)


class RedisBackend(Backend):
    """Partitions in plain Redis / Valkey 7+ (no modules), standalone or Cluster.

    Build it with :meth:`from_url` (``redis://``, ``rediss://``, ``valkey://``,
    ``unix://``; add ``?cluster=true`` or ``cluster=True`` for a Cluster), or
    hand it your own clients: ``client`` a ``redis.Redis``/``RedisCluster``
    for the sync methods, ``aclient`` a ``redis.asyncio`` one for the async
    methods (both with ``decode_responses=False``; clients you pass are not
    closed by :meth:`close`).

    * ``prefix``: the root of every key (``[A-Za-z0-9_.:-]``, no glob
      characters), so several applications or test runs share one server.
    * ``ttl``: optional retention in seconds. All keys of a partition expire
      together ``ttl`` seconds after its last write; every write (an append
      no-op included) refreshes them; reads do not. Without ``ttl`` nothing
      expires.
    * ``retry_attempts`` / ``retry_backoff`` / ``retry_backoff_max``: transient
      errors are retried up to ``retry_attempts`` times, sleeping
      ``retry_backoff * 2**n`` seconds (at most ``retry_backoff_max``) between
      attempts, then raise :class:`BackendUnavailableError`.
    * ``transport``: ``"lean"`` (the default: packed writes on connections
      kept between calls, async replies read from hiredis; a client it cannot
      drive, e.g. without hiredis, falls back to stock when it connects) or
      ``"stock"`` (plain redis-py pipelines). A Cluster always uses stock.
      Same results and round trips either way; see ``docs/redis.md``.

    :attr:`round_trips` counts the pipelines and commands sent to the server
    (failed attempts included) and :attr:`retries` the retried attempts, for
    benchmarks. See ``docs/redis.md`` for the key layout.
    """

    kind = "redis"
    #: One more condition costs nothing: checked inside the batch's one script
    #: (an unchanged ``IF_MATCH`` re-put is checked and kept, not rewritten).
    inline_conditions = True
    #: Network round trips so far (a pipeline or script counts once, failed attempts too).
    round_trips = _OnLink[int]()
    #: Attempts that failed with a transient error and were retried.
    retries = _OnLink[int]()
    retry_attempts = _OnLink[int]()
    retry_backoff = _OnLink[float]()
    retry_backoff_max = _OnLink[float]()

    def __init__(
        self,
        client: Any = None,
        *,
        aclient: Any = None,
        url: str | None = None,
        cluster: bool = False,
        client_options: dict[str, Any] | None = None,
        prefix: str = "checkpointers",
        ttl: float | None = None,
        refresh_on_read: bool = False,
        clock: Callable[[], float] | None = None,
        retry_attempts: int = 6,
        retry_backoff: float = 0.05,
        retry_backoff_max: float = 2.0,
        transport: str = "lean",
    ) -> None:
        if not prefix or len(prefix) > 100 or not set(prefix) <= _PREFIX_CHARS:
            raise ValueError(
                f"prefix {prefix!r} must be 1-100 characters from [A-Za-z0-9_.:-] "
                f"(no braces or glob characters)"
            )
        if retry_attempts < 0 or retry_backoff < 0 or retry_backoff_max < 0:
            raise ValueError("retry_attempts, retry_backoff and retry_backoff_max must be >= 0")
        if client is None and aclient is None and url is None:
            raise ValueError("pass client= and/or aclient=, or use RedisBackend.from_url(url)")
        for c in (client, aclient):
            if c is not None and c.get_encoder().decode_responses:
                raise ValueError("the Redis client must use decode_responses=False (values are bytes)")
        self.prefix = prefix
        self.cluster = cluster
        self.transport = transport
        self._set_retention(ttl, refresh_on_read, clock)
        self._url = url
        self._link = Link(
            url=url, options=dict(client_options or {}), cluster=cluster, client=client, aclient=aclient,
            transport=transport, scripts=_SCRIPTS, retry_attempts=retry_attempts,
            retry_backoff=retry_backoff, retry_backoff_max=retry_backoff_max,
        )  # fmt: skip
        #: Partition keys this backend saw holding records (see _write_op).
        self._filled: dict[str, None] = {}

    @classmethod
    def from_url(cls, url: str, **options: Any) -> RedisBackend:
        """A backend on the server ``url`` names.

        ``valkey://`` and ``valkeys://`` are read as ``redis://`` and
        ``rediss://``. The URL's query may carry ``prefix``, ``ttl``,
        ``cluster=true`` and ``transport=stock``; keyword arguments win. Other
        keyword arguments that are not constructor options go to the redis-py
        client (``socket_timeout=``, ``max_connections=``, ...).
        """
        parts = urlsplit(url)
        scheme = {"valkey": "redis", "valkeys": "rediss"}.get(parts.scheme, parts.scheme)
        if scheme not in ("redis", "rediss", "unix"):
            raise ValueError(f"not a Redis URL: {url!r} (use redis://, rediss://, valkey:// or unix://)")
        query = parse_qsl(parts.query)
        ours = {k: v for k, v in query if k in _OUR_URL_OPTIONS}
        rest = [(k, v) for k, v in query if k not in _OUR_URL_OPTIONS]
        clean = urlunsplit((scheme, parts.netloc, parts.path, urlencode(rest), parts.fragment))
        kwargs: dict[str, Any] = {}
        if "prefix" in ours:
            kwargs["prefix"] = ours["prefix"]
        kwargs.update(retention_options(ours))
        if "cluster" in ours:
            kwargs["cluster"] = url_flag("cluster", ours["cluster"])
        if "transport" in ours:
            if ours["transport"] not in TRANSPORTS:
                raise ValueError(f"URL option transport={ours['transport']!r}: expected {' or '.join(TRANSPORTS)}")
            kwargs["transport"] = ours["transport"]
        kwargs.update({k: v for k, v in options.items() if k in _OWN_OPTIONS})
        client_options = {k: v for k, v in options.items() if k not in _OWN_OPTIONS}
        return cls(url=clean, client_options=client_options, **kwargs)

    def close(self) -> None:
        """Close the clients this backend created (idempotent).

        Each async client is closed by its event loop's shutdown
        (``asyncio.run`` and test runners shut loops down), or here when its
        loop is open but idle; inside a running loop, use :meth:`aclose`.
        """
        self._link.close()

    async def aclose(self) -> None:
        """Close the clients this backend created, the current loop's async one included."""
        await self._link.aclose()

    def set_retention(
        self, ttl: object = None, refresh_on_read: bool = False, clock: Callable[[], float] | None = None
    ) -> None:
        """Retention on Redis is native: keys expire on the server's clock (``clock`` only dates :meth:`expiry`)."""
        super().set_retention(ttl, refresh_on_read, clock)
        self.ttl = self.retention.ttl
        self._ttl_ms = 0 if self.ttl is None else max(1, int(self.ttl * 1000))

    # -- keys --------------------------------------------------------------

    def _keys(self, partition: Partition) -> list[str]:
        """The partition's keys: r, n, x, t, seq (one hash slot)."""
        base = f"{self.prefix}:{{{partition.key}}}:"
        return [base + "r", base + "n", base + "x", base + "t", base + "seq"]

    def _registry(self, user_key: str) -> str:
        return f"{self.prefix}:{{{user_key}}}:parts"

    def keys_of(self, partition: Partition) -> list[str]:
        """Every key that may hold data of ``partition`` (for tests and tools)."""
        return self._keys(partition)

    def match_pattern(self, partition: Partition) -> str:
        """A ``SCAN MATCH`` pattern that matches exactly ``partition``'s keys."""
        return f"{self.prefix}:{{{partition.key}}}:*"

    # -- running operations -------------------------------------------------

    def _execute(self, trip: _RoundTrip) -> _Replies:
        """One round trip (retried as needed: see :class:`~._redis_transport.Link`)."""
        return self._replies(trip, *self._link.call(trip.commands))

    async def _aexecute(self, trip: _RoundTrip) -> _Replies:
        """Async :meth:`_execute`."""
        return self._replies(trip, *await self._link.acall(trip.commands))

    @staticmethod
    def _replies(trip: _RoundTrip, values: list[Any], retried: bool) -> _Replies:
        """The round trip's replies; a ``WRONGTYPE`` error reply (a key of ours
        holding another type: damage, not an outage) becomes a
        :class:`CorruptItemError` in place, also raised into the operation
        that sent the command (:meth:`_RoundTrip.call`, :meth:`_deliver`)."""
        corrupt = None
        for i, value in enumerate(values):
            if isinstance(value, BaseException) and kept_in_place(value):
                values[i] = _wrong_type(trip.commands[i], value)
                corrupt = corrupt or values[i]
        return _Replies(values, retried, corrupt)

    @staticmethod
    def _deliver(op: _RoundTrips, replies: _Replies) -> _RoundTrip:
        """Send ``replies`` into ``op`` (throw the damage it met) and return its next round trip."""
        if replies.corrupt is not None:
            return op.throw(replies.corrupt)
        return op.send(replies)

    def _run(self, op: _RoundTrips) -> Any:
        """Drive ``op``'s round trips to its result (tests drive operations by hand)."""
        return run(op, self)

    # -- operations, written once as generators of round trips --------------

    def _get_op(self, partition: Partition, names: Sequence[str]) -> _RoundTrips:
        if not names:
            return []
        fields = [f"{kind}:{name}" for name in names for kind in ("m", "v")]
        reply = yield _RoundTrip([("HMGET", self._keys(partition)[0], *fields)])
        values = reply.values[0]
        return [
            None if meta is None else _record(name, meta, value)
            for name, meta, value in zip(names, values[0::2], values[1::2], strict=False)
        ]

    def _write_op(self, partition: Partition, puts: Sequence[Put], deletes: Sequence[Delete]) -> _RoundTrips:
        check_batch(puts, deletes)
        registry = self._registry(partition.user_key)
        raw_name = partition.name.encode("utf-8", "surrogatepass")
        keys = self._keys(partition)
        commands: list[Command] = [("HSET", registry, partition.key, raw_name)]
        # the registry lives in the user's slot, not the partition's: its expiry rides in the same
        # pipeline (it lives ttl after the user's last write, so past every partition it names)
        commands.append(("PEXPIRE", registry, self._ttl_ms) if self._ttl_ms else ("PERSIST", registry))
        # Staged values go ahead of the script, set-if-absent (content-addressed:
        # a present field holds the same bytes), so they never pass through Lua.
        ahead: list[Command] = [("HSETNX", keys[0], f"v:{put.name}", put.value) for put in puts if _sent_ahead(put)]
        if ahead and self._ttl_ms:
            # only matters if the script never runs: a new hash must not live forever
            ahead.append(("PEXPIRE", keys[0], self._ttl_ms, "NX"))
        # A partition this backend has not seen filled may well be new: on a
        # standalone server the registration that must follow the script (see
        # the module docstring) rides in the same pipeline, after it, instead
        # of costing its own round trip when the script reports was_empty.
        first = partition.key not in self._filled
        after = first and not self.cluster
        tail = [("HSET", registry, partition.key, raw_name)] if after else []
        if first:  # the first write this backend sends there: index members of the previous layout go
            commands += _legacy_sweep(keys[2], [*(p.name for p in puts), *(d.name for d in deletes)])
        reply, out, guards = yield from self._script_op(keys, puts, deletes, commands, ahead, tail)
        if out[0] == 3:  # damaged stored data: nothing applied (see guarded())
            raise _script_damage(out)
        if out[0] == 0:
            index = _in_batch_order(int(out[1]), guards, len(puts), len(deletes))
            meta, value, now_empty = out[2], out[3], out[4]
            names = [p.name for p in puts] + [d.name for d in deletes]
            if reply.retried:
                # An earlier attempt may have applied this very batch before its
                # reply was lost: then the stored records carry our etags.
                stored = yield from self._get_op(partition, names)
                if _applied_before(puts, deletes, stored):
                    self._seen_filled(partition)
                    return WriteResult(records=[r for r in stored[: len(puts)] if r is not None])
            if now_empty:
                self._filled.pop(partition.key, None)
                yield from self._unregister_op(partition)
            existing = None if meta is None else _record(names[index], meta, value)
            return WriteResult(records=[], conflict=Conflict(index, names[index], existing))
        was_empty, now_empty, metas = out[1], out[2], out[3:]
        if guards:  # the guards' metadata follows the puts'
            metas = [*metas[len(puts) - guards :], *metas[: len(puts) - guards]]
        records = [_written(put, meta) for put, meta in zip(puts, metas, strict=False)]
        if now_empty:
            self._filled.pop(partition.key, None)
            yield from self._unregister_op(partition)
            return WriteResult(records=records)
        if was_empty and not after:
            yield _RoundTrip([("HSET", registry, partition.key, raw_name)])
        self._seen_filled(partition)
        return WriteResult(records=records)

    def _script_op(
        self,
        keys: list[str],
        puts: Sequence[Put],
        deletes: Sequence[Delete],
        commands: Sequence[Command],
        ahead: Sequence[Command],
        tail: Sequence[Command],
    ) -> _RoundTrips:
        """The write script's round trip(s): ``(reply, the script's reply, guards sent compact)``.

        First with the staged values sent ahead and the leading guards compact
        (:func:`_guards`). Re-sent at most twice, each time nothing was applied:
        with every guard as a nine-argument put when a guard's record carries
        its etag but other content (status 4: written, as it always was), and
        with the values inline when a concurrent delete removed a staged value
        between our HSETNX and the script (status 2).
        """
        guards, staged = _guards(puts), True
        while True:
            args = _write_args(self._ttl_ms, puts, deletes, ahead=staged, guards=guards)
            reply = yield _RoundTrip([*commands, *(ahead if staged else ()), Eval(WRITE_SCRIPT, keys, args), *tail])
            out = reply.values[-1 - len(tail)]
            if out[0] == 4 and guards:
                guards = 0
            elif out[0] == 2 and staged:
                staged = False
            else:
                return reply, out, guards

    def _seen_filled(self, partition: Partition) -> None:
        """Remember that ``partition`` holds records (a bounded set: a guess, never relied on)."""
        if len(self._filled) >= _FILLED_MAX:
            self._filled.clear()
        self._filled[partition.key] = None

    def _unregister_op(self, partition: Partition) -> _RoundTrips:
        """Remove ``partition`` from its user's registry, unless it refilled meanwhile."""
        registry = self._registry(partition.user_key)
        yield _RoundTrip([("HDEL", registry, partition.key)])
        reply = yield _RoundTrip([("EXISTS", self._keys(partition)[1])])
        if reply.values[0]:
            raw_name = partition.name.encode("utf-8", "surrogatepass")
            yield _RoundTrip([("HSET", registry, partition.key, raw_name)])

    def _list_op(self, partition: Partition, query: ListQuery) -> _RoundTrips:
        args = _list_args(query)
        if args is None:
            return []
        reply = yield _RoundTrip([Eval(LIST_SCRIPT, self._keys(partition)[:4], args)])
        out = reply.values[0]
        if out and out[0].__class__ is int:  # damaged stored data (see guarded())
            raise _script_damage(out)
        stored = query.values
        records = [_record(out[i], out[i + 1], out[i + 2], stored) for i in range(0, len(out), 3)]
        if query.tags:
            # the script filters on the metadata's tag pairs (and indexes): the
            # tags a record returns must say the same (children are unfiltered)
            for rec in records:
                if (not query.children or query.at_depth(rec.name)) and any(
                    rec.tags.get(k) != v for k, v in query.tags.items()
                ):
                    raise CorruptItemError(rec.name, "its tags do not match the tag index it was found by")
        return records

    def _partitions_op(self, user: str, space: str) -> _RoundTrips:
        """The registry's entries whose partition holds records.

        An entry is ``pk -> raw name``. One whose ``pk`` is not this user's
        (not even ASCII) is foreign and never trusted: skipped. One of this
        user's whose name does not decode or does not give back ``pk`` is
        damaged: :class:`CorruptItemError` if its partition holds records
        (else it names nothing and is skipped).
        """
        probe = Partition(user, space, "")
        reply = yield _RoundTrip([("HGETALL", self._registry(probe.user_key))])
        candidates: list[Partition] = []
        damaged: list[str] = []
        for pk, raw in reply.values[0].items():
            try:
                key = pk.decode("ascii")
            except UnicodeDecodeError:
                continue
            if not key.startswith(probe.user_key):
                continue  # never trust a foreign entry
            try:
                part = Partition(user, space, raw.decode("utf-8", "surrogatepass"))
            except UnicodeDecodeError:
                part = None
            if part is not None and part.key == key:
                candidates.append(part)
            else:
                damaged.append(key)
        if not candidates and not damaged:
            return []
        exists = [("EXISTS", self._keys(p)[1]) for p in candidates]
        exists += [("EXISTS", f"{self.prefix}:{{{key}}}:n") for key in damaged]
        reply = yield _RoundTrip(exists)
        live = [p for p, exists in zip(candidates, reply.values, strict=False) if exists]
        for part in candidates:
            if part not in live:  # expired (ttl) or emptied by a client that died
                yield from self._unregister_op(part)
        for key, found in zip(damaged, reply.values[len(candidates) :], strict=False):
            if found:
                raise CorruptItemError(
                    decode_component(key[len(probe.user_key) :]) or key,
                    f"the entry of partition {key!r} in the user's registry does not decode to its name",
                )
        return sorted(p.name for p in live)

    def _drop_op(self, partition: Partition) -> _RoundTrips:
        reply = yield _RoundTrip([Eval(DROP_SCRIPT, self._keys(partition), [])])
        yield from self._unregister_op(partition)
        return int(reply.values[0])

    def _parallel_op(self, ops: Sequence[_RoundTrips]) -> _RoundTrips:
        """Drive independent operations together: each round trip sends the
        next call of every one still running, in one pipeline.

        An operation that fails once the round trips started (damaged data
        it read) does not stop the others, which may be writes in the middle
        of their protocol: they run to their end, then the first failure (in
        the order of ``ops``) is raised. A failure before any I/O (invalid
        input) is raised at once, with nothing sent.
        """
        results: list[Any] = [None] * len(ops)
        failed: dict[int, Exception] = {}
        pending: dict[int, _RoundTrip] = {}
        for i, op in enumerate(ops):
            try:
                pending[i] = next(op)
            except StopIteration as done:
                results[i] = done.value
        while pending:
            reply = yield _RoundTrip([c for trip in pending.values() for c in trip.commands], raw=True)
            at, running = 0, {}
            for i, trip in pending.items():
                values = reply.values[at : at + len(trip.commands)]
                at += len(trip.commands)
                corrupt = None
                if reply.corrupt is not None:
                    corrupt = next((v for v in values if isinstance(v, CorruptItemError)), None)
                try:
                    running[i] = self._deliver(ops[i], _Replies(values, reply.retried, corrupt))
                except StopIteration as done:
                    results[i] = done.value
                except Exception as exc:  # noqa: BLE001 - raised below, once the others are done
                    failed[i] = exc
            pending = running
        if failed:
            raise failed[min(failed)]
        return results

    def _op_of(self, op: Any) -> _RoundTrips:
        """The round trips of one flow operation (see :class:`.ops.Parallel`)."""
        if isinstance(op, GetOp):
            return self._get_op(op.partition, op.names)
        if isinstance(op, ListOp):
            return self._list_op(op.partition, op.query)
        if isinstance(op, WriteOp):
            return self._write_op(op.partition, op.puts, op.deletes)
        if isinstance(op, PartitionsOp):
            return self._partitions_op(op.user, op.space)
        if isinstance(op, DropOp):
            return self._drop_op(op.partition)
        raise TypeError(f"RedisBackend.many cannot run {type(op).__name__} (nested Parallel?)")

    # -- the Backend interface ----------------------------------------------
    # (list and alist come last: below them, ``list`` in this class body names the method)

    def many(self, ops: Sequence[Any]) -> list[Any]:
        """Independent operations in one pipeline per round trip (one for reads)."""
        results: list[Any] = run(self._parallel_op([self._op_of(op) for op in ops]), self)
        for partition in read_partitions(ops) if self.retention.refresh_on_read else ():
            run(self._refresh_op(partition), self)
        return results

    async def amany(self, ops: Sequence[Any]) -> list[Any]:
        """Async :meth:`many`."""
        results: list[Any] = await arun(self._parallel_op([self._op_of(op) for op in ops]), self)
        for partition in read_partitions(ops) if self.retention.refresh_on_read else ():
            await arun(self._refresh_op(partition), self)
        return results

    def get(self, partition: Partition, names: Sequence[str]) -> list[Record | None]:
        """Records by name, one ``HMGET``."""
        return run(self._read_op(self._get_op(partition, names), partition), self)

    async def aget(self, partition: Partition, names: Sequence[str]) -> list[Record | None]:
        """Async :meth:`get`."""
        return await arun(self._read_op(self._get_op(partition, names), partition), self)

    def write(self, partition: Partition, puts: Sequence[Put], deletes: Sequence[Delete] = ()) -> WriteResult:
        """One atomic batch: one pipeline carrying one Lua script."""
        result: WriteResult = run(self._write_op(partition, puts, deletes), self)
        self._auto_sweep()
        return result

    async def awrite(self, partition: Partition, puts: Sequence[Put], deletes: Sequence[Delete] = ()) -> WriteResult:
        """Async :meth:`write`."""
        result: WriteResult = await arun(self._write_op(partition, puts, deletes), self)
        await self._aauto_sweep()
        return result

    # -- retention: native expiry; these collect the registry entries it leaves --

    def _auto_sweep(self) -> None:
        """Writes never sweep on Redis: the server deletes expired data itself, and finding the
        registry entries it leaves takes a ``SCAN`` of the whole database, too costly per write
        interval; ``partitions`` drops the entries it meets, ``gc`` (:meth:`sweep`) the rest."""

    async def _aauto_sweep(self) -> None:
        """Async :meth:`_auto_sweep` (nothing)."""

    def _read_op(self, op: _RoundTrips, partition: Partition) -> _RoundTrips:
        """``op``, then with ``refresh_on_read``: its keys' expiry pushed back when under half the ttl is left."""
        found = yield from op
        yield from self._refresh_op(partition)
        return found

    def _refresh_op(self, partition: Partition) -> _RoundTrips:
        """With ``refresh_on_read``: one ``PTTL``, and under half the ttl left the keys' ``PEXPIRE``."""
        if self.retention.refresh_on_read and self._ttl_ms:
            keys = self._keys(partition)
            reply = yield _RoundTrip([("PTTL", keys[1])])
            if 0 < reply.values[0] < self._ttl_ms / 2:
                registry = self._registry(partition.user_key)
                refresh: list[Command] = [("PEXPIRE", k, self._ttl_ms, "XX") for k in keys]
                yield _RoundTrip([*refresh, ("PEXPIRE", registry, self._ttl_ms)])

    def _registries(self) -> builtins.list[tuple[str, str]]:
        """Every user registry key with its user key (a ``SCAN``: tooling, linear in the keys of the prefix)."""
        client = self._link.sync_client()
        found = {k.decode() if isinstance(k, bytes) else str(k) for k in client.scan_iter(match=self._registry("*"))}
        return [(key, key[len(self.prefix) + 2 : -len("}:parts")]) for key in sorted(found)]

    def _entries(self, registry: str, user_key: str) -> builtins.list[tuple[str, bytes, bool]]:
        """A registry's entries of its own user (foreign ones are never trusted): (pk, raw name, alive)."""
        entries = self._link.sync_client().hgetall(registry).items()
        mine = [(pk.decode("ascii", "replace"), raw) for pk, raw in entries]
        mine = [(pk, raw) for pk, raw in mine if pk.startswith(user_key)]
        alive = self._run_trip([("EXISTS", f"{self.prefix}:{{{pk}}}:n") for pk, _ in mine])
        return [(pk, raw, bool(a)) for (pk, raw), a in zip(mine, alive, strict=False)]

    def _gone(self, limit: int) -> builtins.list[ExpiredPartition]:
        """Up to ``limit`` registry entries whose partition the server has expired."""
        out: builtins.list[ExpiredPartition] = []
        for registry, user_key in self._registries():
            for pk, raw, alive in self._entries(registry, user_key):
                if not alive and len(out) < limit:
                    out.append(ExpiredPartition(pk, user_key, raw.decode("utf-8", "surrogatepass"), None))
        return out

    def _run_trip(self, commands: builtins.list[Command]) -> builtins.list[Any]:
        return self._execute(_RoundTrip(commands)).values if commands else []

    def expired(self, limit: int = 1000) -> builtins.list[ExpiredPartition]:
        """Registry entries of partitions the server has expired (their data is gone; ``expires_at`` unknown)."""
        return self._gone(limit)

    def sweep(self, limit: int = 1000) -> int:
        """Remove up to ``limit`` registry entries of expired partitions.

        Each entry is removed with ``HDEL``, then its partition checked: one
        that a concurrent write refilled meanwhile is registered again (the
        registry protocol of ``docs/redis.md``), so no live partition is lost.
        """
        gone = self._gone(limit)
        for entry in gone:
            registry = self._registry(entry.user_key)
            self._run_trip([("HDEL", registry, entry.key)])
            if self._run_trip([("EXISTS", f"{self.prefix}:{{{entry.key}}}:n")])[0]:
                raw = entry.name.encode("utf-8", "surrogatepass")
                self._run_trip([("HSET", registry, entry.key, raw)])
        return len(gone)

    def users(self, space: str | None = None) -> builtins.list[str]:
        """Users with a live partition in their registry (a ``SCAN``: tooling)."""
        live = [uk for reg, uk in self._registries() if any(a for _, _, a in self._entries(reg, uk))]
        return users_of(live, space)

    def expiry(self, partition: Partition) -> float | None:
        """When the partition's keys expire, on this backend's clock (``None``: never, or absent)."""
        (pttl,) = self._run_trip([("PTTL", self._keys(partition)[1])])
        return None if pttl < 0 else self.retention.now() + pttl / 1000

    async def asweep(self, limit: int = 1000) -> int:
        """Async :meth:`sweep` (tooling: the sync client, on a worker thread)."""
        return await asyncio.to_thread(self.sweep, limit)

    async def aexpired(self, limit: int = 1000) -> builtins.list[ExpiredPartition]:
        return await asyncio.to_thread(self.expired, limit)

    async def ausers(self, space: str | None = None) -> builtins.list[str]:
        return await asyncio.to_thread(self.users, space)

    async def aexpiry(self, partition: Partition) -> float | None:
        return await asyncio.to_thread(self.expiry, partition)


    def partitions(self, user: str, space: str) -> list[str]:
        """Raw names of the user's non-empty partitions in ``space``, sorted."""
        return run(self._partitions_op(user, space), self)

    async def apartitions(self, user: str, space: str) -> list[str]:
        """Async :meth:`partitions`."""
        return await arun(self._partitions_op(user, space), self)

    def drop(self, partition: Partition) -> int:
        """Delete the partition's keys (no SCAN: the five keys are known)."""
        return run(self._drop_op(partition), self)  # type: ignore[no-any-return]

    async def adrop(self, partition: Partition) -> int:
        """Async :meth:`drop`."""
        return await arun(self._drop_op(partition), self)

    def list(self, partition: Partition, query: ListQuery) -> list[Record]:
        """Records selected by ``query``: one Lua script over the indexes."""
        return run(self._read_op(self._list_op(partition, query), partition), self)

    async def alist(self, partition: Partition, query: ListQuery) -> builtins.list[Record]:
        """Async :meth:`list`."""
        return await arun(self._read_op(self._list_op(partition, query), partition), self)
