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
    <root><p>/e                    the partition's lifetime (generation, expiry), only once a ttl was used

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
   S3 itself rejects a write that raced in between); UPSERT reads the
   stored record first too and PUTs ``If-Match`` its S3 ETag (or
   ``If-None-Match: *``), again when refused. A record written over another
   carries that one's batch marker (:func:`~._s3_batch.inherited`), so a
   listing that read a batch's other records in their old state settles the
   batch on meeting it and repeats, rather than return the batch's old
   state beside a write made after it (the cost: an UPSERT is a GET and a
   PUT, not one PUT). A name a batch deleted and that was then created
   alone, both during one listing, has no marker to carry (a create on an
   absent name replaces nothing): multi-record gets collect twice when they
   meet a record without a marker; a name listing compares such a record's
   S3 ETag with the one its LIST gave before the first GET, and repeats
   when it moved (written during the listing), which costs no request
   (listings mostly meet records without a marker, LangGraph's, and a
   second collect of every listing adds 38% to a LangGraph run's
   requests). Only such records that no LIST before the first GET named (a
   streaming listing's later pages) are collected twice. A tag-index
   listing finds records through index entries, which are written before
   their records: a selected record whose own entry its LIST did not name
   was written during the listing, which is repeated (a record whose tags
   changed so that the listing no longer selects it is not dated; nor a
   record whose writer does not index that tag: it repeats the listing
   until the read timeout, so keep ``indexed_tags`` the same on every writer).
3. A batch with **several** other operations, all CREATE/APPEND (the
   LangGraph saver's ``put_writes``), is **optimistic** (the protocol of
   both multi-record ways, its states and their transitions are in
   :mod:`checkpointers.backends._s3_batch`): no pre-read; a small manifest is written,
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
that changed since it was read. A redo-log batch with an etag condition
applies its **fence** first, alone, right after its manifest: its first
IF_MATCH put (else its first delete with ``if_match``). That conditional
PUT is atomic on S3, and until it lands no object carries the batch's
marker, so the batch is visible only if the fence's record was still the
version the pre-read saw when the fence landed; refused, the batch is
aborted (manifest deleted, nothing of it visible) and the conflict
returned. The batch's *other* operations are not isolated from a writer
that changes one of their records between the pre-read and the apply: that
write wins on its record, as if it came after the batch, and the batch's
operation on it is dropped. Such a race needs two writers on the same
record at the same instant (in LangGraph, two processes running the same
task of the same thread).

**Fenced writes (leases).** A write under a lease carries the lease record
re-put with ``IF_MATCH`` first, so the lease record is the fence: an acquire
that lands at any moment before the fence's PUT (before the write call, or
inside it, between the pre-read and the apply) refuses the whole batch, and
the holder gets :class:`~checkpointers.errors.LeaseLostError`; one that
lands after it is ordered after the batch (the batch is then visible
whole: readers roll it forward). Atomic with what: the lease check and the
batch's commit point are the fence's one conditional PUT; the rest is
applied after and rolled forward by any reader. Cost: one more sequential
round trip per fenced batch (the fence's PUT before the others' parallel
PUTs). **Recovery-lease assumption**: a writer must get from its
manifest to its fence within ``lease`` (default 60 s): after that a
:meth:`recover` may abort the unmarked batch while its writer still lands
the fence and the rest, which are then visible one by one. Keep ``lease``
well above the longest pause a writer can take inside one ``write`` call.

**Retention** (``ttl``, ``refresh_on_read``, ``clock``; URL ``?ttl=``; the
protocol is :mod:`checkpointers.backends._s3_retention`). A partition's
expiry is stored with it, in its **lifetime object** ``<p>/e`` (generation
and expiry, written by every write with a ttl); every record carries the
generation it was written in, and only the current generation's records are
the partition's. Costs: a read GETs the lifetime object *in parallel* with
its own requests (one more GET, no more round trips; read again only in the
rare case the generation moved since this instance last saw it); a write
GETs it first (one more sequential round trip) and, with a ttl, PUTs the new
expiry after committing (``If-Match``: one more). A store that never used a
ttl has no lifetime objects: its reads and writes pay the one GET (a 404),
which is what lets a backend opened without a ttl hide what another wrote
with one; ``lifetimes=False`` (no ttl then) skips them, for a bucket and
prefix no writer ever uses a ttl on. A write to an expired partition moves it to a new generation
before writing (so its old records read as absent at once and never come
back) and then deletes them. :meth:`S3Backend.sweep` claims each expired
partition (a new generation, ``If-Match`` the object read as expired: a
partition a concurrent write refreshed stays), deletes everything of it
older than the claim, then the lifetime object. It finds them by scanning
every partition's lifetime object (one LIST per user and space, one GET per
partition), so writes' automatic sweeps (at most one per ``min(ttl/10, 60
s)`` per instance) cost a scan of the bucket's partitions: on a large
bucket, prefer ``ttl`` with ``checkpointers gc`` from one place. The
stored name object of a long (hashed) partition name is left behind.

*No S3 lifecycle rule does the same.* Lifecycle expiration counts from each
object's own creation (``Days``, whole days) or a fixed date, and can filter
by prefix, tag or size: it would delete the old records of a partition that
is still written (a thread's first checkpoint while it is alive), and it
cannot be refreshed without rewriting every object. A tag-filtered rule
fits only a store whose partitions are written once and expire together; a
rule that does fit as a backstop: ``AbortIncompleteMultipartUpload`` (the
backend never uses multipart uploads, so it has nothing to do).

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
import builtins
import functools
import hashlib
import re
import secrets
import threading
import time
import uuid
from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, NamedTuple, TypeVar
from urllib.parse import parse_qsl, urlsplit

from .._names import Partition, decode_component, encode_component
from ..errors import BackendUnavailableError, CheckpointerError, CorruptItemError
from . import retention_options, url_flag
from ._s3_batch import Batches, ConditionsUnsupported, Deleted, Stored, inherited, visible
from ._s3_objects import SEQ_SPAN, TX_ID, Obj, as_record, decode_object, record_body, shown
from ._s3_retention import Lifetimes
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
    children_range,
    content_digest,
    users_of,
)

__all__ = ["ConditionalWritesUnsupportedError", "S3Backend", "translate_errors"]

T = TypeVar("T")

_ALPHABET = "".join(sorted("%-/0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ_abcdefghijklmnopqrstuvwxyz"))
_INVERT = str.maketrans(_ALPHABET, _ALPHABET[::-1])
_END = "~"  # greater than every character of _ALPHABET
_PRECONDITION_CODES = {"PreconditionFailed", "412", "ConditionalRequestConflict", "409"}
_MISSING_CODES = {"NoSuchKey", "404", "NotFound"}
_RKEY_TAIL = re.compile(r"[%\-/0-9A-Z_a-z]*~\Z")  # an inverted name + _END
_ENTRY_TAIL = re.compile(r"[0-9a-f]{40}/([0-9]{20})/([%\-/0-9A-Z_a-z]*)\Z")  # <h>/<inverted seq>/<name>

_Entry = tuple[str, int, str]  # a listed key, its seq (index entries; 0 for record keys), the record name
# Outside S3Backend, whose ``list`` method shadows the builtin in its annotations:
_Entries = list[_Entry]
_Names = list[str]
_Records = list[Record]
#: A listing attempt's records, every object it read (for the marker checks), and the names it GET and found absent.
_Found = tuple[list[Record], list[Obj], list[str]]


class _Listed(NamedTuple):
    """A listing attempt (see :meth:`S3Backend._list_once`): what :data:`_Found` holds, and how sure it is.

    ``moved``: a record without a marker was read with another S3 ETag than
    the LIST that named it gave, so it was written during the listing: the
    attempt is repeated. ``unsure``: a record without a marker was read
    whose key no LIST made before the first GET named: the attempt collects
    every object a second time (as for an absence).
    """

    records: list[Record]
    objs: list[Obj]
    absent: list[str]
    moved: bool = False
    unsure: bool = False


class ConditionalWritesUnsupportedError(ConditionsUnsupported, CheckpointerError, NotImplementedError):
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


def _invocation_id(context: dict[str, Any] | None = None, **_: Any) -> None:
    """Give a request its botocore invocation id (a random UUID) before botocore draws one with ``uuid.uuid4``.

    LangGraph's own tests patch ``uuid.uuid4`` with a generator of fixed ids
    (``test_root_graph``): botocore's draw, from the backend's parallel
    requests, raised "generator already executing" there, and took the
    test's ids. Batch ids are drawn without it too (``_s3_batch``).
    """
    if context is not None:
        retries = context.setdefault("retries", {})
        retries.setdefault("invocation-id", str(uuid.UUID(bytes=secrets.token_bytes(16), version=4)))


def _code(exc: Any) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _status(exc: Any) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)


def _precondition_failed(exc: Any) -> bool:
    return _code(exc) in _PRECONDITION_CODES or _status(exc) in (409, 412)


def _missing(exc: Any) -> bool:
    return _code(exc) in _MISSING_CODES or _status(exc) == 404


def _invert(name: str) -> str:
    bad = set(name) - set(_ALPHABET)
    if bad:
        raise ValueError(f"record name {name!r} has characters outside [A-Za-z0-9_%/-]: {sorted(bad)}")
    return name.translate(_INVERT)


def _inv_seq(seq: int) -> str:
    """A seq as a fixed-width string that sorts in *descending* seq order."""
    return f"{SEQ_SPAN - seq:020d}"


# -- the key layout ----------------------------------------------------------------


@dataclass(frozen=True)
class _Layout:
    """Where one partition's objects live: ``<root><p>/`` + ``r/``, ``tx/``, ``t/``, ``p``.

    The :class:`~checkpointers.backends._s3_batch.Keys` of the batch
    protocol, plus the tag index and the stored partition name.
    """

    root: str
    pkey: str
    gen: int = 0  #: the partition's generation (retention): records of another read as absent

    @property
    def partition(self) -> str:
        return f"{self.root}{self.pkey}/"

    @property
    def lifetime(self) -> str:
        """The partition's lifetime object (generation and expiry; retention)."""
        return f"{self.root}{self.pkey}/e"

    @property
    def records(self) -> str:
        return f"{self.root}{self.pkey}/r/"

    @property
    def manifests(self) -> str:
        return f"{self.root}{self.pkey}/tx/"

    @property
    def name_object(self) -> str:
        """The raw partition name, stored only for hashed (long) names."""
        return f"{self.root}{self.pkey}/p"

    def record(self, name: str) -> str:
        return self.records + _invert(name) + _END

    def manifest(self, tx: str) -> str:
        return self.manifests + tx

    def name_of(self, key: str) -> str:
        """The record name of a listed record key; :class:`CorruptItemError` for a key that is not one.

        A stray or damaged key (no ``~``, characters outside the names'
        alphabet) would otherwise map to another record's name.
        """
        tail = key[len(self.records) :]
        if not _RKEY_TAIL.match(tail):
            raise CorruptItemError(
                f"r/{tail}",
                "an S3 object among the partition's records has a key that is not a record's "
                "(an inverted name followed by '~'): a stray or damaged object",
            )
        return tail[: -len(_END)].translate(_INVERT)

    @property
    def index(self) -> str:
        return f"{self.root}{self.pkey}/t/"

    def tag(self, key: str, value: str) -> str:
        """The prefix of the index entries of tag ``key=value``."""
        h = hashlib.sha256(f"{key}\0{value}".encode("utf-8", "surrogatepass")).hexdigest()[:40]
        return f"{self.index}{h}/"

    def entry_of(self, key: str) -> tuple[int, str]:
        """(seq, record name) of an index entry key ``<p>/t/<hash>/<inverted seq>/<name>``.

        :class:`CorruptItemError` for a key of another shape (a stray or damaged object).
        """
        tail = key[len(self.index) :]
        m = _ENTRY_TAIL.match(tail)
        if m is None:
            raise CorruptItemError(
                f"t/{tail}",
                "an S3 object in the partition's tag index has a key that is not an index entry's "
                "(<hash>/<inverted seq>/<name>): a stray or damaged object",
            )
        return SEQ_SPAN - int(m[1]), m[2]


# -- the object-store port over boto3 ---------------------------------------------


class _Bucket:
    """The :class:`~checkpointers.backends._s3_batch.ObjectStore` port over a boto3 client, plus paged listing.

    With ``conditional_writes=False`` a condition is checked by a HEAD first
    (racy; documented). botocore errors pass through: :func:`translate_errors`
    maps them at the backend's edge.
    """

    def __init__(self, client: Any, bucket: str, conditional_writes: bool, where: str) -> None:
        self.client = client
        self.bucket = bucket
        self.conditional_writes = conditional_writes
        self.where = where

    def get(self, key: str) -> Stored | None:
        from botocore.exceptions import ClientError

        try:
            resp = self.client.get_object(Bucket=self.bucket, Key=key)
        except ClientError as exc:
            if _code(exc) in _MISSING_CODES:
                return None
            raise
        return Stored(resp["Body"].read(), resp["ETag"])

    def put_if(self, key: str, body: bytes, *, absent: bool = False, match: str | None = None) -> str | None:
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
                if _precondition_failed(exc):
                    return None
                if "IfMatch" in args and _missing(exc):
                    return None
            raise

    def delete_if(self, key: str, match: str | None = None) -> Deleted:
        """DELETE ``key`` (conditioned on its S3 ETag when ``match``) and say what happened.

        ``ABSENT_AFTER_RETRY``: botocore retried the request, so an earlier
        attempt may be what deleted it (S3 cannot tell).
        """
        from botocore.exceptions import ClientError

        args: dict[str, Any] = {"Bucket": self.bucket, "Key": key}
        if match is not None:
            if self.conditional_writes:
                args["IfMatch"] = match
            elif not self._holds(key, False, match):
                return Deleted.REFUSED
        try:
            self.client.delete_object(**args)
            return Deleted.DELETED
        except ClientError as exc:
            if "IfMatch" not in args:
                raise
            self._check_conditional_support(exc)
            if _missing(exc):
                retried = exc.response.get("ResponseMetadata", {}).get("RetryAttempts", 0)
                return Deleted.ABSENT_AFTER_RETRY if retried else Deleted.ABSENT
            if _precondition_failed(exc):
                return Deleted.REFUSED
            raise

    def pages(self, prefix: str, start_after: str | None = None, page_size: int = 1000) -> Iterator[list[str]]:
        """The keys under ``prefix`` (after ``start_after``), one LIST page at a time; later pages hold 1000."""
        for page in self.tagged_pages(prefix, start_after, page_size):
            yield [key for key, _ in page]

    def tagged_pages(
        self, prefix: str, start_after: str | None = None, page_size: int = 1000
    ) -> Iterator[list[tuple[str, str]]]:
        """:meth:`pages` with each key's S3 ETag as listed (without the quotes)."""
        args: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix, "MaxKeys": page_size}
        if start_after is not None and start_after > prefix:
            args["StartAfter"] = start_after
        while True:
            resp = self.client.list_objects_v2(**args)
            yield [(o["Key"], str(o.get("ETag", "")).strip('"')) for o in resp.get("Contents", [])]
            if not resp.get("IsTruncated"):
                return
            args["ContinuationToken"] = resp["NextContinuationToken"]
            args["MaxKeys"] = 1000

    def list(self, prefix: str) -> list[str]:
        return [k for page in self.pages(prefix) for k in page]

    def _holds(self, key: str, absent: bool, match: str | None) -> bool:
        """Weaker mode: check a condition with a HEAD (racy; documented)."""
        from botocore.exceptions import ClientError

        try:
            etag = self.client.head_object(Bucket=self.bucket, Key=key)["ETag"]
        except ClientError as exc:
            if _missing(exc):
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


@dataclass(frozen=True)
class _Taken:
    """Records a listing selected, every object it read (for the marker checks), expired index entries."""

    records: tuple[Record, ...] = ()
    objs: tuple[Obj, ...] = ()
    stale: tuple[str, ...] = ()
    absent: tuple[str, ...] = ()  #: names GET and found absent
    moved: bool = False  #: a record was written since the listing listed its index entries (see ``_take``)

    def __add__(self, other: _Taken) -> _Taken:
        return _Taken(
            self.records + other.records,
            self.objs + other.objs,
            self.stale + other.stale,
            self.absent + other.absent,
            self.moved or other.moved,
        )


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
        ttl: float | None = None,
        refresh_on_read: bool = False,
        clock: Callable[[], float] | None = None,
        lifetimes: bool = True,
    ) -> None:
        if not bucket:
            raise ValueError("S3Backend needs a bucket name")
        #: False: no partition lifetime objects are read or written (see the module docstring).
        self.lifetimes = lifetimes
        self._set_retention(ttl, refresh_on_read, clock)
        self.bucket = bucket
        self.root = prefix.strip("/") + "/" if prefix.strip("/") else ""
        #: Tag keys with a tag index: seq-ordered listings filtered on one of
        #: them read only the records carrying that tag value, newest first.
        self.indexed_tags = frozenset(indexed_tags)
        if client is None:
            client = _client(session, endpoint_url, region_name, max_workers, max_attempts)
        self.client = client
        self.where = f"{self.client.meta.endpoint_url} bucket {bucket!r}"
        #: S3 requests sent, per operation name (``PutObject``, ``ListObjectsV2``...).
        self.requests: Counter[str] = Counter()
        self._count_lock = threading.Lock()
        self.client.meta.events.register_first("before-send.s3", self._count)
        self.client.meta.events.register("before-call.s3", _invocation_id)
        self._pool = ThreadPoolExecutor(max_workers, thread_name_prefix="s3-call")
        self._io = ThreadPoolExecutor(max_workers, thread_name_prefix="s3-io")
        self._in_io = threading.local()
        self._seq_lock = threading.Lock()
        self._last_seq = 0
        self._bucket = _Bucket(self.client, bucket, conditional_writes, self.where)
        self._batches = Batches(
            self._bucket, where=self.where, lease=lease, read_timeout=consistent_read_timeout, parallel=self._map
        )
        self._lifetimes = Lifetimes(self._bucket, self.where, lambda: self.retention)
        self._gens: dict[str, int] = {}  # partition key -> generation last seen (reads guess it, then check)

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
        kwargs.update(retention_options(q))
        kwargs.update(options)
        return cls(parts.netloc, parts.path, **kwargs)

    # -- settings shared with the batch protocol and the port ------------------

    @property
    def lease(self) -> float:
        """Seconds a writer may take to apply a batch before a reader or :meth:`recover` aborts it."""
        return self._batches.lease

    @lease.setter
    def lease(self, seconds: float) -> None:
        self._batches.lease = seconds

    @property
    def consistent_read_timeout(self) -> float:
        """Seconds a read keeps repeating while other writers' batches land under it."""
        return self._batches.read_timeout

    @consistent_read_timeout.setter
    def consistent_read_timeout(self, seconds: float) -> None:
        self._batches.read_timeout = seconds

    @property
    def conditional_writes(self) -> bool:
        """False: conditions are checked by a HEAD before the write (the weaker mode)."""
        return self._bucket.conditional_writes

    @conditional_writes.setter
    def conditional_writes(self, on: bool) -> None:
        self._bucket.conditional_writes = on

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

    def get(self, partition: Partition, names: Sequence[str]) -> builtins.list[Record | None]:
        def read(keys: _Layout) -> builtins.list[Record | None]:
            return [o.record if o else None for o in self._batches.read(keys, list(names))]

        with translate_errors(self.where):
            return self._alive(partition, read, [None] * len(names))

    def write(
        self, partition: Partition, puts: Sequence[Put], deletes: Sequence[Delete] = ()
    ) -> WriteResult:
        check_batch(puts, deletes)
        with translate_errors(self.where):
            keys = self._layout(partition.key)
            if not self.lifetimes:
                return self._write(partition, keys, list(puts), list(deletes))
            begun = self._lifetimes.begin(keys.lifetime)
            keys = self._seen_gen(replace(keys, gen=begun.life.gen))
            result = self._write(partition, keys, list(puts), list(deletes))
            if begun.moved:
                self._purge(keys, self.retention.now())
            if result.conflict is None:
                self._lifetimes.finish(keys.lifetime, begun)
        self._auto_sweep()
        return result

    def list(self, partition: Partition, query: ListQuery) -> builtins.list[Record]:
        def read(keys: _Layout) -> builtins.list[Record]:
            attempt = functools.partial(self._listing, keys, query)
            found: _Listed = self._batches.consistent(keys, attempt, True, functools.partial(self._same, keys))
            return found.records

        with translate_errors(self.where):
            return self._alive(partition, read, [])

    def _alive(self, partition: Partition, read: Callable[[_Layout], T], empty: T) -> T:
        """``read`` run in the partition's generation, nothing if it expired (see :mod:`._s3_retention`).

        The lifetime object is read in parallel with ``read`` run in the
        generation last seen here (0 at first); read again only when the
        generation moved since. One more GET per read, no more round trips.
        """
        keys = self._layout(partition.key)
        if not self.lifetimes:
            return read(keys)
        guess = replace(keys, gen=self._gens.get(keys.pkey, 0))
        life = self._io.submit(self._lifetimes.read, keys.lifetime)
        try:
            out = read(guess)
        finally:
            found = life.result()
        if self._lifetimes.expired(found.life):
            return empty
        if found.life.gen != guess.gen:
            out = read(self._seen_gen(replace(keys, gen=found.life.gen)))
        self._lifetimes.refresh(keys.lifetime, found)
        return out

    def _seen_gen(self, keys: _Layout) -> _Layout:
        if len(self._gens) > 100_000:
            self._gens.clear()
        self._gens[keys.pkey] = keys.gen
        return keys

    def _listing(self, keys: _Layout, q: ListQuery, hidden: frozenset[str]) -> tuple[_Listed, builtins.list[Obj]]:
        found = self._list_once(keys, q, hidden)
        return found, found.objs

    def _same(self, keys: _Layout, found: _Listed) -> bool:
        """A listing that met an absence or a record it cannot date: is every object it read still as read?

        A batch's delete leaves no marker once it committed and dropped its
        tombstone, so a listing that GET a listed name and found it absent
        may hold other records of that batch in their old state (see
        :meth:`Batches.unchanged`); a record created alone on such a name
        carries no marker either. A record without a marker read as the
        LIST before the first GET gave it was there before the listing read
        anything, so no batch that committed during the listing wrote it
        (nor a write after one); read with another S3 ETag (``moved``) it
        was written during the listing: False, the listing is repeated. One
        no such LIST named (``unsure``: a later page of a streaming listing,
        children listed apart) is checked like an absence, by a second collect.
        """
        if found.moved:
            return False
        objs, absent = found.objs, found.absent
        if not absent and not found.unsure:
            return True
        names = [*(o.name for o in objs), *absent]
        return self._batches.unchanged(keys, names, [*objs, *(None for _ in absent)])

    def partitions(self, user: str, space: str) -> builtins.list[str]:
        with translate_errors(self.where):
            return self._partitions(user, space)

    def drop(self, partition: Partition) -> int:
        keys = self._layout(partition.key)
        with translate_errors(self.where):
            listed = self._bucket.list(keys.partition)
            self._delete_keys(listed)
            return sum(1 for k in listed if k.startswith(keys.records))

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
            return self._recover(self._layout(partition.key))

    async def aget(self, partition: Partition, names: Sequence[str]) -> builtins.list[Record | None]:
        return await self._off_loop(self.get, partition, names)

    async def awrite(
        self, partition: Partition, puts: Sequence[Put], deletes: Sequence[Delete] = ()
    ) -> WriteResult:
        return await self._off_loop(self.write, partition, puts, deletes)

    async def alist(self, partition: Partition, query: ListQuery) -> builtins.list[Record]:
        return await self._off_loop(self.list, partition, query)

    async def apartitions(self, user: str, space: str) -> builtins.list[str]:
        return await self._off_loop(self.partitions, user, space)

    async def adrop(self, partition: Partition) -> int:
        return await self._off_loop(self.drop, partition)

    async def arecover(self, partition: Partition) -> tuple[int, int]:
        """Async :meth:`recover`."""
        return await self._off_loop(self.recover, partition)

    def close(self) -> None:
        self.client.meta.events.unregister("before-send.s3", self._count)
        self.client.meta.events.unregister("before-call.s3", _invocation_id)
        self._pool.shutdown(wait=True)
        self._io.shutdown(wait=True)

    async def _off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(fn, *args))

    def _map(self, fn: Callable[[Any], T], items: Iterable[Any]) -> builtins.list[T]:
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

    def _layout(self, pkey: str) -> _Layout:
        return _Layout(self.root, pkey)

    def _delete_keys(self, keys: Sequence[str]) -> None:
        for i in range(0, len(keys), 1000):
            chunk = [{"Key": k} for k in keys[i : i + 1000]]
            self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": chunk, "Quiet": True})

    def _next_seq(self, floor: int = 0) -> int:
        """Microsecond timestamps, strictly increasing per instance and above ``floor``."""
        with self._seq_lock:
            self._last_seq = max(time.time_ns() // 1000, self._last_seq + 1, floor + 1)
            return self._last_seq

    # -- writes ------------------------------------------------------------------

    def _write(
        self, p: Partition, keys: _Layout, puts: builtins.list[Put], deletes: builtins.list[Delete]
    ) -> WriteResult:
        if puts and decode_component(p.key.rsplit("/", 1)[-1]) is None:
            self._bucket.put_if(keys.name_object, p.name.encode("utf-8", "surrogatepass"))
        staged = [i for i, put in enumerate(puts) if put.staged]
        rest = [i for i in range(len(puts)) if not puts[i].staged]
        # Seqs are chosen up front so that the tag-index entries of the batch
        # can be written with the staged puts, before any record they point to.
        seqs = {i: self._next_seq() for i in rest}
        index = [k for i in rest for k in self._index_keys(keys, puts[i], seqs[i])]
        jobs: builtins.list[Callable[[], Record | Conflict | None]] = [
            *(functools.partial(self._staged, keys, puts[i]) for i in staged),
            *(functools.partial(self._put_entry, k) for k in index),
        ]
        outcomes = self._map(lambda job: job(), jobs)
        records: dict[int, Record] = {}
        for i, outcome in zip(staged, outcomes, strict=False):  # the index entries' outcomes follow
            if isinstance(outcome, Conflict):
                return WriteResult([], Conflict(i, outcome.name, outcome.existing))
            assert isinstance(outcome, Record)
            records[i] = outcome
        if rest or deletes:
            outcome = self._unstaged(keys, [puts[i] for i in rest], deletes, [seqs[i] for i in rest])
            if isinstance(outcome, Conflict):
                k = outcome.index
                where = rest[k] if k < len(rest) else len(puts) + k - len(rest)
                return WriteResult([], Conflict(where, outcome.name, outcome.existing))
            records.update(zip(rest, outcome, strict=True))
        return WriteResult([records[i] for i in range(len(puts))])

    def _unstaged(
        self, keys: _Layout, puts: builtins.list[Put], deletes: builtins.list[Delete], seqs: builtins.list[int]
    ) -> builtins.list[Record] | Conflict:
        """The non-staged part of a batch: one conditional request, or the batch protocol for several."""
        if len(puts) + len(deletes) > 1:
            return self._batches.write(keys, puts, deletes, seqs, functools.partial(self._reseq, keys))
        single = self._single(keys, puts[0], seqs[0]) if puts else self._delete_one(keys, deletes[0])
        if isinstance(single, Conflict):
            return single
        return [single] if single is not None else []

    def _staged(self, keys: _Layout, put: Put) -> Record | Conflict:
        """A staged put: its index entries (if any), then the record."""
        seq = self._next_seq()
        for key in self._index_keys(keys, put, seq):
            self._put_entry(key)
        return self._append(keys, put, seq)

    def _append(self, keys: _Layout, put: Put, seq: int | None = None) -> Record | Conflict:
        """CREATE/APPEND with If-None-Match; a tombstone counts as absent."""
        key = keys.record(put.name)
        seq = self._next_seq() if seq is None else seq
        deadline = time.monotonic() + self.consistent_read_timeout
        while True:
            if self._bucket.put_if(key, record_body(put, seq, gen=keys.gen), absent=True) is not None:
                return as_record(put, seq)
            (cur,) = self._batches.read(keys, [put.name])
            if cur is None:
                continue  # deleted in between: try again
            if cur.record is None:  # a tombstone (or an uncommitted batch's record): replace it, If-Match its ETag
                body = record_body(put, seq, inherited(cur), gen=keys.gen)
                if self._bucket.put_if(key, body, match=cur.s3etag) is not None:
                    return as_record(put, seq)
                if time.monotonic() > deadline:
                    raise self._kept_changing(put.name)
                continue
            if cur.record.etag == put.etag:
                return cur.record  # our own write landed; a retry after a lost response got 412
            if put.mode is Mode.APPEND and content_digest(cur.record.digest) == content_digest(put.digest):
                return cur.record
            return Conflict(0, put.name, cur.record)

    def _single(self, keys: _Layout, put: Put, seq: int) -> Record | Conflict:
        """A batch with one non-staged put: one conditional request (plus a read when needed).

        A record written over another carries that one's batch marker
        (:func:`~checkpointers.backends._s3_batch.inherited`), so it is
        written conditioned on the S3 ETag it was read with.
        """
        if put.mode in (Mode.CREATE, Mode.APPEND):
            return self._append(keys, put, seq)
        if put.mode is Mode.UPSERT:
            return self._upsert(keys, put, seq)
        key = keys.record(put.name)
        (cur,) = self._batches.read(keys, [put.name])
        if cur is None or cur.record is None or cur.record.etag != put.if_match:
            return Conflict(0, put.name, cur.record if cur else None)
        seq = self._reseq(keys, put, seq, cur.record.seq)
        if self._bucket.put_if(key, record_body(put, seq, inherited(cur), gen=keys.gen), match=cur.s3etag) is None:
            (now,) = self._batches.read(keys, [put.name])
            if now is None or now.record is None or now.record.etag != put.etag:
                return Conflict(0, put.name, now.record if now else None)
        return as_record(put, seq)

    def _upsert(self, keys: _Layout, put: Put, seq: int) -> Record:
        """A single UPSERT: read what it replaces, then PUT conditioned on that (its S3 ETag, or absence).

        One GET more than a plain PUT: the new record carries the marker of
        the one it replaces (see :func:`~checkpointers.backends._s3_batch.inherited`)
        and its seq is above that one's. Refused (someone wrote in between),
        it reads again: a record with our etag is ours (a retried PUT whose
        first answer was lost), anything else is replaced the same way. A
        damaged record is replaced too (``If-Match`` its S3 ETag, no marker).
        """
        key = keys.record(put.name)
        deadline = time.monotonic() + self.consistent_read_timeout
        refused = False
        while True:
            try:
                (cur,) = self._batches.read(keys, [put.name])
            except CorruptItemError:  # an upsert replaces a damaged record (nothing to inherit from it)
                got = self._bucket.get(key)
                cur = None if got is None else Obj(None, None, got.etag, name=put.name)
            if refused and cur is not None and cur.record is not None and cur.record.etag == put.etag:
                return cur.record
            seq = self._reseq(keys, put, seq, cur.record.seq if cur is not None and cur.record is not None else 0)
            body = record_body(put, seq, inherited(cur), gen=keys.gen)
            if self._bucket.put_if(key, body, absent=cur is None, match=None if cur is None else cur.s3etag):
                return as_record(put, seq)
            refused = True
            if time.monotonic() > deadline:
                raise self._kept_changing(put.name)

    def _kept_changing(self, name: str) -> BackendUnavailableError:
        """The error of a single write whose record changed under each of its attempts until the read timeout."""
        return BackendUnavailableError(
            f"record {name!r} on {self.where} kept changing for {self.consistent_read_timeout} s; retry the write"
        )

    def _reseq(self, keys: _Layout, put: Put, seq: int, floor: int) -> int:
        """``seq``, or a new one above ``floor`` (a replaced record's seq, from another clock), indexed first."""
        if seq > floor:
            return seq
        seq = self._next_seq(floor)
        self._map(self._put_entry, self._index_keys(keys, put, seq))
        return seq

    def _delete_one(self, keys: _Layout, delete: Delete) -> None | Conflict:
        key = keys.record(delete.name)
        if delete.if_match is None:
            self.client.delete_object(Bucket=self.bucket, Key=key)
            return None
        (cur,) = self._batches.read(keys, [delete.name])
        if cur is None or cur.record is None or cur.record.etag != delete.if_match:
            return Conflict(0, delete.name, cur.record if cur else None)
        outcome = self._bucket.delete_if(key, cur.s3etag)
        if outcome is Deleted.DELETED:
            return None
        (now,) = self._batches.read(keys, [delete.name])
        if now is not None and now.record is not None:
            return Conflict(0, delete.name, now.record)
        if outcome is Deleted.ABSENT_AFTER_RETRY:
            return None  # an earlier attempt of ours landed and its response was lost
        return Conflict(0, delete.name, None)  # another writer deleted it first

    # -- recovery ----------------------------------------------------------------

    def _recover(self, keys: _Layout) -> tuple[int, int]:
        """See :meth:`recover`: the batches (:meth:`Batches.recover`), then the tag index.

        An index entry whose record does not decode is kept. The first damage
        found is raised as :class:`CorruptItemError`, with the count of the others.
        """
        done = self._batches.recover(keys)
        damaged = [*done.damaged, *self._sweep_index(keys)]
        if damaged:
            first = damaged[0]
            more = f"; {len(damaged) - 1} more damaged object(s) in this partition" if len(damaged) > 1 else ""
            raise CorruptItemError(
                first.key,
                f"{first.reason} (recover left it in place and recovered the rest: rolled {done.rolled} "
                f"batch(es) forward, aborted {done.aborted}{more})",
            ) from first
        return done.rolled, done.aborted

    def _sweep_index(self, keys: _Layout) -> builtins.list[CorruptItemError]:
        """Delete the index entries older than the lease whose record is gone or rewritten."""
        damaged: builtins.list[CorruptItemError] = []
        stale: builtins.list[str] = []
        for key in self._bucket.list(keys.index):
            try:
                seq, name = keys.entry_of(key)
                obj = self._batches.fetch(keys, name, False)
            except CorruptItemError as exc:
                damaged.append(exc)
                continue
            if (obj is None or obj.record is None or obj.record.seq != seq) and self._expired(seq):
                stale.append(key)
        self._delete_keys(stale)
        return damaged

    # -- tag index -------------------------------------------------------------

    def _index_keys(self, keys: _Layout, put: Put, seq: int) -> builtins.list[str]:
        """The index entries of ``put`` stored with ``seq``: one per indexed tag it carries."""
        inv = _inv_seq(seq)
        return [f"{keys.tag(k, v)}{inv}/{put.name}" for k, v in put.tags.items() if k in self.indexed_tags]

    def _put_entry(self, key: str) -> None:
        self.client.put_object(Bucket=self.bucket, Key=key, Body=b"")

    def _expired(self, seq: int) -> bool:
        """Whether a write that chose ``seq`` is older than the lease (seqs are wall-clock µs)."""
        return time.time_ns() // 1000 - seq > self.lease * 1e6

    def _list_indexed(
        self, keys: _Layout, q: ListQuery, tag: str, hidden: frozenset[str]
    ) -> _Listed:
        """A seq-ordered listing of the records tagged ``tag=q.tags[tag]``, through the tag index.

        Entries are listed newest first (their keys hold the inverted seq);
        each is checked against its record, which must exist with exactly
        that seq: entries of records since rewritten, deleted, or never
        written (a crash after the entry) are skipped, and deleted once
        older than ``lease``. Newest-N costs one LIST plus about N GETs.

        A record read through an entry of another seq that the query selects
        and whose own entry (written before it) was not listed where the
        listing covered it was written during the listing: ``moved``, the
        listing is repeated (see :meth:`_same`).
        """
        streaming = q.descending and q.limit is not None
        taken = _Taken()
        entries: builtins.list[_Entry] = []
        for batch in self._entry_pages(keys, q, tag, streaming):
            entries.extend(batch)
            if streaming:
                listed = {(e[2], e[1]) for e in entries}
                taken += self._take(
                    keys, batch, q, hidden, have=len(taken.records), indexed=True, ordered=True, listed=listed
                )
                if q.limit is not None and len(taken.records) >= q.limit:
                    break
        if not streaming:
            if not q.descending:
                entries.reverse()
            listed = {(e[2], e[1]) for e in entries}
            taken = self._take(keys, entries, q, hidden, indexed=True, ordered=True, listed=listed, every=True)
        if taken.stale:
            self._delete_keys(list(taken.stale))
        out = list(taken.records[: q.limit] if q.limit is not None else taken.records)
        records, kids, gone = self._with_children(keys, q, out, hidden, None)
        return _Listed(records, [*taken.objs, *kids], [*taken.absent, *gone], taken.moved)

    def _entry_pages(self, keys: _Layout, q: ListQuery, tag: str, streaming: bool) -> Iterator[builtins.list[_Entry]]:
        """The index entries of ``tag`` under the query's prefix, depth and seq range, one LIST page at a time."""
        base = keys.tag(tag, q.tags[tag])
        start_after = base + _inv_seq(q.stop) + "/~" if isinstance(q.stop, int) else None
        lowest = q.start if isinstance(q.start, int) else None
        page_size = min(1000, 2 * q.limit + 2) if streaming and q.limit else 1000
        for page in self._bucket.pages(base, start_after, page_size):
            batch: builtins.list[_Entry] = []
            below = False  # reached seqs below `start`: the rest of the listing is lower still
            for key in page:
                seq, name = keys.entry_of(key)
                if lowest is not None and seq < lowest:
                    below = True
                    break
                if name.startswith(q.prefix) and q.at_depth(name):
                    batch.append((key, seq, name))
            yield batch
            if below:
                return

    # -- listing ---------------------------------------------------------------

    def _list_once(self, keys: _Layout, q: ListQuery, hidden: frozenset[str]) -> _Listed:
        """One listing attempt: the records, and every object read (for marker checks).

        The depth filter is applied to the listed *names*, so a record at
        another depth is never fetched; with ``children`` a selected record's
        children are found among the listed names (see :meth:`_with_children`).
        The S3 ETags of the LIST pages made before the first GET are kept to
        date the records without a marker (see :meth:`_same`).
        """
        if q.limit == 0:
            return _Listed([], [], [])
        if q.order == "seq":
            tag = next((k for k in q.tags if k in self.indexed_tags), None)
            if tag is not None:
                return self._list_indexed(keys, q, tag, hidden)
        by_name = q.order == "name"
        streaming = by_name and q.descending and q.limit is not None
        taken = _Taken()
        listed: builtins.list[str] = []  # every name listed, in listing (descending name) order
        names: builtins.list[_Entry] = []  # the candidates: names at the query's depth
        before_gets: dict[str, str] = {}  # record name -> S3 ETag, as listed before the first GET
        for batch, above, etags in self._name_pages(keys, q, streaming):
            listed.extend(above)
            names.extend(batch)
            if not taken.objs and not taken.absent:
                before_gets.update(etags)
            if streaming:
                taken += self._take(keys, batch, q, hidden, have=len(taken.records), ordered=True)
                if q.limit is not None and len(taken.records) >= q.limit:
                    break
        out = list(taken.records)
        if not streaming:
            if by_name and not q.descending:
                names.reverse()
            taken = self._take(keys, names, q, hidden, ordered=by_name)
            out = list(taken.records)
            if not by_name:
                out.sort(key=q.sort_key, reverse=q.descending)
        out = out[: q.limit] if q.limit is not None else out
        records, kids, gone = self._with_children(keys, q, out, hidden, listed[::-1])
        objs = [*taken.objs, *kids]
        undated = [o for o in objs if o.tx is None]  # records without a marker (tombstones always carry one)
        moved = any(before_gets.get(o.name, o.s3etag.strip('"')) != o.s3etag.strip('"') for o in undated)
        unsure = any(o.name not in before_gets for o in undated)
        return _Listed(records, objs, [*taken.absent, *gone], moved, unsure)

    def _name_pages(
        self, keys: _Layout, q: ListQuery, streaming: bool
    ) -> Iterator[tuple[_Entries, _Names, dict[str, str]]]:
        """Per LIST page under the prefix (names descending), the names above ``start``: (those at the depth, all,
        the S3 ETag of each listed name)."""
        by_name = q.order == "name"
        start_after = keys.record(q.stop) if by_name and isinstance(q.stop, str) else None
        lowest = q.start if by_name and isinstance(q.start, str) else None
        page_size = self._streaming_page(q) if streaming else 1000
        for page in self._bucket.tagged_pages(keys.records + _invert(q.prefix), start_after, page_size):
            named = [(k, 0, keys.name_of(k)) for k, _ in page]
            above = [e for e in named if lowest is None or e[2] >= lowest]
            etags = {e[2]: etag for e, (_, etag) in zip(named, page, strict=True)}
            yield [e for e in above if q.at_depth(e[2])], [e[2] for e in above], etags
            if len(above) < len(named):
                return  # names below `start`: the rest of the listing is lower still

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
        self, keys: _Layout, q: ListQuery, selected: _Records, hidden: frozenset[str], listed: _Names | None
    ) -> _Found:
        """``selected``, each record followed by its children when ``q.children``; and the children's objects.

        The children are GET only now, after their parents were selected (a
        parent's tags are only known from its GET), all together, and pass
        through the same visibility handling as any record read (their
        objects are returned for the marker checks). ``listed`` is the
        ascending list of names the listing returned, or None when it did
        not list names (the tag index); see :meth:`_child_names`.
        """
        if not q.children or not selected:
            return selected, [], []
        kids = [self._child_names(keys, q, record.name, listed) for record in selected]
        got = iter(self._map(lambda n: self._batches.fetch(keys, n, q.values), [n for names in kids for n in names]))
        out: builtins.list[Record] = []
        objs: builtins.list[Obj] = []
        absent: builtins.list[str] = []
        for record, names in zip(selected, kids, strict=True):
            out.append(record)
            for name in names:
                obj = next(got)
                if obj is None:
                    absent.append(name)
                    continue
                objs.append(obj)
                obj = visible(obj, hidden, keys.gen)
                if obj is not None and obj.record is not None:
                    out.append(obj.record)
        return out, objs, absent

    def _child_names(self, keys: _Layout, q: ListQuery, parent: str, listed: _Names | None) -> _Names:
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
        return [keys.name_of(k) for k in reversed(self._bucket.list(keys.records + _invert(lo)))]

    def _take(
        self,
        keys: _Layout,
        entries: builtins.list[_Entry],
        q: ListQuery,
        hidden: frozenset[str],
        *,
        have: int = 0,
        indexed: bool = False,
        ordered: bool,
        listed: set[tuple[str, int]] | None = None,
        every: bool = False,
    ) -> _Taken:
        """GET the records of ``entries`` in order, in parallel chunks, until ``q.limit`` records
        passed counting the ``have`` already taken (when ``ordered``).

        With ``indexed`` (index entries), a record counts only if its seq is
        the entry's; expired entries that do not match are returned as stale.
        ``listed``: the (name, seq) of every entry listed so far, the whole
        seq range of the query with ``every``, else the seqs down to the
        entry's (newest first). A record the query selects whose own entry
        is not among them there was written after that LIST: ``moved``.
        """
        records: builtins.list[Record] = []
        objs: builtins.list[Obj] = []
        stale: builtins.list[str] = []
        absent: builtins.list[str] = []
        moved = False
        pos = 0
        while pos < len(entries) and not (ordered and q.limit is not None and have + len(records) >= q.limit):
            left = None if not ordered or q.limit is None else q.limit - have - len(records)
            size = len(entries) - pos if left is None else max(1, min(64, left))
            chunk = entries[pos : pos + size]
            pos += size
            got = self._map(lambda e: self._batches.fetch(keys, e[2], q.values), chunk)
            for (key, seq, name), obj in zip(chunk, got, strict=True):
                if obj is not None:
                    objs.append(obj)
                else:
                    absent.append(name)
                obj = visible(obj, hidden, keys.gen)
                record = obj.record if obj is not None else None
                if indexed and (record is None or record.seq != seq):
                    if self._expired(seq):
                        stale.append(key)
                    if record is not None and listed is not None and (every or record.seq > seq):
                        moved = moved or ((name, record.seq) not in listed and q.matches(record))
                    continue
                if record is not None and q.matches(record):
                    records.append(record)
        return _Taken(tuple(records), tuple(objs), tuple(stale), tuple(absent), moved)

    # -- partitions ------------------------------------------------------------

    def _partitions(self, user: str, space: str) -> builtins.list[str]:
        base = self.root + Partition(user, space, "").user_key
        named = self._map(lambda encoded: self._name_if_live(base, encoded), self._prefixes(base))
        return sorted(n for n in named if n is not None)

    def _prefixes(self, base: str) -> builtins.list[str]:
        """The names of the "folders" right under ``base`` (a LIST with ``Delimiter``), without the ``/``."""
        found: builtins.list[str] = []
        args: dict[str, Any] = {"Bucket": self.bucket, "Prefix": base, "Delimiter": "/"}
        while True:
            resp = self.client.list_objects_v2(**args)
            found += [cp["Prefix"][len(base) : -1] for cp in resp.get("CommonPrefixes", [])]
            if not resp.get("IsTruncated"):
                return found
            args["ContinuationToken"] = resp["NextContinuationToken"]

    def _live(self, keys: _Layout) -> bool:
        """Whether the partition holds a record of its generation (not only tombstones), and has not expired."""
        found = self._lifetimes.read(keys.lifetime) if self.lifetimes else None
        gen = found.life.gen if found is not None else 0
        if found is not None and self._lifetimes.expired(found.life):
            return False
        for page in self._bucket.pages(keys.records, page_size=20):
            for key in page:
                name = keys.name_of(key)
                got = self._bucket.get(key)
                obj = None if got is None else decode_object(name, got.body, got.etag, False)
                if obj is not None and obj.record is not None and obj.gen == gen:
                    return True
        return False

    def _name_if_live(self, base: str, encoded: str) -> str | None:
        """The raw name of partition ``encoded`` (under ``base``), None if it holds no record."""
        keys = self._layout(base[len(self.root) :] + encoded)
        if not self._live(keys):
            return None
        return self._raw_name(keys, encoded)

    def _raw_name(self, keys: _Layout, encoded: str) -> str | None:
        """The raw name of partition ``encoded`` (stored in ``p`` when hashed); None if that is gone."""
        raw = decode_component(encoded)
        label = encoded
        if raw is None:
            label = f"{encoded}/p"
            got = self._bucket.get(keys.name_object)
            if got is None:
                return None  # dropped meanwhile (a write stores it before any record)
            try:
                raw = got.body.decode("utf-8", "surrogatepass")
            except UnicodeDecodeError as exc:
                raise CorruptItemError(label, f"the stored partition name is not UTF-8: {exc}") from exc
        if encode_component(raw) != encoded:  # another partition's name, or a stray prefix
            reason = f"the partition name {shown(raw)} does not encode to its key {encoded!r}"
            raise CorruptItemError(label, reason + ": a copied or damaged object")
        return raw

    # -- retention ---------------------------------------------------------------

    def set_retention(
        self, ttl: object = None, refresh_on_read: bool = False, clock: Callable[[], float] | None = None
    ) -> None:
        """Set the retention; a backend made with ``lifetimes=False`` cannot take a ttl."""
        if ttl is not None and not getattr(self, "lifetimes", True):
            raise ValueError("S3Backend: lifetimes=False cannot keep a ttl; open it with lifetimes=True")
        super().set_retention(ttl, refresh_on_read, clock)

    def sweep(self, limit: int = 1000) -> int:
        """Remove up to ``limit`` expired partitions across users (see :mod:`._s3_retention`); how many.

        Each is claimed first (a new generation, ``If-Match`` the lifetime
        object read as expired, so one a write refreshed meanwhile stays),
        then everything of it older than the claim is deleted, and its
        lifetime object last (``If-Match`` the claim).
        """
        with translate_errors(self.where):
            return sum(self._sweep_one(e) for e in self._expired_partitions(limit))

    async def asweep(self, limit: int = 1000) -> int:
        return await self._off_loop(self.sweep, limit)

    def expired(self, limit: int = 1000) -> builtins.list[ExpiredPartition]:
        with translate_errors(self.where):
            return self._expired_partitions(limit)

    async def aexpired(self, limit: int = 1000) -> builtins.list[ExpiredPartition]:
        return await self._off_loop(self.expired, limit)

    def users(self, space: str | None = None) -> builtins.list[str]:
        with translate_errors(self.where):
            user_keys = [uk for uk, _ in self._user_keys(space) if any(self._map(self._live_at(uk), self._prefixes(
                self.root + uk)))]
        return users_of(user_keys, space)

    async def ausers(self, space: str | None = None) -> builtins.list[str]:
        return await self._off_loop(self.users, space)

    def expiry(self, partition: Partition) -> float | None:
        with translate_errors(self.where):
            return self._lifetimes.read(self._layout(partition.key).lifetime).life.expires_at

    async def aexpiry(self, partition: Partition) -> float | None:
        return await self._off_loop(self.expiry, partition)

    def _user_keys(self, space: str | None) -> Iterator[tuple[str, str]]:
        """Every ``user_key`` (``<user>/<space>/``) under the root, in ``space`` or any, with its space part."""
        for user in self._prefixes(self.root):
            for sp in self._prefixes(f"{self.root}{user}/"):
                if space is None or sp == encode_component(space):
                    yield f"{user}/{sp}/", sp

    def _lifetime_at(self, user_key: str, encoded: str) -> Any:
        return self._lifetimes.read(self._layout(user_key + encoded).lifetime)

    def _live_at(self, user_key: str) -> Callable[[str], bool]:
        return lambda encoded: self._live(self._layout(user_key + encoded))

    def _expired_partitions(self, limit: int) -> builtins.list[ExpiredPartition]:
        """Up to ``limit`` expired partitions, soonest expiry first (scans every partition's lifetime object)."""
        found: builtins.list[ExpiredPartition] = []
        for user_key, _ in self._user_keys(None):
            encoded = self._prefixes(self.root + user_key)
            lives = self._map(functools.partial(self._lifetime_at, user_key), encoded)
            for enc, life in zip(encoded, lives, strict=True):
                if life.etag is not None and self._lifetimes.expired(life.life):
                    name = self._raw_name(self._layout(user_key + enc), enc) or enc
                    found.append(ExpiredPartition(user_key + enc, user_key, name, life.life.expires_at))
        found.sort(key=lambda e: (e.expires_at or 0.0, e.key))
        return found[:limit]

    def _sweep_one(self, gone: ExpiredPartition) -> int:
        keys = self._layout(gone.key)
        claim = self._lifetimes.claim(keys.lifetime, self._lifetimes.read(keys.lifetime))
        if claim is None:
            return 0  # refreshed (or swept) meanwhile
        self._purge(replace(keys, gen=claim.life.gen), self.retention.now())
        assert claim.etag is not None
        self._bucket.delete_if(keys.lifetime, claim.etag)
        return 1

    def _purge(self, keys: _Layout, since: float) -> None:
        """Delete what a partition held before generation ``keys.gen`` (moved at ``since``, seconds).

        Records of older generations (their S3 ETag, ``If-Match``),
        tombstones of batches no longer listed, manifests and index entries
        made before ``since``; the current generation's objects, the
        lifetime object and the stored name stay.
        """
        listed = self._bucket.list(keys.partition)
        manifests = {k[len(keys.manifests) :] for k in listed if k.startswith(keys.manifests)}
        since_ns = int(since * 1e9)
        old = [k for k in listed if k.startswith(keys.manifests) and TX_ID.match(k[len(keys.manifests) :])
               and int(k[len(keys.manifests) :].split("-", 1)[0]) < since_ns]
        old += [k for k in listed if k.startswith(keys.index) and _ENTRY_TAIL.match(k[len(keys.index) :])
                and keys.entry_of(k)[0] < since_ns // 1000]
        self._delete_keys(old)
        records = [k for k in listed if k.startswith(keys.records)]
        objs = self._map(lambda k: self._batches.fetch(keys, keys.name_of(k), False), records)
        for key, obj in zip(records, objs, strict=True):
            if obj is None:
                continue
            stale = obj.gen < keys.gen if obj.record is not None else obj.tx not in manifests
            if stale:
                self._bucket.delete_if(key, obj.s3etag)


def _client(
    session: Any, endpoint_url: str | None, region_name: str | None, max_workers: int, max_attempts: int
) -> Any:
    """A boto3 S3 client with bounded standard retries and a pool large enough for ``max_workers``."""
    import boto3
    from botocore.config import Config

    config = Config(
        retries={"mode": "standard", "max_attempts": max_attempts},
        max_pool_connections=max(10, 2 * max_workers),
    )
    return (session or boto3.session.Session()).client(
        "s3", endpoint_url=endpoint_url, region_name=region_name, config=config
    )
