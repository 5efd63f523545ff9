"""S3 backend: one object per record, atomic batches without transactions.

Works with AWS S3 and S3-compatible stores (MinIO, Ceph, R2, moto) through
boto3. The async API runs the same sync functions on a bounded thread pool,
so the event loop never blocks on boto3.

Object layout (``<root>`` is the optional key prefix, ``<p>`` the partition's
injective :attr:`~checkpointers._names.Partition.key`, ``<u>`` its ``user_key``)::

    <root><p>/r/<inverted name>~   one record: header (etag, digest, seq, tags) + value
    <root><p>/tx/<id>              a pending multi-record batch (redo log or optimistic), short-lived
    <root><p>/t/<h>/<inv seq>/<name>  tag index entry (empty) for an indexed tag, h = sha256(key, value)
    <root><p>/p                    the raw partition name, only for hashed (long) names

Everything of a user lies under ``<root><u>``; ``user_key`` ends with ``/``,
so ``alice`` never lists ``alice2``.

**Descending name order without a reverse LIST.** S3 lists keys ascending
only, and the hot query (the LangGraph saver's latest checkpoint) is
``list(prefix=..., order="name", descending=True, limit=1)``. Record keys are
therefore stored *inverted*: every character of the name is replaced by its
mirror in the sorted name alphabet ``[%-/0-9A-Z_a-z]`` and ``~`` (greater than
every mirrored character) is appended. That map is strictly order-reversing
and keeps prefixes as prefixes, so an ascending S3 LIST of
``<p>/r/<inverted prefix>`` returns names in descending order: the latest
lookup is one LIST (``MaxKeys`` small) plus one GET, whatever the history
length. Ascending-name and seq-ordered listings read the whole prefix,
except seq-ordered listings filtered on an **indexed tag** (``indexed_tags``,
by default ``workflow``, the tag the Agent Framework storage queries).

``ListQuery.depth`` is applied to the listed names, before any GET. With
``children``, a selected record's children (``<name>/...``) sort above it,
so the inverted listing has already returned them when the record is
selected: they are GET after it, from the same LIST. "The latest
checkpoint and its writes" (``depth=0, descending=True, limit=1,
children=True``) is one LIST plus one GET per record returned.

**Tag index.** For every put carrying an indexed tag, an empty entry
``<p>/t/<h>/<inverted seq>/<name>`` is written *before* the record (with the
staged puts, so a crash leaves at most an entry without its record). A
listing lists the entries newest first and GETs their records; an entry
counts only if its record exists with exactly that seq, so entries of
records since rewritten (new seq), deleted or never written are skipped, and
removed once older than ``lease`` (by that listing or :meth:`S3Backend.recover`).
"Newest N with tag k=v" is one LIST plus about N GETs at any history length.

**Atomicity.** S3 has no multi-object transactions. A batch is applied so
that it is all-or-nothing for every reader, also under ``kill -9``:

1. *Staged puts* (content-addressed blobs, ``Put.staged``) are written first,
   in parallel, with ``If-None-Match: *``; nothing reaches them until a later
   record of the batch refers to them, so a crash leaves only unreferenced
   objects. A refused batch may also leave its new staged objects behind.
   They are removed by the layer above (the LangGraph saver's ``prune``),
   which knows what is referenced.
2. A batch with **one** other operation is **one conditional request**:
   ``If-None-Match: *`` for CREATE and APPEND (on 412 the stored record is
   read to tell a no-op from a conflict), ``If-Match: <S3 ETag>`` for
   IF_MATCH and conditional deletes (the stored record is read first, its
   etag compared, and the write is conditioned on the S3 ETag just read, so
   S3 itself rejects a write that raced in between), a plain PUT for UPSERT.
3. A batch with **several** other operations, all CREATE/APPEND (the
   LangGraph saver's ``put_writes``), is **optimistic** (see
   ``S3Backend._optimistic``): no pre-read; a small manifest is written,
   then the records with ``If-None-Match: *`` (their marker says
   "optimistic": readers treat them as absent while the manifest exists),
   then deleting the manifest commits. A name found present (412) is read:
   an append no-op is fine (same content digest: the part before a ``.``,
   see :func:`~checkpointers.backends.base.content_digest`), other content
   is a conflict, and the landed records are deleted before the manifest
   (abort). n puts cost n + 1 PUT and 1 DELETE.
4. Other batches with **several** operations use a redo log. The current
   objects are read and the conditions evaluated; then a manifest holding
   the whole batch (every new record body and the S3 ETag each operation
   expects to replace, or "absent") is written to ``<p>/tx/<id>`` with
   ``If-None-Match: *``: that PUT is the commit point. The operations are
   then applied in parallel, each conditioned on its expected ETag; deletes
   are applied as *tombstones* (records that read as absent). Every object a
   batch writes carries the batch id (a *marker*). Finally the manifest is
   deleted and the tombstones are removed with conditional deletes.

   A reader that meets a marker whose batch it has not yet seen completed
   GETs the manifest; if it still exists it **rolls the batch forward**
   (applies the remaining operations, same conditions, idempotent) and
   deletes it; then it reads again, so a multi-record read never mixes
   before- and after-states of one batch. A crash before the first
   operation lands leaves a manifest that nothing refers to; the batch is
   then not visible, and :meth:`S3Backend.recover` (the documented cleanup)
   aborts such manifests once older than ``lease`` seconds and rolls
   partially applied ones forward.

**Concurrent writers.** Every write is conditioned on S3 (ETag or absence),
so an etag-checked write, a create and an append never overwrite a record
that changed since it was read. Multi-record batches are not isolated from
a writer that changes one of their records between their pre-read and their
apply (one round trip): the racing write then wins on that record, as if it
came after the batch, and the batch's operation on it is dropped. Such a
race needs two writers on the same record at the same instant (in LangGraph,
two processes running the same task of the same thread).

**Sequence numbers** are microsecond timestamps made strictly monotonic per
backend instance (and above the seq of any record a write replaced):
strictly increasing within a process, ordered by wall clock across processes.

**Damaged objects.** Every object the backend reads (record, tombstone,
manifest, index entry key, listed key, stored partition name) is checked
before it is used: its framing, then every header field's type, with a few
cheap tests on the read path (the reason is only worked out on failure).
Anything else is :class:`~checkpointers.errors.CorruptItemError` naming the
record (a listed key that is not a record's: ``r/<key>``; a manifest:
``tx/<id>``), on every read, sync and async, never another exception and
never another record's data. A record carrying the marker of a batch whose
manifest is damaged is corrupt too: the batch can be neither rolled forward
nor aborted, so nothing is written or deleted because of it, and
:meth:`S3Backend.recover` leaves damaged objects in place, recovers the rest
and then raises.

With ``conditional_writes=False`` (for endpoints without conditional
writes) conditions are checked by a HEAD before the write: a weaker mode
where two racing writers can both win.

Throttling and 5xx errors are retried by botocore (``standard`` mode,
``max_attempts``); past that bound :class:`BackendUnavailableError` is raised
with the cause chained. Requests are counted per operation in
:attr:`S3Backend.requests` (a :class:`collections.Counter`).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import re
import threading
import time
import uuid
from bisect import bisect_left
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlsplit

from . import url_flag
from .._names import Partition, decode_component, encode_component
from ..errors import BackendUnavailableError, CheckpointerError, CorruptItemError
from .base import (
    Backend,
    Conflict,
    Delete,
    ListQuery,
    Mode,
    Put,
    Record,
    WriteResult,
    check_batch,
    children_range,
    content_digest,
    evaluate,
)

__all__ = ["ConditionalWritesUnsupportedError", "S3Backend", "translate_errors"]

T = TypeVar("T")

_ALPHABET = "".join(sorted("%-/0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ_abcdefghijklmnopqrstuvwxyz"))
_INVERT = str.maketrans(_ALPHABET, _ALPHABET[::-1])
_END = "~"  # greater than every character of _ALPHABET
_MAGIC = b"CKS3"
_TX_MAGIC = b"CKTX"
_DONE_CACHE = 100_000
_OPTIMISTIC_MODES = (Mode.APPEND, Mode.CREATE)  # UPSERTs usually replace: the classic path
_SEQ_SPAN = 10**20 - 1  # seqs are microsecond timestamps, far below this
_PRECONDITION_CODES = {"PreconditionFailed", "412", "ConditionalRequestConflict", "409"}
_MISSING_CODES = {"NoSuchKey", "404", "NotFound"}
_TX_ID = re.compile(r"[0-9]{20}-[0-9a-f]{32}\Z")  # a batch id, as a marker or a manifest's key
_NAME = re.compile(r"[%\-/0-9A-Z_a-z]*\Z")  # a record name (= its inverted form)
_RKEY_TAIL = re.compile(r"[%\-/0-9A-Z_a-z]*~\Z")  # an inverted name + _END
_ENTRY_TAIL = re.compile(r"[0-9a-f]{40}/([0-9]{20})/([%\-/0-9A-Z_a-z]*)\Z")  # <h>/<inverted seq>/<name>


class ConditionalWritesUnsupportedError(CheckpointerError, NotImplementedError):
    """The S3 endpoint refused a conditional write (``If-None-Match``/``If-Match``).

    The atomicity and append-only guarantees rely on them. Use an endpoint
    that supports conditional writes (AWS S3, recent MinIO, R2), or pass
    ``conditional_writes=False`` to accept the documented weaker mode.
    """


@contextmanager
def translate_errors(where: str) -> Iterator[None]:
    """Map every botocore/boto3 exception to :class:`BackendUnavailableError`.

    The one place driver errors cross into the library; ``where`` names the
    endpoint and bucket in the message. Errors of the library pass through.
    """
    from boto3.exceptions import Boto3Error
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        yield
    except CheckpointerError:
        raise
    except ClientError as exc:
        err = exc.response.get("Error", {})
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        code = err.get("Code", "?")
        hint = {
            "NoSuchBucket": "create the bucket first",
            "AccessDenied": "check the credentials and the bucket policy",
            "InvalidAccessKeyId": "check AWS_ACCESS_KEY_ID",
            "SignatureDoesNotMatch": "check AWS_SECRET_ACCESS_KEY",
        }.get(code, "retries exhausted or the request was refused")
        raise BackendUnavailableError(
            f"S3 request to {where} failed with {code} (HTTP {status}): {err.get('Message', '')}; {hint}"
        ) from exc
    except (BotoCoreError, Boto3Error) as exc:
        raise BackendUnavailableError(
            f"S3 endpoint {where} unavailable after retries: {type(exc).__name__}: {exc}"
        ) from exc


def _code(exc: Any) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _status(exc: Any) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)


def _invert(name: str) -> str:
    bad = set(name) - set(_ALPHABET)
    if bad:
        raise ValueError(f"record name {name!r} has characters outside [A-Za-z0-9_%/-]: {sorted(bad)}")
    return name.translate(_INVERT)


@dataclass(frozen=True)
class _Obj:
    """A record object as read: the record (None for a tombstone), marker and S3 ETag."""

    record: Record | None
    tx: str | None
    s3etag: str
    optimistic: bool = False  #: the marker is an optimistic batch's (see ``_optimistic``)
    name: str = ""  #: the record name it was read under (also for a tombstone)


def _encode(header: dict[str, Any], value: bytes) -> bytes:
    h = json.dumps(header, separators=(",", ":")).encode()
    return _MAGIC + len(h).to_bytes(4, "big") + h + value


def _decode(name: str, body: bytes, s3etag: str, values: bool = True) -> _Obj:
    """A record object's bytes as an :class:`_Obj`; :class:`CorruptItemError` naming ``name`` if damaged.

    Layout: ``CKS3``, the header's length (4 bytes, big-endian), the header
    (a JSON object), the value. A record's header is ``{"e": etag, "d":
    digest, "s": seq, "t": {tag: value}}`` plus ``"x": batch id`` (a
    marker) and ``"o": 1`` (the batch is optimistic); a tombstone's is
    ``{"z": 1, "x": batch id}``. Every field is checked for its type with a
    few cheap tests; the reason is only worked out when one fails.
    """
    n = int.from_bytes(body[4:8], "big")
    if body[:4] != _MAGIC or len(body) < 8 + n:
        raise CorruptItemError(name, _framing_problem(body, _MAGIC, "record"))
    try:
        h = json.loads(body[8 : 8 + n])
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise CorruptItemError(name, f"record header does not decode: {type(exc).__name__}: {exc}") from None
    if type(h) is dict:
        tx = h.get("x")
        if tx is not None and not (type(tx) is str and _TX_ID.match(tx)):
            pass  # a damaged marker: reported below
        elif "z" in h:
            if h["z"] == 1 and len(h) == (1 if tx is None else 2):
                return _Obj(None, tx, s3etag, False, name)
        else:
            e, d, s, t = h.get("e"), h.get("d"), h.get("s"), h.get("t")
            if (
                type(e) is str
                and type(d) is str
                and type(s) is int
                and type(t) is dict
                and 0 <= s <= _SEQ_SPAN
                and e.isascii()
                and d.isascii()
                and h.get("o", 1) == 1
                and (not t or all(type(v) is str for v in t.values()))  # JSON keys are str
            ):
                record = Record(name, body[8 + n :] if values else b"", t, e, d, s)
                return _Obj(record, tx, s3etag, "o" in h, name)
    raise CorruptItemError(name, _header_problem(h))


def _framing_problem(body: bytes, magic: bytes, what: str) -> str:
    """Why ``body`` is not framed as ``magic`` + header length + header (+ the rest)."""
    if not body:
        return f"the S3 object is empty, not a checkpointers {what}"
    if body[:4] != magic:
        return f"the S3 object is not a checkpointers {what} (starts with {body[:8]!r})"
    if len(body) < 8:
        return f"the S3 object is truncated inside the {what} header's length ({len(body)} bytes)"
    n = int.from_bytes(body[4:8], "big")
    return f"the {what} header's length ({n:,} bytes) runs past the end of the object ({len(body) - 8:,} bytes after it)"


def _header_problem(h: Any) -> str:
    """Why a decoded record header ``h`` is not one (called only when a check failed)."""
    if type(h) is not dict:
        return f"record header is a JSON {type(h).__name__}, not an object"
    tx = h.get("x")
    if tx is not None and not (type(tx) is str and _TX_ID.match(tx)):
        return f"record header's batch marker 'x' is {_shown(tx)}, not a batch id"
    if "z" in h:
        return f"tombstone header is {_shown(h)}, not {{'z': 1, 'x': batch id}}"
    for key, kind in (("e", "str"), ("d", "str"), ("s", "int"), ("t", "dict")):
        if key not in h:
            return f"record header has no {key!r} field"
        if type(h[key]).__name__ != kind:
            return f"record header's {key!r} is {_shown(h[key])}, not {'an' if kind == 'int' else 'a'} {kind}"
    if not 0 <= h["s"] <= _SEQ_SPAN:
        return f"record header's seq {h['s']!r} is out of range"
    for key in ("e", "d"):
        if not h[key].isascii():
            return f"record header's {key!r} is {_shown(h[key])}, not ASCII"
    if h.get("o", 1) != 1:
        return f"record header's optimistic flag 'o' is {_shown(h['o'])}, not 1"
    bad = next(((k, v) for k, v in h["t"].items() if type(k) is not str or type(v) is not str), None)
    if bad is not None:
        return f"record header's tags map {_shown(bad[0])} to {_shown(bad[1])}: tags are str -> str"
    return f"record header {_shown(h)} is not a record's"


def _shown(value: Any) -> str:
    """``repr(value)`` cut to 60 characters, with its type when that is not obvious."""
    shown = repr(value)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return shown if isinstance(value, (str, dict, list)) else f"{shown} ({type(value).__name__})"


def _record_body(put: Put, seq: int, tx: str | None = None, optimistic: bool = False) -> bytes:
    header: dict[str, Any] = {"e": put.etag, "d": put.digest, "s": seq, "t": dict(put.tags)}
    if tx:
        header["x"] = tx
    if optimistic:
        header["o"] = 1
    return _encode(header, put.value)


def _as_record(put: Put, seq: int) -> Record:
    return Record(put.name, put.value, dict(put.tags), put.etag, put.digest, seq)


def _inv_seq(seq: int) -> str:
    """A seq as a fixed-width string that sorts in *descending* seq order."""
    return f"{_SEQ_SPAN - seq:020d}"


def _tombstone(tx: str) -> bytes:
    return _encode({"z": 1, "x": tx}, b"")


class S3Backend(Backend):
    """The backend interface over one S3 bucket (and optional key prefix).

    >>> backend = S3Backend("my-bucket", "agents/", endpoint_url="http://127.0.0.1:9000")  # doctest: +SKIP

    ``client`` (a boto3 S3 client) or ``session`` (a boto3 session) may be
    given; otherwise one is created with ``endpoint_url`` and
    ``region_name``. Request-counting hooks are registered on the client.
    ``max_workers`` bounds both the pool that runs async calls and the pool
    that runs a batch's parallel requests. ``lease`` is how long a writer
    may take to apply a committed batch before :meth:`recover` aborts it.
    """

    kind = "s3"

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        client: Any = None,
        session: Any = None,
        endpoint_url: str | None = None,
        region_name: str | None = None,
        conditional_writes: bool = True,
        max_workers: int = 16,
        max_attempts: int = 5,
        lease: float = 60.0,
        consistent_read_timeout: float = 10.0,
        indexed_tags: Iterable[str] = ("workflow",),
    ) -> None:
        if not bucket:
            raise ValueError("S3Backend needs a bucket name")
        self.bucket = bucket
        self.root = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.conditional_writes = conditional_writes
        self.lease = lease
        self.consistent_read_timeout = consistent_read_timeout
        #: Tag keys with a tag index: seq-ordered listings filtered on one of
        #: them read only the records carrying that tag value, newest first.
        self.indexed_tags = frozenset(indexed_tags)
        if client is None:
            import boto3
            from botocore.config import Config

            config = Config(
                retries={"mode": "standard", "max_attempts": max_attempts},
                max_pool_connections=max(10, 2 * max_workers),
            )
            client = (session or boto3.session.Session()).client(
                "s3", endpoint_url=endpoint_url, region_name=region_name, config=config
            )
        self.client = client
        self.where = f"{client.meta.endpoint_url} bucket {bucket!r}"
        #: S3 requests sent, per operation name (``PutObject``, ``ListObjectsV2``...).
        self.requests: Counter[str] = Counter()
        self._count_lock = threading.Lock()
        client.meta.events.register_first("before-send.s3", self._count)
        self._pool = ThreadPoolExecutor(max_workers, thread_name_prefix="s3-call")
        self._io = ThreadPoolExecutor(max_workers, thread_name_prefix="s3-io")
        self._in_io = threading.local()
        self._seq_lock = threading.Lock()
        self._last_seq = 0
        self._done: OrderedDict[str, float] = OrderedDict()  # tx id -> when seen complete

    @classmethod
    def from_url(cls, url: str, **options: Any) -> S3Backend:
        """``s3://bucket/prefix?endpoint_url=...&region=...&conditional_writes=false``."""
        parts = urlsplit(url)
        if parts.scheme != "s3" or not parts.netloc:
            raise ValueError(f"expected s3://bucket/prefix, got {url!r}")
        q = dict(parse_qsl(parts.query))
        kwargs: dict[str, Any] = {}
        if "endpoint_url" in q:
            kwargs["endpoint_url"] = q["endpoint_url"]
        if "region" in q:
            kwargs["region_name"] = q["region"]
        if "conditional_writes" in q:
            kwargs["conditional_writes"] = url_flag("conditional_writes", q["conditional_writes"])
        kwargs.update(options)
        return cls(parts.netloc, parts.path, **kwargs)

    # -- counters ----------------------------------------------------------

    @property
    def request_count(self) -> int:
        """Total S3 requests sent (retries included)."""
        with self._count_lock:
            return sum(self.requests.values())

    def reset_counters(self) -> None:
        """Zero :attr:`requests` (for benchmarks)."""
        with self._count_lock:
            self.requests.clear()

    def _count(self, event_name: str = "", **_: Any) -> None:
        with self._count_lock:
            self.requests[event_name.rsplit(".", 1)[-1]] += 1

    # -- the five operations (sync; async runs these on the pool) -----------

    def get(self, partition: Partition, names: Sequence[str]) -> list[Record | None]:
        with translate_errors(self.where):
            return [o.record if o else None for o in self._read(partition.key, list(names))]

    def write(
        self, partition: Partition, puts: Sequence[Put], deletes: Sequence[Delete] = ()
    ) -> WriteResult:
        check_batch(puts, deletes)
        with translate_errors(self.where):
            return self._write(partition, list(puts), list(deletes))

    def list(self, partition: Partition, query: ListQuery) -> list[Record]:
        with translate_errors(self.where):
            return self._consistent(partition.key, lambda hidden: self._list_once(partition.key, query, hidden), True)

    def partitions(self, user: str, space: str) -> list[str]:
        with translate_errors(self.where):
            return self._partitions(user, space)

    def drop(self, partition: Partition) -> int:
        with translate_errors(self.where):
            keys = self._keys(self.root + partition.key + "/")
            self._delete_keys(keys)
            return sum(1 for k in keys if k.startswith(self._rprefix(partition.key)))

    def recover(self, partition: Partition) -> tuple[int, int]:
        """The documented cleanup of a partition after crashes.

        Rolls forward every pending batch that left a mark, aborts (deletes)
        unmarked manifests older than ``lease`` seconds, and removes leftover
        tombstones. Returns ``(rolled_forward, aborted)``. Unreferenced staged
        blobs are removed by the layer above (``prune``).

        Damaged objects (a manifest, record or index entry that does not
        decode) are left in place, and never the reason to apply, abort or
        delete anything; once everything else is recovered, the first one is
        raised as :class:`~checkpointers.errors.CorruptItemError`.
        """
        with translate_errors(self.where):
            return self._recover(partition.key)

    async def aget(self, partition: Partition, names: Sequence[str]) -> list[Record | None]:
        return await self._off_loop(self.get, partition, names)

    async def awrite(
        self, partition: Partition, puts: Sequence[Put], deletes: Sequence[Delete] = ()
    ) -> WriteResult:
        return await self._off_loop(self.write, partition, puts, deletes)

    async def alist(self, partition: Partition, query: ListQuery) -> list[Record]:
        return await self._off_loop(self.list, partition, query)

    async def apartitions(self, user: str, space: str) -> list[str]:
        return await self._off_loop(self.partitions, user, space)

    async def adrop(self, partition: Partition) -> int:
        return await self._off_loop(self.drop, partition)

    async def arecover(self, partition: Partition) -> tuple[int, int]:
        """Async :meth:`recover`."""
        return await self._off_loop(self.recover, partition)

    def close(self) -> None:
        self.client.meta.events.unregister("before-send.s3", self._count)
        self._pool.shutdown(wait=True)
        self._io.shutdown(wait=True)

    async def _off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(fn, *args))

    def _map(self, fn: Callable[[Any], T], items: Iterable[Any]) -> list[T]:
        """Run ``fn`` over ``items`` in parallel; sequentially inside the I/O pool (no deadlock)."""
        items = list(items)
        if len(items) <= 1 or getattr(self._in_io, "on", False):
            return [fn(i) for i in items]

        def task(item: Any) -> T:
            self._in_io.on = True
            return fn(item)

        futures = [self._io.submit(task, i) for i in items]
        wait(futures)  # no request of this call keeps running after it returns or raises
        return [f.result() for f in futures]

    # -- keys ----------------------------------------------------------------

    def _rprefix(self, pkey: str) -> str:
        return f"{self.root}{pkey}/r/"

    def _rkey(self, pkey: str, name: str) -> str:
        return self._rprefix(pkey) + _invert(name) + _END

    def _name_of(self, pkey: str, key: str) -> str:
        """The record name of a listed record key; :class:`CorruptItemError` for a key that is not one.

        A stray or damaged key (no ``~``, characters outside the names'
        alphabet) would otherwise map to another record's name.
        """
        tail = key[len(self._rprefix(pkey)) :]
        if not _RKEY_TAIL.match(tail):
            raise CorruptItemError(
                f"r/{tail}",
                "an S3 object among the partition's records has a key that is not a record's "
                "(an inverted name followed by '~'): a stray or damaged object",
            )
        return tail[: -len(_END)].translate(_INVERT)

    def _txkey(self, pkey: str, tx: str) -> str:
        return f"{self.root}{pkey}/tx/{tx}"

    # -- S3 primitives -----------------------------------------------------

    def _get_obj(self, key: str) -> tuple[bytes, str] | None:
        from botocore.exceptions import ClientError

        try:
            resp = self.client.get_object(Bucket=self.bucket, Key=key)
        except ClientError as exc:
            if _code(exc) in _MISSING_CODES:
                return None
            raise
        return resp["Body"].read(), resp["ETag"]

    def _put_obj(self, key: str, body: bytes, *, absent: bool = False, match: str | None = None) -> str | None:
        """PUT ``body``; with ``absent``/``match`` conditioned on S3. None when the condition failed."""
        from botocore.exceptions import ClientError

        args: dict[str, Any] = {"Bucket": self.bucket, "Key": key, "Body": body}
        if self.conditional_writes:
            if absent:
                args["IfNoneMatch"] = "*"
            elif match is not None:
                args["IfMatch"] = match
        elif (absent or match is not None) and not self._holds(key, absent, match):
            return None
        try:
            return str(self.client.put_object(**args)["ETag"])
        except ClientError as exc:
            if "IfNoneMatch" in args or "IfMatch" in args:
                self._check_conditional_support(exc)
                if _code(exc) in _PRECONDITION_CODES or _status(exc) in (409, 412):
                    return None
                if "IfMatch" in args and (_code(exc) in _MISSING_CODES or _status(exc) == 404):
                    return None
            raise

    def _delete_obj(self, key: str, match: str | None = None) -> bool:
        """DELETE ``key``, conditioned on its S3 ETag when ``match``; False if the condition failed."""
        return self._delete_outcome(key, match) == "deleted"

    def _delete_outcome(self, key: str, match: str | None = None) -> str:
        """DELETE ``key`` (conditioned on its S3 ETag when ``match``) and say what happened.

        ``"deleted"``; ``"refused"`` (another ETag is stored); ``"absent"``
        (nothing was there when the request arrived); ``"absent-after-retry"``
        (botocore retried the request, so an earlier attempt may be what
        deleted it: S3 cannot tell).
        """
        from botocore.exceptions import ClientError

        args: dict[str, Any] = {"Bucket": self.bucket, "Key": key}
        if match is not None:
            if self.conditional_writes:
                args["IfMatch"] = match
            elif not self._holds(key, False, match):
                return "refused"
        try:
            self.client.delete_object(**args)
            return "deleted"
        except ClientError as exc:
            if "IfMatch" not in args:
                raise
            self._check_conditional_support(exc)
            if _code(exc) in _MISSING_CODES or _status(exc) == 404:
                retried = exc.response.get("ResponseMetadata", {}).get("RetryAttempts", 0)
                return "absent-after-retry" if retried else "absent"
            if _code(exc) in _PRECONDITION_CODES or _status(exc) in (409, 412):
                return "refused"
            raise

    def _holds(self, key: str, absent: bool, match: str | None) -> bool:
        """Weaker mode: check a condition with a HEAD (racy; documented)."""
        from botocore.exceptions import ClientError

        try:
            etag = self.client.head_object(Bucket=self.bucket, Key=key)["ETag"]
        except ClientError as exc:
            if _status(exc) == 404 or _code(exc) in _MISSING_CODES:
                return absent
            raise
        return not absent and etag.strip('"') == (match or "").strip('"')

    def _check_conditional_support(self, exc: Any) -> None:
        code, status = _code(exc), _status(exc)
        message = str(exc.response.get("Error", {}).get("Message", ""))
        refused = code == "NotImplemented" or status == 501 or (
            code in ("InvalidArgument", "InvalidRequest", "NotSupported")
            and ("match" in message.lower() or "condition" in message.lower())
        )
        if refused:
            raise ConditionalWritesUnsupportedError(
                f"S3 endpoint {self.where} does not support conditional writes "
                f"(If-None-Match / If-Match on PutObject and DeleteObject): it answered "
                f"{code} (HTTP {status}). They are needed for atomic batches and append-only "
                f"keys. Use an endpoint that supports them, or pass conditional_writes=False "
                f"to accept the weaker mode where racing writers can both win."
            ) from exc

    def _keys(self, prefix: str, start_after: str | None = None) -> list[str]:
        return [k for page in self._pages(prefix, start_after) for k in page]

    def _pages(self, prefix: str, start_after: str | None = None, page_size: int = 1000) -> Iterator[list[str]]:
        args: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix, "MaxKeys": page_size}
        if start_after is not None and start_after > prefix:
            args["StartAfter"] = start_after
        while True:
            resp = self.client.list_objects_v2(**args)
            yield [o["Key"] for o in resp.get("Contents", [])]
            if not resp.get("IsTruncated"):
                return
            args["ContinuationToken"] = resp["NextContinuationToken"]
            args["MaxKeys"] = 1000

    def _delete_keys(self, keys: Sequence[str]) -> None:
        for i in range(0, len(keys), 1000):
            chunk = [{"Key": k} for k in keys[i : i + 1000]]
            self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": chunk, "Quiet": True})

    # -- sequence numbers ----------------------------------------------------

    def _next_seq(self, floor: int = 0) -> int:
        with self._seq_lock:
            self._last_seq = max(time.time_ns() // 1000, self._last_seq + 1, floor + 1)
            return self._last_seq

    # -- reads, made consistent with pending batches -------------------------

    def _fetch(self, pkey: str, name: str, values: bool = True) -> _Obj | None:
        got = self._get_obj(self._rkey(pkey, name))
        return None if got is None else _decode(name, got[0], got[1], values)

    @staticmethod
    def _visible(obj: _Obj | None, hidden: frozenset[str]) -> _Obj | None:
        """``obj`` as a reader sees it: a record of an uncommitted optimistic batch reads as absent.

        It is returned as a tombstone-like object (record ``None``) that keeps
        its S3 ETag, so a writer can still replace it conditionally.
        """
        if obj is not None and obj.tx in hidden:
            return _Obj(None, obj.tx, obj.s3etag, obj.optimistic, obj.name)
        return obj

    def _read(self, pkey: str, names: list[str]) -> list[_Obj | None]:
        def attempt(hidden: frozenset[str]) -> tuple[list[_Obj | None], list[_Obj]]:
            objs = self._map(lambda n: self._fetch(pkey, n), names)
            return [self._visible(o, hidden) for o in objs], [o for o in objs if o is not None]

        return self._consistent(pkey, attempt, len(names) > 1)

    def _consistent(
        self, pkey: str, attempt: Callable[[frozenset[str]], tuple[T, list[_Obj]]], multi: bool
    ) -> T:
        """Run a read; settle every batch marker it met that is not known complete.

        ``attempt(hidden)`` returns its result and every object it read; it
        must treat records of the batches in ``hidden`` as absent. A marker
        of a classic batch whose manifest is still there is rolled forward,
        and a read that met several objects is then repeated, so it never
        mixes the before- and after-states of one batch. A marker of an
        optimistic batch whose manifest is there means "not committed": the
        read is repeated with that batch hidden. An optimistic batch found
        committed (manifest gone) is also read again: its records were
        proven committed only if they are still there after the manifest
        was seen gone (an abort deletes the records before the manifest).
        Under a stream of batches on the same partition the repeats back off
        (up to ``consistent_read_timeout`` seconds), then raise
        :class:`BackendUnavailableError` rather than return a mixed state.
        """
        deadline = time.monotonic() + self.consistent_read_timeout
        pause = 0.001
        hidden: set[str] = set()
        while True:
            started = time.monotonic()
            result, objs = attempt(frozenset(hidden))
            pending = {
                (o.tx, o.optimistic) for o in objs if o.tx and o.tx not in hidden and not self._done_before(o.tx, started)
            }
            again = False
            rolled = False
            for tx, optimistic in pending:
                try:
                    state = self._complete(pkey, tx)
                except CorruptItemError as exc:
                    if exc.key != f"tx/{tx}":
                        raise
                    name = next(o.name for o in objs if o.tx == tx)
                    raise CorruptItemError(
                        name,
                        f"it carries the marker of batch {tx}, whose manifest is damaged ({exc.reason}): "
                        f"the batch can be neither completed nor discarded, so the record is not returned",
                    ) from exc
                if state == "open":
                    hidden.add(tx)
                    again = True
                elif state == "rolled":
                    rolled = rolled or multi
                    again = again or multi
                else:  # done: a multi read may have met it half-applied; an optimistic one is proven by a re-read
                    again = again or multi or optimistic
            if not again:
                return result
            if time.monotonic() > deadline:
                raise BackendUnavailableError(
                    f"no consistent read of partition {pkey!r} on {self.where} within "
                    f"{self.consistent_read_timeout} s: other writers' batches kept landing during the read"
                )
            if rolled:
                time.sleep(pause)
                pause = min(pause * 2, 0.05)

    def _done_before(self, tx: str, started: float) -> bool:
        with self._seq_lock:
            when = self._done.get(tx)
        return when is not None and when < started

    def _mark_done(self, tx: str) -> None:
        with self._seq_lock:
            self._done[tx] = time.monotonic()
            self._done.move_to_end(tx)
            while len(self._done) > _DONE_CACHE:
                self._done.popitem(last=False)

    # -- batches -------------------------------------------------------------

    def _write(self, p: Partition, puts: list[Put], deletes: list[Delete]) -> WriteResult:
        pkey = p.key
        if puts and decode_component(pkey.rsplit("/", 1)[-1]) is None:
            self._put_obj(f"{self.root}{pkey}/p", p.name.encode("utf-8", "surrogatepass"))
        records: dict[int, Record] = {}
        staged = [i for i, put in enumerate(puts) if put.staged]
        rest = [i for i in range(len(puts)) if not puts[i].staged]
        # Seqs are chosen up front so that the tag-index entries of the batch
        # can be written with the staged puts, before any record they point to.
        seqs = {i: self._next_seq() for i in rest}
        index = [k for i in rest for k in self._index_keys(pkey, puts[i], seqs[i])]
        jobs: list[Callable[[], Record | Conflict | None]] = [
            *(functools.partial(self._staged, pkey, puts[i]) for i in staged),
            *(functools.partial(self._put_entry, k) for k in index),
        ]
        outcomes = self._map(lambda job: job(), jobs)
        for i, outcome in zip(staged, outcomes):
            if isinstance(outcome, Conflict):
                return WriteResult([], Conflict(i, outcome.name, outcome.existing))
            assert isinstance(outcome, Record)
            records[i] = outcome
        if len(rest) + len(deletes) == 1:
            single = self._single(pkey, puts[rest[0]], seqs[rest[0]]) if rest else self._delete_one(pkey, deletes[0])
            if isinstance(single, Conflict):
                return WriteResult([], Conflict(rest[0] if rest else len(puts), single.name, single.existing))
            if rest:
                assert single is not None
                records[rest[0]] = single
        elif rest or deletes:
            mine = [puts[i] for i in rest]
            mine_seqs = [seqs[i] for i in rest]
            outcome: list[Record] | Conflict | None = None
            if not deletes and all(put.mode in _OPTIMISTIC_MODES for put in mine):
                outcome = self._optimistic(pkey, mine, mine_seqs)
            if outcome is None:
                outcome = self._batch(pkey, mine, deletes, mine_seqs)
            if isinstance(outcome, Conflict):
                index_ = rest[outcome.index] if outcome.index < len(rest) else len(puts) + outcome.index - len(rest)
                return WriteResult([], Conflict(index_, outcome.name, outcome.existing))
            records.update(zip(rest, outcome))
        return WriteResult([records[i] for i in range(len(puts))])

    def _staged(self, pkey: str, put: Put) -> Record | Conflict:
        """A staged put: its index entries (if any), then the record."""
        seq = self._next_seq()
        for key in self._index_keys(pkey, put, seq):
            self._put_entry(key)
        return self._append(pkey, put, seq)

    def _append(self, pkey: str, put: Put, seq: int | None = None) -> Record | Conflict:
        """CREATE/APPEND with If-None-Match; a tombstone counts as absent."""
        key = self._rkey(pkey, put.name)
        seq = self._next_seq() if seq is None else seq
        deadline = time.monotonic() + self.consistent_read_timeout
        while True:
            if self._put_obj(key, _record_body(put, seq), absent=True) is not None:
                return _as_record(put, seq)
            (cur,) = self._read(pkey, [put.name])
            if cur is None:
                continue  # deleted in between: try again
            if cur.record is None:  # a tombstone (or an uncommitted batch's record): replace it, conditioned on its ETag
                if self._put_obj(key, _record_body(put, seq), match=cur.s3etag) is not None:
                    return _as_record(put, seq)
                if time.monotonic() > deadline:
                    raise BackendUnavailableError(
                        f"record {put.name!r} on {self.where} kept changing for "
                        f"{self.consistent_read_timeout} s; retry the write"
                    )
                continue
            if cur.record.etag == put.etag:
                return cur.record  # our own write landed; a retry after a lost response got 412
            if put.mode is Mode.APPEND and content_digest(cur.record.digest) == content_digest(put.digest):
                return cur.record
            return Conflict(0, put.name, cur.record)

    def _single(self, pkey: str, put: Put, seq: int) -> Record | Conflict:
        """A batch with one non-staged put: one conditional request (plus a read when needed)."""
        if put.mode in (Mode.CREATE, Mode.APPEND):
            return self._append(pkey, put, seq)
        key = self._rkey(pkey, put.name)
        if put.mode is Mode.UPSERT:
            self._put_obj(key, _record_body(put, seq))
            return _as_record(put, seq)
        (cur,) = self._read(pkey, [put.name])
        if cur is None or cur.record is None or cur.record.etag != put.if_match:
            return Conflict(0, put.name, cur.record if cur else None)
        seq = self._reseq(pkey, put, seq, cur.record.seq)
        if self._put_obj(key, _record_body(put, seq), match=cur.s3etag) is None:
            (now,) = self._read(pkey, [put.name])
            if now is None or now.record is None or now.record.etag != put.etag:
                return Conflict(0, put.name, now.record if now else None)
        return _as_record(put, seq)

    def _reseq(self, pkey: str, put: Put, seq: int, floor: int) -> int:
        """``seq``, or a new one above ``floor`` (a replaced record's seq, from another clock), indexed first."""
        if seq > floor:
            return seq
        seq = self._next_seq(floor)
        self._map(self._put_entry, self._index_keys(pkey, put, seq))
        return seq

    def _delete_one(self, pkey: str, delete: Delete) -> None | Conflict:
        key = self._rkey(pkey, delete.name)
        if delete.if_match is None:
            self.client.delete_object(Bucket=self.bucket, Key=key)
            return None
        (cur,) = self._read(pkey, [delete.name])
        if cur is None or cur.record is None or cur.record.etag != delete.if_match:
            return Conflict(0, delete.name, cur.record if cur else None)
        outcome = self._delete_outcome(key, cur.s3etag)
        if outcome == "deleted":
            return None
        (now,) = self._read(pkey, [delete.name])
        if now is not None and now.record is not None:
            return Conflict(0, delete.name, now.record)
        if outcome == "absent-after-retry":
            return None  # an earlier attempt of ours landed and its response was lost
        return Conflict(0, delete.name, None)  # another writer deleted it first

    def _optimistic(self, pkey: str, puts: list[Put], seqs: list[int]) -> list[Record] | Conflict | None:
        """Several puts expected on absent names: no pre-read, the manifest's DELETE commits.

        1. A small manifest (names only) is written to ``<p>/tx/<id>`` with
           ``If-None-Match: *``; while it exists, readers treat every record
           carrying this batch's (optimistic) marker as absent.
        2. The records are written in parallel with ``If-None-Match: *``.
        3. If all landed (or are append no-ops: same content digest already stored),
           deleting the manifest (``If-Match`` its ETag) is the commit point.
           Otherwise the landed records are deleted (``If-Match`` their ETags)
           and then the manifest: a conflict is returned, or ``None`` when the
           batch must go the classic way (an UPSERT over an existing record,
           a tombstone, another batch's uncommitted record).

        A reader that met a record and then finds the manifest gone reads the
        record again: an abort deletes records before the manifest, so a
        record still there is committed. A crashed writer's manifest keeps
        its records invisible; after ``lease`` seconds a reader or
        :meth:`recover` aborts it.
        """
        tx = f"{time.time_ns():020d}-{uuid.uuid4().hex}"
        names = [put.name for put in puts]
        mkey = self._txkey(pkey, tx)
        manifest = _TX_MAGIC + json.dumps({"o": 1, "n": names}, separators=(",", ":")).encode()
        metag = self._put_obj(mkey, manifest, absent=True)
        if metag is None:
            got = self._get_obj(mkey)  # 412 on a retry: did ours land?
            if got is None or got[0] != manifest:
                raise RuntimeError(f"batch id {tx} collided")  # uuid4: does not happen
            metag = got[1]
        bodies = [_record_body(put, seq, tx, optimistic=True) for put, seq in zip(puts, seqs)]
        etags = self._map(lambda i: self._put_obj(self._rkey(pkey, names[i]), bodies[i], absent=True), range(len(puts)))
        records = [_as_record(put, seq) for put, seq in zip(puts, seqs)]
        landed = {i: etag for i, etag in enumerate(etags) if etag is not None}
        verdict: Conflict | None = None
        damaged: CorruptItemError | None = None
        classic = False
        for i in (i for i, etag in enumerate(etags) if etag is None):
            put = puts[i]
            try:
                (cur,) = self._read(pkey, [put.name])
            except CorruptItemError as exc:  # abort, then raise it
                damaged = exc
                break
            if cur is not None and cur.tx == tx:
                landed[i] = cur.s3etag  # ours: a retried request whose first response was lost
            elif cur is None or cur.record is None or put.mode is Mode.UPSERT:
                classic = True
                break
            elif cur.record.etag == put.etag or (
                put.mode is Mode.APPEND and content_digest(cur.record.digest) == content_digest(put.digest)
            ):
                records[i] = cur.record  # an append no-op
            else:
                verdict = Conflict(i, put.name, cur.record)
                break
        if verdict is None and damaged is None and not classic:
            if not self._delete_obj(mkey, metag) and landed:
                first = names[min(landed)]
                obj = self._fetch(pkey, first, False)
                if obj is None or obj.tx != tx or self._get_obj(mkey) is not None:
                    raise BackendUnavailableError(
                        f"batch {tx} on {self.where} was aborted by a recovery before it committed "
                        f"(it took longer than lease={self.lease} s); nothing of it is visible: retry it"
                    )
            self._mark_done(tx)
            return records
        self._map(lambda i: self._delete_obj(self._rkey(pkey, names[i]), landed[i]), landed)
        self._delete_obj(mkey, metag)
        if damaged is not None:
            raise damaged
        return verdict

    def _abort(self, pkey: str, tx: str, names: list[str], metag: str) -> list[CorruptItemError]:
        """Abort an optimistic batch older than the lease: mark it, delete its records, then it.

        A record that does not decode is left alone (it may be anyone's
        damaged data), and so is the manifest then, so that the batch's other
        records stay invisible; the errors are returned (``recover`` raises them).
        """
        aborted = _TX_MAGIC + json.dumps({"o": 1, "n": names, "a": 1}, separators=(",", ":")).encode()
        etag = self._put_obj(self._txkey(pkey, tx), aborted, match=metag)
        if etag is None:
            return []  # committed or aborted by someone else meanwhile
        damaged: list[CorruptItemError] = []
        for name in names:
            try:
                obj = self._fetch(pkey, name, False)
            except CorruptItemError as exc:
                damaged.append(exc)
                continue
            if obj is not None and obj.tx == tx:
                self._delete_obj(self._rkey(pkey, name), obj.s3etag)
        if not damaged:
            self._delete_obj(self._txkey(pkey, tx), etag)
        return damaged

    def _batch(self, pkey: str, puts: list[Put], deletes: list[Delete], seqs: list[int]) -> list[Record] | Conflict:
        """Several non-staged operations: pre-read, evaluate, commit a manifest, apply."""
        names = [p.name for p in puts] + [d.name for d in deletes]
        current = self._read(pkey, names)
        existing = {n: o.record for n, o in zip(names, current) if o and o.record}
        conflict, noops = evaluate(puts, deletes, existing)
        if conflict is not None:
            return conflict
        tx = f"{time.time_ns():020d}-{uuid.uuid4().hex}"
        ops: list[tuple[str, str | None, bytes, bool]] = []  # name, expected S3 ETag, body, is delete
        records: list[Record] = []
        floor = max((r.seq for r in existing.values()), default=0)
        for i, (put, cur) in enumerate(zip(puts, current)):
            if i in noops:
                records.append(existing[put.name])
                continue
            seq = self._reseq(pkey, put, seqs[i], floor)
            ops.append((put.name, cur.s3etag if cur else None, _record_body(put, seq, tx), False))
            records.append(_as_record(put, seq))
        for d, cur in zip(deletes, current[len(puts) :]):
            if cur is not None and cur.record is not None:
                ops.append((d.name, cur.s3etag, _tombstone(tx), True))
        if ops:
            manifest = self._manifest(ops)
            if self._put_obj(self._txkey(pkey, tx), manifest, absent=True) is None:
                got = self._get_obj(self._txkey(pkey, tx))  # 412 on a retry: did ours land?
                if got is None or got[0] != manifest:
                    raise RuntimeError(f"batch id {tx} collided")  # uuid4: does not happen
            self._apply(pkey, tx, ops)
        return records

    @staticmethod
    def _manifest(ops: list[tuple[str, str | None, bytes, bool]]) -> bytes:
        header = [{"n": n, "p": pre, "l": len(body), "d": dele} for n, pre, body, dele in ops]
        h = json.dumps(header, separators=(",", ":")).encode()
        return _TX_MAGIC + len(h).to_bytes(4, "big") + h + b"".join(op[2] for op in ops)

    @staticmethod
    def _ops(tx: str, data: bytes) -> list[tuple[str, str | None, bytes, bool]] | dict[str, Any]:
        """A classic manifest's operations, or an optimistic manifest's header (a dict).

        Checked in full before anything acts on it (a roll-forward writes its
        bodies, an abort deletes the records it names): a damaged manifest is
        a :class:`CorruptItemError` naming ``tx/<id>``, and nothing is
        written or deleted because of it. Each body must be a record (or, for
        a delete, a tombstone) carrying this batch's marker, and the bodies
        must fill the manifest exactly, so a damaged length can never hand
        one operation another's bytes.
        """
        label = f"tx/{tx}"
        if data[:4] == _TX_MAGIC and data[4:5] == b"{":
            try:
                h = json.loads(data[4:])
            except (ValueError, RecursionError) as exc:
                reason = f"optimistic batch manifest does not decode: {type(exc).__name__}: {exc}"
                raise CorruptItemError(label, reason) from exc
            names = h.get("n") if type(h) is dict else None
            if (
                type(names) is list
                and h.get("o") == 1
                and h.get("a", 1) == 1
                and all(type(n) is str and _NAME.match(n) for n in names)
                and len(set(names)) == len(names)
            ):
                return h
            raise CorruptItemError(
                label, f"optimistic batch manifest {_shown(h)} is not {{'o': 1, 'n': [distinct record names]}}"
            )
        n = int.from_bytes(data[4:8], "big")
        if data[:4] != _TX_MAGIC or len(data) < 8 + n:
            raise CorruptItemError(label, _framing_problem(data, _TX_MAGIC, "batch manifest"))
        try:
            header = json.loads(data[8 : 8 + n])
        except (ValueError, RecursionError) as exc:
            raise CorruptItemError(label, f"batch manifest header does not decode: {type(exc).__name__}: {exc}") from exc
        if type(header) is not list or not header:
            raise CorruptItemError(label, f"batch manifest header is {_shown(header)}, not a list of operations")
        pos, ops, seen = 8 + n, [], set()
        for i, op in enumerate(header):
            if not (
                type(op) is dict
                and type(op.get("n")) is str
                and _NAME.match(op["n"])
                and op["n"] not in seen
                and "p" in op
                and (op["p"] is None or type(op["p"]) is str)
                and type(op.get("l")) is int
                and 0 <= op["l"] <= len(data) - pos
                and type(op.get("d")) is bool
            ):
                raise CorruptItemError(
                    label,
                    f"batch manifest operation {i} is {_shown(op)}, not {{'n': a record name not named before, "
                    f"'p': S3 ETag or null, 'l': a body length within the manifest, 'd': bool}}",
                )
            name, body = op["n"], data[pos : pos + op["l"]]
            try:
                obj = _decode(name, body, "", False)
            except CorruptItemError as exc:
                reason = f"the body of operation {i} (record {name!r}) is damaged: {exc.reason}"
                raise CorruptItemError(label, reason) from exc
            if obj.tx != tx or obj.optimistic or (obj.record is None) != op["d"]:
                kind = "tombstone" if op["d"] else "record"
                raise CorruptItemError(label, f"the body of operation {i} (record {name!r}) is not this batch's {kind}")
            seen.add(name)
            ops.append((name, op["p"], body, op["d"]))
            pos += op["l"]
        if pos != len(data):
            raise CorruptItemError(label, f"{len(data) - pos:,} bytes follow the last operation's body")
        return ops

    def _apply(self, pkey: str, tx: str, ops: list[tuple[str, str | None, bytes, bool]]) -> None:
        """Apply a committed batch (idempotent), drop its manifest, then its tombstones."""

        def one(op: tuple[str, str | None, bytes, bool]) -> tuple[str, str] | None:
            name, pre, body, dele = op
            etag = self._put_obj(self._rkey(pkey, name), body, absent=pre is None, match=pre)
            # None: already applied by someone rolling forward, or superseded by a later write.
            return (name, etag) if dele and etag else None

        tombs = [t for t in self._map(one, ops) if t]
        self.client.delete_object(Bucket=self.bucket, Key=self._txkey(pkey, tx))
        self._mark_done(tx)
        self._map(lambda t: self._drop_tombstone(pkey, *t), tombs)

    def _drop_tombstone(self, pkey: str, name: str, s3etag: str) -> None:
        try:
            self._delete_obj(self._rkey(pkey, name), s3etag)
        except ConditionalWritesUnsupportedError:
            pass  # left in place: a tombstone reads as absent

    def _complete(self, pkey: str, tx: str) -> str:
        """Settle ``tx``: ``"done"`` (manifest gone), ``"rolled"`` (classic, rolled forward now)
        or ``"open"`` (optimistic, not committed: its records read as absent)."""
        got = self._get_obj(self._txkey(pkey, tx))
        if got is None:
            self._mark_done(tx)
            return "done"
        ops = self._ops(tx, got[0])
        if isinstance(ops, dict):
            if not ops.get("a") and time.time_ns() - int(tx.split("-", 1)[0]) > self.lease * 1e9:
                self._abort(pkey, tx, list(ops["n"]), got[1])  # a damaged record left: recover reports it
            return "open"
        self._apply(pkey, tx, ops)
        return "rolled"

    def _recover(self, pkey: str) -> tuple[int, int]:
        """See :meth:`recover`. Damaged objects are left in place and reported at the end.

        Everything else is still recovered. A manifest that does not decode is
        neither applied nor aborted (and the tombstones of its batch are
        kept), a batch with a record that does not decode is rolled forward
        if another of its records carries its marker (every operation is
        conditioned on the ETag it replaces, so nothing the batch did not
        mean to replace is overwritten) but never aborted, and an index entry
        whose record does not decode is kept. Then the first damage found is
        raised as :class:`CorruptItemError`, with the count of the others.
        """
        rolled = aborted = 0
        damaged: list[CorruptItemError] = []
        damaged_tx: set[str] = set()
        now_ns = time.time_ns()
        txprefix = f"{self.root}{pkey}/tx/"
        for key in self._keys(txprefix):
            tx = key[len(txprefix) :]
            if not _TX_ID.match(tx):
                reason = "an S3 object among the batch manifests has a key that is not a batch id: a stray or damaged object"
                damaged.append(CorruptItemError(f"tx/{tx}", reason))
                continue
            got = self._get_obj(key)
            if got is None:
                continue
            try:
                ops = self._ops(tx, got[0])
            except CorruptItemError as exc:
                damaged.append(exc)
                damaged_tx.add(tx)
                continue
            old = now_ns - int(tx.split("-", 1)[0]) > self.lease * 1e9
            if isinstance(ops, dict):
                if old:
                    left = self._abort(pkey, tx, list(ops["n"]), got[1])
                    damaged.extend(left)
                    aborted += not left
                continue
            marked = unknown = False
            for op in ops:
                try:
                    obj = self._fetch(pkey, op[0], False)
                except CorruptItemError as exc:
                    damaged.append(exc)
                    unknown = True
                    continue
                marked = marked or (obj is not None and obj.tx == tx)
            if marked:
                self._apply(pkey, tx, ops)
                rolled += 1
            elif old and not unknown:
                self._delete_obj(key, got[1])
                aborted += 1
        for key in self._keys(self._rprefix(pkey)):
            try:
                name = self._name_of(pkey, key)
                got = self._get_obj(key)
                obj = None if got is None else _decode(name, got[0], got[1], False)
            except CorruptItemError as exc:
                damaged.append(exc)
                continue
            if obj is not None and obj.record is None and obj.tx not in damaged_tx:
                self._drop_tombstone(pkey, name, obj.s3etag)
        stale: list[str] = []
        for key in self._keys(f"{self.root}{pkey}/t/"):
            try:
                seq, name = self._entry_of(pkey, key)
                obj = self._fetch(pkey, name, False)
            except CorruptItemError as exc:
                damaged.append(exc)
                continue
            if (obj is None or obj.record is None or obj.record.seq != seq) and self._expired(seq):
                stale.append(key)
        self._delete_keys(stale)
        if damaged:
            first = damaged[0]
            more = f"; {len(damaged) - 1} more damaged object(s) in this partition" if len(damaged) > 1 else ""
            raise CorruptItemError(
                first.key,
                f"{first.reason} (recover left it in place and recovered the rest: rolled {rolled} "
                f"batch(es) forward, aborted {aborted}{more})",
            ) from first
        return rolled, aborted

    # -- tag index -------------------------------------------------------------

    def _tprefix(self, pkey: str, key: str, value: str) -> str:
        h = hashlib.sha256(f"{key}\0{value}".encode("utf-8", "surrogatepass")).hexdigest()[:40]
        return f"{self.root}{pkey}/t/{h}/"

    def _index_keys(self, pkey: str, put: Put, seq: int) -> list[str]:
        """The index entries of ``put`` stored with ``seq``: one per indexed tag it carries."""
        inv = _inv_seq(seq)
        return [f"{self._tprefix(pkey, k, v)}{inv}/{put.name}" for k, v in put.tags.items() if k in self.indexed_tags]

    def _put_entry(self, key: str) -> None:
        self.client.put_object(Bucket=self.bucket, Key=key, Body=b"")

    def _entry_of(self, pkey: str, key: str) -> tuple[int, str]:
        """(seq, record name) of an index entry key ``<p>/t/<hash>/<inverted seq>/<name>``.

        :class:`CorruptItemError` for a key of another shape (a stray or damaged object).
        """
        tail = key[len(f"{self.root}{pkey}/t/") :]
        m = _ENTRY_TAIL.match(tail)
        if m is None:
            raise CorruptItemError(
                f"t/{tail}",
                "an S3 object in the partition's tag index has a key that is not an index entry's "
                "(<hash>/<inverted seq>/<name>): a stray or damaged object",
            )
        return _SEQ_SPAN - int(m[1]), m[2]

    def _expired(self, seq: int) -> bool:
        """Whether a write that chose ``seq`` is older than the lease (seqs are wall-clock µs)."""
        return time.time_ns() // 1000 - seq > self.lease * 1e6

    def _list_indexed(self, pkey: str, q: ListQuery, tag: str, hidden: frozenset[str]) -> tuple[list[Record], list[_Obj]]:
        """A seq-ordered listing of the records tagged ``tag=q.tags[tag]``, through the tag index.

        Entries are listed newest first (their keys hold the inverted seq);
        each is checked against its record, which must exist with exactly
        that seq: entries of records since rewritten, deleted, or never
        written (a crash after the entry) are skipped, and deleted once
        older than ``lease``. Newest-N costs one LIST plus about N GETs.
        """
        base = self._tprefix(pkey, tag, q.tags[tag])
        start_after = base + _inv_seq(q.stop) + "/~" if isinstance(q.stop, int) else None
        lowest = q.start if isinstance(q.start, int) else None
        streaming = q.descending and q.limit is not None
        page_size = min(1000, 2 * q.limit + 2) if streaming and q.limit else 1000
        objs: list[_Obj] = []
        out: list[Record] = []
        stale: list[str] = []
        entries: list[tuple[str, int, str]] = []
        for page in self._pages(base, start_after, page_size):
            batch = []
            below = False  # reached seqs below `start`: the rest of the listing is lower still
            for key in page:
                seq, name = self._entry_of(pkey, key)
                if lowest is not None and seq < lowest:
                    below = True
                    break
                if name.startswith(q.prefix) and q.at_depth(name):
                    batch.append((key, seq, name))
            entries.extend(batch)
            if streaming:
                self._take(pkey, batch, q, objs, out, hidden, stale, ordered=True)
                if q.limit is not None and len(out) >= q.limit:
                    break
            if below:
                break
        if not streaming:
            if not q.descending:
                entries.reverse()
            self._take(pkey, entries, q, objs, out, hidden, stale, ordered=True)
        if stale:
            self._delete_keys(stale)
        out = out[: q.limit] if q.limit is not None else out
        return self._with_children(pkey, q, out, objs, hidden, None), objs

    # -- listing ---------------------------------------------------------------

    def _list_once(self, pkey: str, q: ListQuery, hidden: frozenset[str]) -> tuple[list[Record], list[_Obj]]:
        """One listing attempt: the records, and every object read (for marker checks).

        The depth filter is applied to the listed *names*, so a record at
        another depth is never fetched; with ``children`` a selected record's
        children are found among the listed names (see :meth:`_with_children`).
        """
        if q.limit == 0:
            return [], []
        if q.order == "seq":
            tag = next((k for k in q.tags if k in self.indexed_tags), None)
            if tag is not None:
                return self._list_indexed(pkey, q, tag, hidden)
        prefix = self._rprefix(pkey) + _invert(q.prefix)
        by_name = q.order == "name"
        start_after = self._rkey(pkey, q.stop) if by_name and isinstance(q.stop, str) else None
        lowest = q.start if by_name and isinstance(q.start, str) else None
        streaming = by_name and q.descending and q.limit is not None
        page_size = self._streaming_page(q) if streaming else 1000
        objs: list[_Obj] = []
        out: list[Record] = []
        listed: list[str] = []  # every name listed, in listing (descending name) order
        names: list[tuple[str, int, str]] = []  # the candidates: names at the query's depth
        for page in self._pages(prefix, start_after, page_size):
            named = [(k, 0, self._name_of(pkey, k)) for k in page]
            above = [e for e in named if lowest is None or e[2] >= lowest]
            listed.extend(e[2] for e in above)
            batch = [e for e in above if q.at_depth(e[2])]
            names.extend(batch)
            if streaming:
                self._take(pkey, batch, q, objs, out, hidden, None, ordered=True)
                if q.limit is not None and len(out) >= q.limit:
                    break
            if len(above) < len(named):
                break  # names below `start`: the rest of the listing is lower still
        if not streaming:
            if by_name and not q.descending:
                names.reverse()
            self._take(pkey, names, q, objs, out, hidden, None, ordered=by_name)
            if not by_name:
                out.sort(key=q.sort_key, reverse=q.descending)
        out = out[: q.limit] if q.limit is not None else out
        return self._with_children(pkey, q, out, objs, hidden, listed[::-1]), objs

    @staticmethod
    def _streaming_page(q: ListQuery) -> int:
        """The first LIST page of a descending name listing with a limit.

        The limit-th selected record is preceded in the listing by the
        selected records above it and by names the query skips. Without
        filters that is ``limit`` keys (+2 of slack). With ``depth`` the
        skipped names are mostly the selected records' children, listed
        before their parent (a LangGraph checkpoint's writes: one record per
        ``put_writes`` call, i.e. per task, plus its special writes; none
        once a run has finished): 4 per selected record plus 4 keeps "the
        latest checkpoint and its writes" one LIST up to 7 writes records;
        more cost one more LIST, of up to 1000 keys. The page is not larger
        because a LIST's time grows with the keys it returns: moto's by
        about 1 ms per key here (latest ``get_tuple`` took 71 ms with a
        128-key page, 47 ms with 32: benchmark (c), S3 over HTTP, one run
        each), S3's with its response size. With a tag filter any number of
        records may be skipped: a full page.
        """
        assert q.limit is not None
        if q.tags:
            return 1000
        if q.depth is not None:
            return min(1000, 4 * q.limit + 4)
        return min(1000, q.limit + 2)

    def _with_children(
        self,
        pkey: str,
        q: ListQuery,
        selected: list[Record],
        objs: list[_Obj],
        hidden: frozenset[str],
        listed: list[str] | None,
    ) -> list[Record]:
        """``selected``, each record followed by its children when ``q.children``.

        The children are GET only now, after their parents were selected (a
        parent's tags are only known from its GET), all together, and pass
        through the same visibility handling as any record read (``objs``
        collects them for the marker checks). ``listed`` is the ascending list
        of names the listing returned, or None when it did not list names
        (the tag index); see :meth:`_child_names`.
        """
        if not q.children or not selected:
            return selected
        kids = [self._child_names(pkey, q, record.name, listed) for record in selected]
        got = iter(self._map(lambda n: self._fetch(pkey, n, q.values), [n for names in kids for n in names]))
        out: list[Record] = []
        for record, names in zip(selected, kids):
            out.append(record)
            for _ in names:
                obj = next(got)
                if obj is not None:
                    objs.append(obj)
                obj = self._visible(obj, hidden)
                if obj is not None and obj.record is not None:
                    out.append(obj.record)
        return out

    def _child_names(self, pkey: str, q: ListQuery, parent: str, listed: list[str] | None) -> list[str]:
        """The names starting with ``parent + "/"``, ascending.

        Taken from ``listed`` when it holds them all: a name listing has
        every name of the subtree of a record it selected, since they sort
        above the record (in the inverted listing, before it) and so above
        ``start`` too. Only a listing cut at ``stop`` (``StartAfter``) can
        miss some, when ``stop`` falls inside the subtree. Otherwise, one LIST
        of the subtree's own prefix.
        """
        lo, hi = children_range(parent)
        cut = q.order == "name" and isinstance(q.stop, str) and q.stop < hi
        if listed is not None and not cut:
            return listed[bisect_left(listed, lo) : bisect_left(listed, hi)]
        return [self._name_of(pkey, k) for k in reversed(self._keys(self._rprefix(pkey) + _invert(lo)))]

    def _take(
        self,
        pkey: str,
        entries: list[tuple[str, int, str]],
        q: ListQuery,
        objs: list[_Obj],
        out: list[Record],
        hidden: frozenset[str],
        stale: list[str] | None,
        *,
        ordered: bool,
    ) -> None:
        """GET the records of ``entries`` ``(key, seq, name)`` in order, in parallel chunks,
        until ``q.limit`` records passed (when ``ordered``).

        With ``stale`` (index entries), a record counts only if its seq is the
        entry's; expired entries that do not match are added to ``stale``.
        """
        pos = 0
        while pos < len(entries) and not (ordered and q.limit is not None and len(out) >= q.limit):
            size = len(entries) - pos if not ordered or q.limit is None else max(1, min(64, q.limit - len(out)))
            chunk = entries[pos : pos + size]
            pos += size
            got = self._map(lambda e: self._fetch(pkey, e[2], q.values), chunk)
            for (key, seq, _), obj in zip(chunk, got):
                if obj is not None:
                    objs.append(obj)
                obj = self._visible(obj, hidden)
                record = obj.record if obj is not None else None
                if stale is not None and (record is None or record.seq != seq):
                    if self._expired(seq):
                        stale.append(key)
                    continue
                if record is not None and q.matches(record):
                    out.append(record)

    # -- partitions ------------------------------------------------------------

    def _partitions(self, user: str, space: str) -> list[str]:
        base = self.root + Partition(user, space, "").user_key
        found: list[str] = []
        args: dict[str, Any] = {"Bucket": self.bucket, "Prefix": base, "Delimiter": "/"}
        while True:
            resp = self.client.list_objects_v2(**args)
            found += [cp["Prefix"][len(base) : -1] for cp in resp.get("CommonPrefixes", [])]
            if not resp.get("IsTruncated"):
                break
            args["ContinuationToken"] = resp["NextContinuationToken"]

        def live(pkey: str) -> bool:
            for page in self._pages(self._rprefix(pkey), page_size=20):
                for key in page:
                    name = self._name_of(pkey, key)
                    got = self._get_obj(key)
                    if got is not None and _decode(name, got[0], got[1], False).record is not None:
                        return True
            return False

        def name_if_live(encoded: str) -> str | None:
            pkey = base[len(self.root) :] + encoded
            if not live(pkey):
                return None
            raw = decode_component(encoded)
            label = encoded
            if raw is None:
                label = f"{encoded}/p"
                got = self._get_obj(f"{self.root}{pkey}/p")
                if got is None:
                    return None  # dropped meanwhile (a write stores it before any record)
                try:
                    raw = got[0].decode("utf-8", "surrogatepass")
                except UnicodeDecodeError as exc:
                    raise CorruptItemError(label, f"the stored partition name is not UTF-8: {exc}") from exc
            if encode_component(raw) != encoded:  # another partition's name, or a stray prefix
                reason = f"the partition name {_shown(raw)} does not encode to its key {encoded!r}"
                raise CorruptItemError(label, reason + ": a copied or damaged object")
            return raw

        return sorted(n for n in self._map(name_if_live, found) if n is not None)
