"""Agent Framework face: a ``CheckpointStorage`` over any backend, bound to one user.

:class:`IsolatedCheckpointStorage` implements the ``CheckpointStorage``
protocol of ``agent_framework`` (PyPI ``agent-framework-core``; tested with
1.23.x, pinned in the ``agent-framework`` extra) over memory, SQLite, Redis or
S3::

    from agent_framework import WorkflowBuilder
    from adapters.agent_framework import IsolatedCheckpointStorage

    storage = IsolatedCheckpointStorage.from_url(
        "sqlite:///state.db",
        user="alice",
        allowed_checkpoint_types=["my_app.models:MyState"],
    )
    workflow = WorkflowBuilder(start_executor=start, checkpoint_storage=storage).build()
    await workflow.run(first_message)
    storage.raise_if_refused()          # make refused saves fail the run (see below)

    # later, in any process, on a fresh workflow instance:
    latest = await storage.get_latest(workflow_name=workflow.name)
    await workflow.run(checkpoint_id=latest.checkpoint_id)

How checkpoints are stored
==========================

All checkpoints of one user live in one partition,
``Partition(user, "agent_framework", "checkpoints")``, one record per
checkpoint named ``c/<encoded checkpoint id>``. A checkpoint id therefore only
means something inside its user's partition: guessing another user's id finds
nothing. Each record is

* the framework's own checkpoint encoding (``encode_checkpoint_value``: JSON
  with pickled leaves), serialized as UTF-8 JSON and capped at
  ``max_item_bytes`` (1 MiB by default);
* written in append mode: saving the same id again with identical bytes is a
  no-op, with different bytes it raises
  :class:`~checkpointers.errors.StepMismatchError` and keeps the stored one;
* tagged with ``workflow`` (the workflow name), ``graph`` (graph signature
  hash), ``previous`` (previous checkpoint id), ``id``, ``iteration``,
  ``timestamp`` and ``format`` (7 of the 16 tags allowed). Values longer than
  256 characters are stored as ``sha256:<hex>`` of the value.

``get_latest`` and ``list_checkpoint_ids`` query that index (tag ``workflow``,
ordered by the store-assigned write sequence), they never decode every
checkpoint; ``get_latest`` reads one record. (On S3, ``list_checkpoint_ids``
still GETs each listed record to confirm its index entry: see that method.)
"Latest" is the checkpoint saved last, never the one with the largest
timestamp: timestamps tie and go backwards, write sequences do not.

Decoding is restricted to the framework's safe types plus
``allowed_checkpoint_types`` (``"module:qualname"`` strings, as for the
framework's ``FileCheckpointStorage``) and types registered with
``agent_framework.register_checkpoint_type``. Before the framework unpickles
anything, each pickled leaf is checked without being run: loading never
imports a module (a type's module must already be imported: the framework's
own are, yours are once your code uses them), never calls anything but what
the pickler writes for an allowed type (no ``__init__`` of stored data's
choosing, no attribute set through a property, ``__class__`` or a class
object), and bounds what decoding would allocate, hash and nest. Anything else
is a :class:`CorruptCheckpointError` naming what was refused. ``save`` decodes
what it encoded before writing, under the same checks, so a checkpoint that
could not be restored is refused at save time, not discovered at resume time.

Errors
======

``load`` of an id that this user does not have raises the framework's
``WorkflowCheckpointException``; so do an invalid id
(:class:`InvalidCheckpointIdError`) and damaged or undecodable stored data
(:class:`CorruptCheckpointError`), which are also
``checkpointers`` errors (``InvalidNameError`` / ``CorruptItemError``).
"""

from __future__ import annotations

import _compat_pickle
import base64
import binascii
import collections
import datetime
import decimal
import enum
import hashlib
import io
import json
import logging
import pickletools
import sys
import types
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar

# The framework's own checkpoint types (WorkflowMessage, its events, Message / Content) are
# imported here, by code, so that a process that has not built a workflow yet can load a
# checkpoint holding them: loading never imports a module named in stored data.
import agent_framework._workflows._runner_context  # noqa: F401
from agent_framework import WorkflowCheckpoint, WorkflowCheckpointException
from agent_framework._workflows._checkpoint_encoding import (
    _BLOCKED_FRAMEWORK_GLOBAL_KEYS,
    _BUILTIN_ALLOWED_TYPE_KEYS,
    _FRAMEWORK_MODULE_PREFIXES,
    _GETATTR_GLOBAL_KEYS,
    _OPENAI_MODULE_PREFIX,
    _PICKLE_MARKER,
    _REGISTERED_CHECKPOINT_TYPE_KEYS,
    _TYPE_MARKER,
    decode_checkpoint_value,
    encode_checkpoint_value,
)

from checkpointers._flows import Flow, GetOp, ListOp, arun, delete_present_flow, new_etag, write_flow
from checkpointers._integrity import Integrity, IntegrityKeys
from checkpointers._names import (
    ANONYMOUS_USER,
    DEFAULT_MAX_ITEM_BYTES,
    MAX_TAG_VALUE_LENGTH,
    Partition,
    check_size,
    check_tags,
    encode_component,
    validate_user,
)
from checkpointers.backends import Backend, open_backend
from checkpointers.backends.base import ListQuery, Mode, Put, Record
from checkpointers.errors import (
    CheckpointerError,
    CorruptItemError,
    InvalidNameError,
    IsolationError,
)

__all__ = [
    "CheckpointSaveRefusedError",
    "CorruptCheckpointError",
    "InvalidCheckpointIdError",
    "IsolatedCheckpointStorage",
    "RefusedSave",
]

logger = logging.getLogger(__name__)
_T = TypeVar("_T")

#: The partition space of this face and the one partition name per user.
SPACE = "agent_framework"
PARTITION_NAME = "checkpoints"
#: Name prefix of checkpoint records inside the partition.
RECORD_PREFIX = "c/"
#: Longest checkpoint id accepted (the framework's default ids are 36-character UUIDs).
MAX_CHECKPOINT_ID_LENGTH = 256
_HASHED_TAG = "sha256:"

# Tag names (7 of the 16 a record may carry).
TAG_ID = "id"
TAG_WORKFLOW = "workflow"
TAG_GRAPH = "graph"
TAG_PREVIOUS = "previous"
TAG_ITERATION = "iteration"
TAG_TIMESTAMP = "timestamp"
TAG_FORMAT = "format"


class InvalidCheckpointIdError(InvalidNameError, WorkflowCheckpointException):
    """A checkpoint id is not a string of 1-256 printable characters.

    Raised before any I/O. It is both a ``checkpointers`` ``InvalidNameError``
    (a ``ValueError``) and the framework's ``WorkflowCheckpointException``.
    """

    def __init__(self, checkpoint_id: object, reason: str) -> None:
        super().__init__("checkpoint id", checkpoint_id, reason)


class CorruptCheckpointError(CorruptItemError, WorkflowCheckpointException):
    """A stored checkpoint failed its digest check or cannot be decoded.

    Damaged data is never returned, and ``get_latest`` never falls back to an
    older checkpoint. A checkpoint saved with a type that is no longer in
    ``allowed_checkpoint_types`` lands here too: allow the type again, or
    ``delete`` the checkpoint.
    """


class CheckpointSaveRefusedError(CheckpointerError, WorkflowCheckpointException):
    """Raised by :meth:`IsolatedCheckpointStorage.raise_if_refused`.

    ``refusals`` lists every :class:`RefusedSave` since the last call; the
    last refusal's error is chained as ``__cause__``.
    """

    def __init__(self, refusals: list[RefusedSave]) -> None:
        self.refusals = refusals
        shown = "; ".join(f"{r.checkpoint_id!r}: {r.error}" for r in refusals[:3])
        more = f" (and {len(refusals) - 3} more)" if len(refusals) > 3 else ""
        super().__init__(
            f"{len(refusals)} checkpoint save(s) were refused during the run, so resuming "
            f"would start from an older checkpoint: {shown}{more}"
        )


@dataclass(frozen=True)
class RefusedSave:
    """One refused ``save``: which checkpoint, of which workflow, and why."""

    checkpoint_id: str
    workflow_name: str
    error: Exception


def _record_name(checkpoint_id: str) -> str:
    """The backend record name of a (validated) checkpoint id."""
    return RECORD_PREFIX + encode_component(checkpoint_id)


def _check_id(checkpoint_id: object) -> str:
    """Validate a checkpoint id: a string of 1-256 characters, no control characters."""
    if not isinstance(checkpoint_id, str):
        raise InvalidCheckpointIdError(checkpoint_id, "must be a string")
    if not 1 <= len(checkpoint_id) <= MAX_CHECKPOINT_ID_LENGTH:
        raise InvalidCheckpointIdError(
            checkpoint_id,
            f"must be 1-{MAX_CHECKPOINT_ID_LENGTH} characters, got {len(checkpoint_id)}",
        )
    if any(ord(c) < 32 or ord(c) == 127 for c in checkpoint_id):
        raise InvalidCheckpointIdError(checkpoint_id, "must not contain control characters or NUL")
    try:
        checkpoint_id.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidCheckpointIdError(checkpoint_id, "must be valid unicode (no lone surrogates)") from None
    return checkpoint_id


def _check_workflow_name(workflow_name: object) -> str:
    if not isinstance(workflow_name, str):
        raise InvalidNameError("workflow name", workflow_name, "must be a string")
    return workflow_name


def _tag_value(value: str) -> str:
    """``value`` as a tag value, or ``sha256:<hex>`` when it cannot be one.

    Values that are too long, hold NUL or lone surrogates, or already start
    with the ``sha256:`` marker are hashed, so the mapping stays injective.
    """
    try:
        value.encode("utf-8")
        plain = (
            len(value) <= MAX_TAG_VALUE_LENGTH
            and "\x00" not in value
            and not value.startswith(_HASHED_TAG)
        )
    except UnicodeEncodeError:
        plain = False
    if plain:
        return value
    return _HASHED_TAG + hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()


class IsolatedCheckpointStorage:
    """An ``agent_framework`` ``CheckpointStorage`` bound to one user, over any backend.

    Args:
        backend: a :class:`~checkpointers.backends.Backend`, or a store URL for
            :func:`~checkpointers.backends.open_backend` (``sqlite:///x.db``,
            ``redis://...``, ``s3://bucket/prefix``, ``memory://``); a backend
            opened from a URL is closed by :meth:`close` / :meth:`aclose`.
        user: the user whose checkpoints this storage reads and writes.
            Required (non-empty) while ``user_isolation`` is on.
        user_isolation: ``False`` uses the shared anonymous space instead
            (``user`` must then be omitted); it is isolated from every named user.
        allowed_checkpoint_types: extra ``"module:qualname"`` types allowed when
            decoding, beyond the framework's safe set (as ``FileCheckpointStorage``).
        max_item_bytes: cap on one serialized checkpoint (default 1 MiB).
        on_refused: called with a :class:`RefusedSave` each time ``save`` refuses.
        integrity_key: secret(s) for HMAC record seals (a list rotates: the
            first signs, all verify); default ``CHECKPOINTERS_INTEGRITY_KEY``.
            Without one, each record's seal still binds it to its user and id,
            so a record copied from another user's storage is refused.
        accept_unsealed: read records without a trustworthy seal (written
            before 0.2); default: only when no key is set.
        **backend_options: passed to ``open_backend`` when ``backend`` is a URL.

    **Refused saves are made visible.** The framework's runner catches every
    exception from ``save()``, logs a warning and carries on, so a refused save
    (over the size cap, a type outside the allowlist, a different checkpoint
    under an existing id, a backend outage) would vanish, and a later resume
    would silently start from an older checkpoint. This storage therefore

    * logs each refusal at ERROR on the ``adapters.agent_framework`` logger,
      with the checkpoint id, the workflow and the reason;
    * counts it: :attr:`refused_saves` (since creation) and :attr:`refusals`
      (the :class:`RefusedSave` records not yet raised);
    * calls ``on_refused(refusal)`` if given (its exceptions are logged, not raised);
    * and :meth:`raise_if_refused` — call it after ``workflow.run(...)`` —
      raises :class:`CheckpointSaveRefusedError` (a
      ``WorkflowCheckpointException``) if any save was refused since the last
      call, which is the opt-in that makes the run fail.

    Calling ``save`` directly still raises the original error.
    """

    def __init__(
        self,
        backend: Backend | str,
        *,
        user: str | None = None,
        user_isolation: bool = True,
        allowed_checkpoint_types: Iterable[str] | None = None,
        max_item_bytes: int = DEFAULT_MAX_ITEM_BYTES,
        on_refused: Callable[[RefusedSave], None] | None = None,
        integrity_key: IntegrityKeys = None,
        accept_unsealed: bool | None = None,
        integrity: Integrity | None = None,
        **backend_options: Any,
    ) -> None:
        if isinstance(backend, str):
            self.backend: Backend = open_backend(backend, **backend_options)
            self._owns_backend = True
        elif backend_options:
            raise TypeError(
                f"backend options {sorted(backend_options)} are only accepted with a store URL"
            )
        else:
            self.backend = backend
            self._owns_backend = False
        if user_isolation:
            if user is None or user == "":
                raise IsolationError(
                    "IsolatedCheckpointStorage is bound to one user: pass user=<user id> "
                    "(or user_isolation=False to use the shared anonymous space)"
                )
            self.user: str = validate_user(user)
        else:
            if user is not None:
                raise ValueError("user_isolation=False uses the anonymous space: do not pass user=")
            self.user = ANONYMOUS_USER
        if isinstance(allowed_checkpoint_types, str):
            raise TypeError("allowed_checkpoint_types must be a list of 'module:qualname' strings")
        if max_item_bytes <= 0:
            raise ValueError(f"max_item_bytes must be positive, got {max_item_bytes}")
        self.user_isolation = user_isolation
        self.allowed_checkpoint_types: frozenset[str] = frozenset(allowed_checkpoint_types or ())
        self.max_item_bytes = max_item_bytes
        self.on_refused = on_refused
        self.integrity = integrity or Integrity(integrity_key, accept_unsealed=accept_unsealed)
        #: The one partition holding every checkpoint of this user.
        self.partition = Partition(self.user, SPACE, PARTITION_NAME)
        #: Refused saves not yet raised by :meth:`raise_if_refused`.
        self.refusals: list[RefusedSave] = []
        #: Number of refused saves since this storage was created.
        self.refused_saves = 0

    @classmethod
    def from_url(cls, url: str, **options: Any) -> IsolatedCheckpointStorage:
        """A storage over the backend ``url`` names (closed by :meth:`close`).

        ``options`` are this class's keyword arguments (``user=``, ...) plus
        any backend options for :func:`~checkpointers.backends.open_backend`.
        """
        return cls(url, **options)

    def for_user(self, user: str) -> IsolatedCheckpointStorage:
        """A storage for ``user`` sharing this one's backend and settings.

        The view has its own refusal records and never closes the backend.
        """
        return IsolatedCheckpointStorage(
            self.backend,
            user=user,
            allowed_checkpoint_types=self.allowed_checkpoint_types,
            max_item_bytes=self.max_item_bytes,
            on_refused=self.on_refused,
            integrity=self.integrity,
        )

    # -- the CheckpointStorage protocol ----------------------------------

    async def save(self, checkpoint: WorkflowCheckpoint) -> str:
        """Store ``checkpoint`` (append-only by id) and return its id.

        Raises:
            InvalidCheckpointIdError: the id is not 1-256 printable characters.
            WorkflowCheckpointException: it cannot be encoded, or would not
                decode under the allowed types.
            ItemTooLargeError: over ``max_item_bytes``; nothing was written.
            StepMismatchError: this id is stored with different content.
            BackendUnavailableError: the backend could not be reached.

        Every refusal is also logged, counted and reported to ``on_refused``.
        """
        try:
            return await arun(self._save_flow(checkpoint), self.backend)
        except Exception as exc:
            self._record_refusal(checkpoint, exc)
            raise

    async def load(self, checkpoint_id: str) -> WorkflowCheckpoint:
        """The checkpoint ``checkpoint_id`` of this user.

        Raises ``WorkflowCheckpointException`` if this user has no such
        checkpoint, :class:`CorruptCheckpointError` if it cannot be decoded.
        """
        return await self._read(self._load_flow(checkpoint_id))

    async def list_checkpoints(self, *, workflow_name: str) -> list[WorkflowCheckpoint]:
        """Every checkpoint of ``workflow_name`` for this user, oldest saved first.

        A checkpoint that cannot be decoded raises :class:`CorruptCheckpointError`
        (it is not skipped); ``list_checkpoint_ids`` and ``delete`` still work.
        """
        return await self._read(self._list_flow(workflow_name))

    async def delete(self, checkpoint_id: str) -> bool:
        """Delete this user's checkpoint ``checkpoint_id``; return whether this call deleted it.

        Of concurrent deletes of one checkpoint, exactly one returns ``True``.
        """
        return await arun(self._delete_flow(checkpoint_id), self.backend)

    async def get_latest(self, *, workflow_name: str) -> WorkflowCheckpoint | None:
        """The checkpoint of ``workflow_name`` saved last by this user, or ``None``.

        One indexed query (``limit=1`` by write sequence). If that checkpoint
        cannot be decoded this raises :class:`CorruptCheckpointError`; it never
        returns an older one instead.
        """
        return await self._read(self._latest_flow(workflow_name))

    async def list_checkpoint_ids(self, *, workflow_name: str) -> list[str]:
        """Ids of this user's checkpoints of ``workflow_name``, oldest saved first.

        Read from the index (tags only): no checkpoint is decoded. On SQLite,
        Redis and memory no checkpoint body is read either. On S3 each index
        entry is confirmed by GETting its record (one request per checkpoint,
        values dropped): entries are written before their records, so an entry
        alone may name a checkpoint that was never written, deleted or
        rewritten, and only the record's header proves it. Prefer
        :meth:`get_latest` (one LIST and one GET) on S3 hot paths.
        """
        return await self._read(self._ids_flow(workflow_name))

    async def _read(self, flow: Flow[_T]) -> _T:
        """Run a read flow; damaged stored bytes of any kind surface as :class:`CorruptCheckpointError`."""
        try:
            return await arun(flow, self.backend)
        except CorruptCheckpointError:
            raise
        except CorruptItemError as exc:  # found by the backend (damaged metadata) or the seal check
            raise CorruptCheckpointError(exc.key, exc.reason) from exc

    # -- refusals ----------------------------------------------------------

    def raise_if_refused(self) -> None:
        """Raise :class:`CheckpointSaveRefusedError` if a save was refused since the last call.

        Call it after ``workflow.run(...)`` to make a run whose checkpoints
        were not all saved fail. The pending refusals are cleared when raised.
        """
        if self.refusals:
            refusals, self.refusals = self.refusals, []
            raise CheckpointSaveRefusedError(refusals) from refusals[-1].error

    def _record_refusal(self, checkpoint: Any, exc: Exception) -> None:
        checkpoint_id = str(getattr(checkpoint, "checkpoint_id", "<unknown>"))
        workflow_name = str(getattr(checkpoint, "workflow_name", "<unknown>"))
        logger.error(
            "refused to save checkpoint %r of workflow %r: %s: %s",
            checkpoint_id,
            workflow_name,
            type(exc).__name__,
            exc,
        )
        refusal = RefusedSave(checkpoint_id, workflow_name, exc)
        self.refusals.append(refusal)
        self.refused_saves += 1
        if self.on_refused is not None:
            try:
                self.on_refused(refusal)
            except Exception:
                logger.exception("on_refused callback failed for checkpoint %r", checkpoint_id)

    # -- flows (no I/O of their own) ---------------------------------------

    def _save_flow(self, checkpoint: WorkflowCheckpoint) -> Flow[str]:
        put = self._prepare(checkpoint)  # every check runs before the first yield
        yield from write_flow(self.partition, [put], labels=[checkpoint.checkpoint_id])
        return checkpoint.checkpoint_id

    def _prepare(self, checkpoint: WorkflowCheckpoint) -> Put:
        if not isinstance(checkpoint, WorkflowCheckpoint):
            raise TypeError(f"save() takes a WorkflowCheckpoint, got {type(checkpoint).__name__}")
        checkpoint_id = _check_id(checkpoint.checkpoint_id)
        _check_workflow_name(checkpoint.workflow_name)
        try:
            encoded = encode_checkpoint_value(checkpoint.to_dict())
            data = json.dumps(encoded, ensure_ascii=False, separators=(",", ":")).encode(
                "utf-8", "surrogatepass"
            )
        except Exception as exc:
            raise WorkflowCheckpointException(
                f"checkpoint {checkpoint_id!r} cannot be encoded ({type(exc).__name__}: {exc}); "
                f"refusing to save"
            ) from exc
        check_size(checkpoint_id, len(data), self.max_item_bytes)
        try:
            _restricted_decode(_parse(data), self.allowed_checkpoint_types)
        except Exception as exc:
            raise WorkflowCheckpointException(
                f"checkpoint {checkpoint_id!r} could not be restored under this storage's allowed "
                f"types ({exc}); refusing to save. Add the type's 'module:qualname' to "
                f"allowed_checkpoint_types or register it with register_checkpoint_type()."
            ) from exc
        tags = check_tags(checkpoint_id, self._tags(checkpoint))
        return self.integrity.put(
            self.partition, _record_name(checkpoint_id), data, etag=new_etag(), tags=tags, mode=Mode.APPEND
        )

    @staticmethod
    def _tags(checkpoint: WorkflowCheckpoint) -> dict[str, str]:
        return {
            TAG_ID: checkpoint.checkpoint_id,
            TAG_WORKFLOW: _tag_value(checkpoint.workflow_name),
            TAG_GRAPH: _tag_value(str(checkpoint.graph_signature_hash)),
            TAG_PREVIOUS: _tag_value(str(checkpoint.previous_checkpoint_id or "")),
            TAG_ITERATION: str(checkpoint.iteration_count),
            TAG_TIMESTAMP: _tag_value(str(checkpoint.timestamp)),
            TAG_FORMAT: _tag_value(str(checkpoint.version)),
        }

    def _decode(self, record: Record, checkpoint_id: str) -> WorkflowCheckpoint:
        try:
            self.integrity.check(self.partition, record, checkpoint_id)
        except CorruptItemError as exc:
            raise CorruptCheckpointError(checkpoint_id, exc.reason) from exc
        try:
            parsed = _parse(record.value)
        except (ValueError, RecursionError) as exc:  # RecursionError: JSON nested too deep
            raise CorruptCheckpointError(checkpoint_id, f"not valid JSON: {exc}") from exc
        try:
            decoded = _restricted_decode(parsed, self.allowed_checkpoint_types)
            checkpoint = WorkflowCheckpoint.from_dict(decoded)
        except Exception as exc:
            raise CorruptCheckpointError(checkpoint_id, f"cannot be decoded: {exc}") from exc
        if checkpoint.checkpoint_id != checkpoint_id:
            raise CorruptCheckpointError(
                checkpoint_id, f"the record holds checkpoint {checkpoint.checkpoint_id!r}"
            )
        return checkpoint

    def _load_flow(self, checkpoint_id: str) -> Flow[WorkflowCheckpoint]:
        checkpoint_id = _check_id(checkpoint_id)
        (record,) = yield GetOp(self.partition, [_record_name(checkpoint_id)])
        if record is None:
            raise WorkflowCheckpointException(f"No checkpoint found with ID {checkpoint_id}")
        return self._decode(record, checkpoint_id)

    def _query(self, workflow_name: str, **options: Any) -> ListOp:
        tags = {TAG_WORKFLOW: _tag_value(_check_workflow_name(workflow_name))}
        return ListOp(self.partition, ListQuery(prefix=RECORD_PREFIX, order="seq", tags=tags, **options))

    def _of_workflow(self, record: Record, workflow_name: str) -> WorkflowCheckpoint:
        checkpoint = self._decode(record, _id_of(record))
        if checkpoint.workflow_name != workflow_name:
            raise CorruptCheckpointError(
                checkpoint.checkpoint_id,
                f"indexed under workflow {workflow_name!r} but holds {checkpoint.workflow_name!r}",
            )
        return checkpoint

    def _list_flow(self, workflow_name: str) -> Flow[list[WorkflowCheckpoint]]:
        records = yield self._query(workflow_name)
        return [self._of_workflow(r, workflow_name) for r in records]

    def _latest_flow(self, workflow_name: str) -> Flow[WorkflowCheckpoint | None]:
        records = yield self._query(workflow_name, descending=True, limit=1)
        return self._of_workflow(records[0], workflow_name) if records else None

    def _ids_flow(self, workflow_name: str) -> Flow[list[str]]:
        records = yield self._query(workflow_name, values=False)
        # values are not read: check each record's seal (its place, id and tags) without them
        return [_id_of(self.integrity.check_place(self.partition, r, r.name)) for r in records]

    def _delete_flow(self, checkpoint_id: str) -> Flow[bool]:
        checkpoint_id = _check_id(checkpoint_id)
        return (yield from delete_present_flow(self.partition, _record_name(checkpoint_id), checkpoint_id))

    # -- lifecycle ---------------------------------------------------------

    def close(self) -> None:
        """Close the backend if this storage opened it from a URL."""
        if self._owns_backend:
            self.backend.close()

    async def aclose(self) -> None:
        """Async :meth:`close`."""
        if self._owns_backend:
            await self.backend.aclose()

    async def __aenter__(self) -> IsolatedCheckpointStorage:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return (
            f"IsolatedCheckpointStorage(backend={self.backend.kind!r}, user={self.user!r}, "
            f"refused_saves={self.refused_saves})"
        )


def _parse(data: bytes) -> Any:
    return json.loads(data.decode("utf-8", "surrogatepass"))


def _id_of(record: Record) -> str:
    checkpoint_id = record.tags.get(TAG_ID)
    if checkpoint_id is None:
        raise CorruptCheckpointError(record.name, "the record has no 'id' tag")
    return checkpoint_id


# -- restricted decoding: stored bytes never import a module, never call outside the allowlist ---
#
# ``decode_checkpoint_value(..., allowed_types=...)`` unpickles each ``{"__pickled__": <base64>,
# "__type__": <key>}`` leaf with the framework's ``_RestrictedUnpickler``, and its ``find_class``
# imports the named module before it checks the result: any module under ``agent_framework.``,
# ``agent_framework_orchestrations.`` or ``openai.types.``, from anywhere on ``sys.path``, and the
# module of any allowed type; a module ``__getattr__`` (the framework's lazy namespaces) then
# imports further packages. REDUCE may call any allowed class with any arguments (running its
# ``__init__``), BUILD on a class object sets class attributes process-wide, a ``__setstate__``
# sets any attribute (``__class__`` included), and a few bytes can make decoding allocate
# gigabytes, hash for hours or overflow the C stack.
#
# So before that call every pickled leaf is run here on symbols (nothing is imported, built or
# called): each global must be an allowed class of a module that is already imported, read from
# the module's ``__dict__``; each call, BUILD and container update must be one the pickler writes
# for such a class; what decoding would allocate, hash, walk and nest is bounded. Anything else
# raises :class:`_UnsafeCheckpointData` before the framework sees the bytes.

# The bounds below hold per checkpoint (all its pickled leaves together).
#: Set members / dict keys whose hash cannot be known here (frozen dataclasses, NamedTuples, ...),
#: so that equal hashes cannot make decoding quadratic in Python-level ``__eq__`` calls (256 such
#: keys with one hash cost some 30 ms to insert).
_MAX_OPAQUE_KEYS = 256
#: Distinct keys with one hash value (unequal ints share a hash only from 2**61 up).
_MAX_EQUAL_HASHES = 64
#: Objects decoding may visit hashing keys or walking arguments: this many per pickle byte (data
#: that shares nothing needs about one), at least the floor.
_WORK_PER_BYTE = 4
_WORK_FLOOR = 20_000
#: Deeper than the pickler could have written (hashing a tuple nested ~10**5 deep overflows the C stack).
_MAX_NESTING = max(2 * sys.getrecursionlimit(), 2000)
_SATURATE = 1 << 62
_HEAPTYPE = 1 << 9

#: Dunder keys a BUILD state may carry, by the ``__setstate__`` that reads them.
_PYDANTIC_STATE_KEYS = frozenset({"__dict__", "__pydantic_extra__", "__pydantic_fields_set__", "__pydantic_private__"})
_EXCEPTION_STATE_KEYS = frozenset({"__notes__"})
_NO_KEYS: frozenset[str] = frozenset()
#: ``__hash__`` implementations randomized per process: no collisions can be precomputed.
_RANDOM_HASHES = tuple(
    klass.__dict__["__hash__"]
    for klass in (str, bytes, datetime.date, datetime.datetime, datetime.time, datetime.timedelta, datetime.timezone)
)
#: Exact value types rebuilt here from literal arguments, to know their hash.
_EVALUATED_TYPES = frozenset({int, float, complex, bool, range, decimal.Decimal})
#: A slot: setting it runs no code.
_SLOT = type(uuid.UUID.__dict__["int"])
_TYPE_MRO = type.__dict__["__mro__"].__get__
_TYPE_DICT = type.__dict__["__dict__"].__get__


class _UnsafeCheckpointData(Exception):
    """A pickled leaf does what decoding must not do; the message says what, and how to allow a type."""


def _refuse(what: str) -> NoReturn:
    raise _UnsafeCheckpointData(what)


class _Identity:
    """Stand-in for an object hashed by identity: equal to nothing else."""

    __slots__ = ()


_OPAQUE = object()  # hashable, but its hash cannot be known here
_UNHASHABLE = object()


class _Sym:
    """What one slot of the pickle machine would hold, without building it.

    ``kind``: lit (``value``: the literal), class (``value``: the resolved class), special
    (``value``: "getattr" or "reconstructor"), tuple/list/dict/set/frozenset (``items``: item
    symbols, a dict's as key, value, key, ...), bytearray, inst (an object of class ``cls``;
    ``items``: its arguments and state), other. ``stand`` hashes and compares as the real value
    would (or is _OPAQUE / _UNHASHABLE), ``work`` bounds the objects hashing it visits, ``depth``
    is its nesting.
    """

    __slots__ = ("built", "cls", "depth", "items", "kind", "member", "sealed", "stand", "used", "value", "work")

    def __init__(self, kind: str, value: Any, items: list[_Sym] | None, stand: Any, work: int, depth: int) -> None:
        self.kind = kind
        self.value = value
        self.items = items
        self.cls: Any = None
        self.stand = stand
        self.work = work
        self.depth = depth
        self.used = self.sealed = self.built = self.member = False


def _lit(value: Any) -> _Sym:
    work = 1 + (value.bit_length() >> 6) if type(value) is int else 1
    return _Sym("lit", value, None, value, work, 0)


_NONE, _TRUE, _FALSE = _lit(None), _lit(True), _lit(False)


def _key_of(cls: Any) -> str:
    return f"{getattr(cls, '__module__', '?')}:{getattr(cls, '__qualname__', '?')}"


def _how_to_allow(key: str) -> str:
    return (
        f"To allow a type of your own, add {key!r} to allowed_checkpoint_types (or register it with "
        f"agent_framework.register_checkpoint_type) and import its module before loading: stored "
        f"data never makes this storage import a module."
    )


def _static_attr(owner: Any, name: str) -> Any:
    """``owner.name`` from ``__dict__``s only (a class: along its MRO), running no code; KeyError if absent."""
    if isinstance(owner, type):
        for klass in _TYPE_MRO(owner):
            namespace = _TYPE_DICT(klass)
            if name in namespace:
                return namespace[name]
        raise KeyError(name)
    return object.__getattribute__(owner, "__dict__")[name]


def _defined(cls: type, name: str) -> Any:
    try:
        return _static_attr(cls, name)
    except KeyError:
        return None


def _is_data_descriptor(value: Any) -> bool:
    """Whether setting an attribute that ``value`` holds runs code (a property, ...), read statically."""
    return _defined(type(value), "__set__") is not None or _defined(type(value), "__delete__") is not None


def _overrides(cls: type, name: str) -> bool:
    """Whether a class of ``cls``'s MRO other than ``object`` defines ``name``."""
    for klass in _TYPE_MRO(cls):
        if name in _TYPE_DICT(klass):
            return klass is not object
    return False


def _prefix_allowed(module: str) -> bool:
    return module.startswith((*_FRAMEWORK_MODULE_PREFIXES, _OPENAI_MODULE_PREFIX))


def _is_allowed_class(cls: type, allowed: frozenset[str]) -> bool:
    """The framework's ``_is_allowed_type`` (a class reached by attribute traversal)."""
    key = _key_of(cls)
    return key in _BUILTIN_ALLOWED_TYPE_KEYS or key in allowed or _prefix_allowed(str(cls.__module__))


def _resolve_global(module: str, name: str, proto: int, allowed: frozenset[str]) -> _Sym:
    """What ``find_class(module, name)`` would push, found without importing or calling anything."""
    key = f"{module}:{name}"
    if key in _BLOCKED_FRAMEWORK_GLOBAL_KEYS:
        _refuse(f"the stored data names the framework's own decoder {key!r}")
    if key in _GETATTR_GLOBAL_KEYS:
        return _Sym("special", "getattr", None, _UNHASHABLE, 1, 0)
    if key == "copyreg:_reconstructor":
        return _Sym("special", "reconstructor", None, _UNHASHABLE, 1, 0)
    if not (key in _BUILTIN_ALLOWED_TYPE_KEYS or key in allowed or (_prefix_allowed(module) and "." not in name)):
        _refuse(f"the stored data names {key!r}, which is not an allowed type. " + _how_to_allow(key))
    if proto < 3 and ((module, name) in _compat_pickle.NAME_MAPPING or module in _compat_pickle.IMPORT_MAPPING):
        _refuse(f"the stored data names {key!r}, a Python 2 name that unpickling would map to another")
    loaded = sys.modules.get(module)
    if not isinstance(loaded, types.ModuleType):
        _refuse(
            f"the stored data names {key!r}, but module {module!r} is not imported, and loading a "
            f"checkpoint never imports a module. " + _how_to_allow(key)
        )
    if type(loaded).__getattribute__ is not types.ModuleType.__getattribute__:
        _refuse(f"the stored data names {key!r} in module {module!r}, whose attribute lookup runs code")
    parts = name.split(".")
    if (len(parts) > 1 and proto < 4) or "<locals>" in parts or "" in parts:
        _refuse(f"the stored data names {key!r}, which is not a class name")
    target: Any = loaded
    try:
        for part in parts:
            target = _static_attr(target, part)
            if not isinstance(target, type):
                break
    except KeyError:
        _refuse(
            f"the stored data names {key!r}, which module {module!r} does not define (a module "
            f"__getattr__ is never consulted: it may import)"
        )
    if not isinstance(target, type):
        _refuse(f"the stored data names {key!r}, which is not a class")
    return _Sym("class", target, None, target, 1, 0)


class _ClassInfo:
    """What the checks need to know about one class, read from its MRO's ``__dict__``s."""

    __slots__ = ("builtin", "descriptors", "enum", "hashing", "key", "lookup_runs_code", "reduce_call", "setstate")

    def __init__(self, cls: type, pydantic_setstate: Any) -> None:
        self.key = _key_of(cls)
        self.builtin = self.key in _BUILTIN_ALLOWED_TYPE_KEYS
        self.enum = issubclass(cls, enum.Enum)
        hash_impl = _defined(cls, "__hash__")
        if hash_impl is None:
            self.hashing = "unhashable"
        elif hash_impl is object.__hash__:
            self.hashing = "identity"
        elif self.enum:
            self.hashing = "enum"  # finitely many members
        elif any(hash_impl is random for random in _RANDOM_HASHES):
            self.hashing = "random"
        elif cls in _EVALUATED_TYPES:
            self.hashing = "evaluated"
        else:
            self.hashing = "opaque"
        setstate = _defined(cls, "__setstate__")
        self.setstate = "pydantic" if setstate is not None and setstate is pydantic_setstate else setstate is not None
        self.lookup_runs_code = _overrides(cls, "__getattribute__") or (
            setstate is None and _overrides(cls, "__getattr__")
        )
        # A class's own __reduce__ is what makes the pickler write a call of the class.
        self.reduce_call = self.builtin or _overrides(cls, "__reduce_ex__") or _overrides(cls, "__reduce__")
        seen: set[str] = set()
        descriptors = set()
        for klass in _TYPE_MRO(cls):
            for name, value in _TYPE_DICT(klass).items():
                if name not in seen:
                    seen.add(name)
                    if _is_data_descriptor(value) and not isinstance(value, _SLOT):
                        descriptors.add(name)
        self.descriptors = frozenset(descriptors)


#: Read once per class (classes are not expected to gain properties or hooks while the process runs).
_CLASS_INFO: weakref.WeakKeyDictionary[type, _ClassInfo] = weakref.WeakKeyDictionary()


class _Limits:
    """What the pickles of one checkpoint may make decoding do, together; and the globals they resolved."""

    __slots__ = ("budget", "globals", "hashes", "opaque_keys", "work")

    def __init__(self, pickle_bytes: int) -> None:
        self.work = 0
        self.budget = max(_WORK_FLOOR, _WORK_PER_BYTE * pickle_bytes)
        self.opaque_keys = 0
        self.hashes: dict[int, list[Any]] = {}
        self.globals: dict[tuple[str, str, int], _Sym] = {}


class _PickleCheck:
    """Runs one pickle on symbols (the semantics of ``pickle._Unpickler``), refusing what decoding must not do."""

    def __init__(self, data: bytes, allowed: frozenset[str], limits: _Limits) -> None:
        self.data = data
        self.allowed = allowed
        self.limits = limits
        self.proto = 0
        self.stack: list[_Sym] = []
        self.metastack: list[list[_Sym]] = []
        self.memo: dict[int, _Sym] = {}

    def run(self) -> None:
        handlers = _HANDLERS
        memo = self.memo
        try:
            for code, arg, pos in _opcodes(self.data):
                # The three opcodes that make up most of a pickled object, inline (op_memoize, op_literal, op_none).
                if code == _MEMOIZE:
                    if not self.stack:
                        _refuse("the pickle memoizes an empty stack")
                    memo[len(memo)] = self.stack[-1]
                    continue
                if code == _SHORT_BINUNICODE:
                    self.stack.append(_Sym("lit", arg, None, arg, 1, 0))
                    continue
                if code == _NONE_CODE:
                    self.stack.append(_NONE)
                    continue
                handler = handlers.get(code)
                if handler is None:
                    _refuse(f"the pickle uses opcode {_CODE2OP[code].name}, which checkpoint decoding refuses")
                if handler(self, arg, pos):
                    return
        except _UnsafeCheckpointData:
            raise
        except Exception as exc:  # noqa: BLE001 - pickletools found it malformed, or a check met a shape it cannot read
            _refuse(f"the pickle is malformed ({type(exc).__name__}: {exc})")
        _refuse("the pickle ends without STOP")

    @staticmethod
    def info(klass: type) -> _ClassInfo:
        try:
            return _CLASS_INFO[klass]
        except (KeyError, TypeError):
            pass
        pydantic = sys.modules.get("pydantic.main")
        model = getattr(pydantic, "BaseModel", None) if pydantic is not None else None
        found = _ClassInfo(klass, _defined(model, "__setstate__") if isinstance(model, type) else None)
        try:
            _CLASS_INFO[klass] = found
        except TypeError:  # not weak-referenceable
            pass
        return found

    # -- the stack --

    def pop(self) -> _Sym:
        if not self.stack:
            _refuse("the pickle pops from an empty stack")
        return self.stack.pop()

    def top(self) -> _Sym:
        if not self.stack:
            _refuse("the pickle reads an empty stack")
        return self.stack[-1]

    def pop_mark(self) -> list[_Sym]:
        if not self.metastack:
            _refuse("the pickle pops a mark it never pushed")
        items = self.stack
        self.stack = self.metastack.pop()
        return items

    def push(self, sym: _Sym) -> None:
        if sym.depth > _MAX_NESTING:
            _refuse(f"the pickle nests deeper than {_MAX_NESTING} levels")
        self.stack.append(sym)

    @staticmethod
    def as_value(sym: _Sym) -> _Sym:
        """``sym`` used as a value (item, argument, state): never a special callable."""
        if sym.kind == "special":
            _refuse("the pickle uses getattr or copyreg._reconstructor as a value, not as a call")
        sym.used = True
        return sym

    # -- hashing and walking --

    def charge(self, work: int) -> None:
        limits = self.limits
        limits.work += work
        if limits.work > limits.budget:
            _refuse("the pickle would make decoding hash or walk far more objects than its size (shared or deep data)")

    def hashed(self, sym: _Sym) -> None:
        """``sym`` becomes a set member or dict key: charge its hashing, bound equal hashes."""
        if sym.kind == "lit" and type(sym.value) in (str, bytes):
            self.limits.work += 1  # randomized hash, computed once per object
            return
        self.as_value(sym)
        self.charge(sym.work)
        stand = sym.stand
        if stand is _UNHASHABLE:
            return  # unpickling raises TypeError
        if stand is _OPAQUE:
            self.limits.opaque_keys += 1
            if self.limits.opaque_keys > _MAX_OPAQUE_KEYS:
                _refuse(
                    f"the checkpoint has more than {_MAX_OPAQUE_KEYS} set members or dict keys whose "
                    f"hash cannot be checked here (instances of {_key_of(sym.cls)}, ...)"
                )
            return
        try:
            bucket = self.limits.hashes.setdefault(hash(stand), [])
            for other in bucket:
                self.charge(sym.work)
                if other is stand or other == stand:
                    return
        except _UnsafeCheckpointData:
            raise
        except Exception as exc:  # noqa: BLE001 - unpickling would fail the same way
            _refuse(f"the pickle holds a key that cannot be hashed or compared ({type(exc).__name__})")
        bucket.append(stand)
        if len(bucket) > _MAX_EQUAL_HASHES:
            _refuse(f"the pickle holds more than {_MAX_EQUAL_HASHES} distinct keys with one hash value")

    def expansion(self, key: str, args: list[_Sym]) -> None:
        """Arguments handed to a class's own code: bound what walking them (a repr, a log line) visits."""
        remaining = self.limits.budget - self.limits.work
        visited = 0
        pending = list(args)
        while pending:
            sym = pending.pop()
            visited += 1
            if visited > remaining:
                _refuse(
                    f"the pickle passes {key} arguments that expand to more objects than its size "
                    f"allows (shared or cyclic structures)"
                )
            if sym.items:
                pending.extend(sym.items)
        self.charge(visited)

    def keys_of(self, sym: _Sym, *, pairs: bool) -> None:
        """A set or dict is built from ``sym``: its items (``pairs``: their first items) are hashed."""
        if sym.kind == "lit" and type(sym.value) in (str, bytes):
            return
        if sym.kind == "dict":
            for key in (sym.items or [])[0::2]:
                self.hashed(key)
            return
        if sym.kind not in ("list", "tuple", "set", "frozenset"):
            _refuse(f"the pickle builds a set or dict from a {sym.kind} whose items cannot be checked")
        for item in sym.items or []:
            if not pairs:
                self.hashed(item)
            elif item.kind in ("tuple", "list") and item.items is not None and len(item.items) == 2:
                self.hashed(item.items[0])
            else:
                _refuse("the pickle builds a dict from items that are not pairs")

    # -- calls: only what the pickler writes for allowed classes --

    def arguments(self, cls: type, args: list[_Sym], what: str) -> None:
        for arg in args:
            self.as_value(arg)
            if arg.kind == "inst" and arg.cls is range:
                _refuse(f"the pickle passes a range to {what} of {_key_of(cls)} (it could expand to any size)")
        if issubclass(cls, (bytes, bytearray)) and args:
            first = args[0]
            if first.kind != "bytearray" and not (first.kind == "lit" and type(first.value) in (str, bytes)):
                _refuse(f"the pickle builds {_key_of(cls)} from a {first.kind} (a size allocates that much)")
        if (issubclass(cls, str) or cls is uuid.UUID) and any(a.kind != "lit" for a in args):
            # str() walks its argument's repr (any size for shared data); UUID() calls its methods.
            _refuse(f"the pickle builds {_key_of(cls)} from a non-literal argument")
        if issubclass(cls, type) and (cls is not type or what != "a call" or len(args) != 1):
            _refuse("the pickle creates a class (type() with other than one argument, or a metaclass)")
        if issubclass(cls, enum.Enum) and len(args) > 1:
            _refuse(f"the pickle calls the enum {_key_of(cls)} with {len(args)} arguments (that creates an enum)")
        if issubclass(cls, (set, frozenset, collections.Counter)) and args:
            self.keys_of(args[0], pairs=False)
        elif issubclass(cls, collections.defaultdict):
            factory = args[0] if args else _NONE
            if factory is not _NONE and not (
                factory.kind == "class" and (self.info(factory.value).builtin or self.info(factory.value).key in self.allowed)
            ):
                _refuse("the pickle gives a defaultdict a default factory (called later) that is not a built-in or allowed type")
            if len(args) > 1:
                self.keys_of(args[1], pairs=args[1].kind != "dict")
        elif issubclass(cls, dict) and args:
            self.keys_of(args[0], pairs=args[0].kind != "dict")

    def instance(self, cls: type, args: list[_Sym], *, evaluate: bool) -> _Sym:
        """The symbol of ``cls(*args)`` or ``cls.__new__(cls, *args)``."""
        sym = _Sym("inst", None, list(args), _OPAQUE, 1, 1 + max((a.depth for a in args), default=0))
        sym.cls = cls
        hashing = self.info(cls).hashing
        if hashing == "unhashable":
            sym.stand = _UNHASHABLE
        elif hashing == "identity":
            sym.stand = _Identity()
        elif hashing in ("enum", "random"):
            sym.stand = (hashing, cls)  # equal hashes only for equal values, or finitely many
        elif hashing == "evaluated" and evaluate and all(a.kind == "lit" for a in args):
            try:
                sym.stand = cls(*(a.value for a in args))
            except Exception as exc:  # noqa: BLE001 - unpickling would fail the same way
                _refuse(f"the pickle builds {_key_of(cls)} from invalid arguments ({type(exc).__name__}: {exc})")
        else:
            sym.work = min(_SATURATE, 1 + sum(a.work for a in args))
        return sym

    def call(self, func: _Sym, args_sym: _Sym) -> _Sym:
        """REDUCE: ``func(*args)``."""
        if args_sym.kind != "tuple":
            _refuse(f"the pickle calls with arguments that are a {args_sym.kind}, not a tuple")
        args = list(args_sym.items or [])
        if func.kind == "special":
            return self.traverse(args) if func.value == "getattr" else self.reconstruct(args)
        if func.kind != "class":
            _refuse(f"the pickle calls a {func.kind}, which is not an allowed class")
        cls = func.value
        info = self.info(cls)
        if not info.reduce_call:
            _refuse(
                f"the pickle calls {info.key}(...), a call the pickler never writes for that class (it "
                f"rebuilds it with __new__ and its state): stored data may not run its __init__"
            )
        self.arguments(cls, args, "a call")
        if not info.builtin and not info.enum:
            self.expansion(info.key, args)  # its own code (an __init__) receives them
        if cls is type:
            return _Sym("other", None, None, ("type()",), 1, 1)
        sym = self.instance(cls, args, evaluate=True)
        if info.enum:
            sym.member = True
            self.charge(sum(a.work for a in args))  # the value is looked up by hash
        return sym

    def traverse(self, args: list[_Sym]) -> _Sym:
        """``getattr(owner, name)``: only a nested allowed class or a member of an allowed enum."""
        if len(args) != 2 or args[0].kind != "class" or args[1].kind != "lit" or type(args[1].value) is not str:
            _refuse("the pickle calls getattr on other than an allowed class and a literal name")
        owner, name = args[0].value, args[1].value
        key = f"{_key_of(owner)}.{name}"
        if name.startswith("__") and name.endswith("__"):
            _refuse(f"the pickle reads the special attribute {key!r}")
        for meta in _TYPE_MRO(type(owner)):
            found = _TYPE_DICT(meta).get(name)
            if found is not None and _is_data_descriptor(found):
                _refuse(f"the pickle reads {key!r}, which the class's metaclass computes")
        if (
            isinstance(owner, enum.EnumMeta)
            and _is_allowed_class(owner, self.allowed)
            and name in _defined(owner, "_member_map_")
        ):
            member = _Sym("inst", None, None, ("enum", owner), 1, 1)
            member.cls, member.member = owner, True
            return member
        resolved = _defined(owner, name)
        if isinstance(resolved, type) and _is_allowed_class(resolved, self.allowed):
            return _Sym("class", resolved, None, resolved, 1, 0)
        _refuse(f"the pickle reads {key!r}, which is not an allowed nested class or enum member. " + _how_to_allow(key))

    def reconstruct(self, args: list[_Sym]) -> _Sym:
        """``copyreg._reconstructor(cls, base, state)``: ``base.__new__(cls, state)``, ``base.__init__``."""
        if len(args) != 3 or args[0].kind != "class" or args[1].kind != "class":
            _refuse("the pickle calls copyreg._reconstructor without two allowed classes")
        cls, base, state = args[0].value, args[1].value, args[2]
        if base not in _TYPE_MRO(cls) or (base is not object and base.__flags__ & _HEAPTYPE):
            _refuse(
                f"the pickle calls copyreg._reconstructor({_key_of(cls)}, {_key_of(base)}): the base "
                f"must be object or a built-in base of the class"
            )
        if issubclass(cls, type):
            _refuse("the pickle creates a class through copyreg._reconstructor")
        if _defined(cls, "__new__") is not _defined(base, "__new__"):
            _refuse(f"the pickle calls copyreg._reconstructor to bypass {_key_of(cls)}.__new__ (an enum's lookup, ...)")
        if base is object:
            if state is not _NONE:
                _refuse("the pickle calls copyreg._reconstructor with object and a state")
            return self.instance(cls, [], evaluate=False)
        self.arguments(base, [state], "copyreg._reconstructor")
        return self.instance(cls, [state], evaluate=False)

    def new_object(self, cls_sym: _Sym, args_sym: _Sym, kwargs_sym: _Sym | None) -> _Sym:
        """NEWOBJ / NEWOBJ_EX: ``cls.__new__(cls, *args, **kwargs)``."""
        if cls_sym.kind != "class":
            _refuse(f"the pickle creates an object of a {cls_sym.kind}, not of an allowed class")
        if args_sym.kind != "tuple":
            _refuse("the pickle creates an object with arguments that are not a tuple")
        cls = cls_sym.value
        args = list(args_sym.items or [])
        if kwargs_sym is not None:
            if kwargs_sym.kind != "dict":
                _refuse("the pickle creates an object with keyword arguments that are not a dict")
            items = kwargs_sym.items or []
            if any(k.kind != "lit" or type(k.value) is not str for k in items[0::2]):
                _refuse("the pickle creates an object with a keyword that is not a string")
            args += items[1::2]
        self.arguments(cls, args, "__new__")
        info = self.info(cls)
        if args and not info.builtin:
            self.expansion(info.key, args)
        return self.instance(cls, args, evaluate=kwargs_sym is None and cls in (int, float, complex))

    # -- BUILD and container updates --

    def state_keys(self, info: _ClassInfo, state: _Sym, dunder_ok: frozenset[str], attributes: bool) -> None:
        """A state dict's keys: literal strings, no dunder names beyond ``dunder_ok`` and, when they
        are set as attributes, no data descriptor (a property setter) other than a slot."""
        if state is _NONE:
            return
        if state.kind != "dict":
            _refuse(f"the pickle restores {info.key} from a {state.kind} where a dict is expected")
        state.sealed = True
        for key in (state.items or [])[0::2]:
            name = key.value
            if key.kind != "lit" or type(name) is not str:
                _refuse(f"the pickle restores {info.key} with an attribute name that is not a string")
            if name[:2] == "__" and name[-2:] == "__" and name not in dunder_ok:
                _refuse(f"the pickle sets the special attribute {name!r} of {info.key}")
            if attributes and name in info.descriptors:
                _refuse(f"the pickle sets {name!r} of {info.key}, which runs a descriptor (a property)")

    def build(self, inst: _Sym, state: _Sym) -> None:
        self.as_value(state)
        if inst.kind != "inst" or inst.member or inst.built:
            _refuse("the pickle restores the state of something that is not a new object of an allowed class")
        if inst.used and inst.stand is _OPAQUE:
            _refuse(f"the pickle restores a hashable {_key_of(inst.cls)} after using it")
        inst.built = True
        info = self.info(inst.cls)
        if state.kind == "inst" and state.cls is range:
            _refuse("the pickle restores an object from a range")
        if info.lookup_runs_code:
            _refuse(f"the pickle restores {info.key}, whose attribute lookup runs code")
        pair = state.kind == "tuple" and state.items is not None and len(state.items) == 2
        if info.setstate == "pydantic":
            self.state_keys(info, state, _PYDANTIC_STATE_KEYS, False)
            items = state.items or []
            for key, value in zip(items[0::2], items[1::2]):
                if key.value in ("__dict__", "__pydantic_private__", "__pydantic_extra__") and value is not _NONE:
                    self.state_keys(info, value, _NO_KEYS, False)
        elif info.setstate:
            dunder_ok = _EXCEPTION_STATE_KEYS if issubclass(inst.cls, BaseException) else _NO_KEYS
            for part in state.items if pair else [state]:  # type: ignore[union-attr]
                if part.kind == "dict":
                    self.state_keys(info, part, dunder_ok, True)
        elif pair:
            assert state.items is not None
            self.state_keys(info, state.items[0], _NO_KEYS, False)
            self.state_keys(info, state.items[1], _NO_KEYS, True)
        else:
            self.state_keys(info, state, _NO_KEYS, False)
        inst.depth = max(inst.depth, 1 + state.depth)
        if inst.depth > _MAX_NESTING:
            _refuse(f"the pickle nests deeper than {_MAX_NESTING} levels")
        if inst.stand is _OPAQUE:
            inst.work = min(_SATURATE, inst.work + state.work)
        if inst.items is not None:
            inst.items.append(state)
        if inst.cls is uuid.UUID and state.kind == "dict":
            items = state.items or []
            for key, value in zip(items[0::2], items[1::2]):
                if key.value == "int" and value.kind == "lit" and type(value.value) is int:
                    inst.stand, inst.work = value.value, value.work  # hash(UUID) is hash(UUID.int)

    def update(self, base: type, items: list[_Sym]) -> _Sym:
        """APPEND(S) / SETITEM(S) / ADDITEMS: the target must be a ``base`` (for ``list``: or a deque)."""
        target = self.top()
        if target.kind != _UPDATED_KINDS[base] and not (
            target.kind == "inst"
            and not target.member
            and (issubclass(target.cls, base) or (base is list and issubclass(target.cls, collections.deque)))
        ):
            _refuse(f"the pickle updates a {target.kind} as if it were a {base.__name__}")
        if target.sealed or (target.used and target.stand is _OPAQUE):
            _refuse(f"the pickle updates a {base.__name__} after using it")
        work = target.work
        depth = target.depth
        for item in items:
            if item.kind == "special":
                self.as_value(item)
            item.used = True
            work += item.work
            if item.depth >= depth:
                depth = item.depth + 1
        if depth > _MAX_NESTING:
            _refuse(f"the pickle nests deeper than {_MAX_NESTING} levels")
        target.work, target.depth = min(_SATURATE, work), depth
        if target.items is not None:
            target.items.extend(items)
        return target

    def container(self, kind: str, items: list[_Sym]) -> _Sym:
        work, depth = 1, 0
        for item in items:
            if item.kind == "special":
                self.as_value(item)
            item.used = True
            work += item.work
            depth = max(depth, item.depth)
        sym = _Sym(kind, None, items, _UNHASHABLE, min(_SATURATE, work), depth + 1)
        if kind in ("tuple", "frozenset"):
            if kind == "frozenset":
                for item in items:
                    self.hashed(item)
                sym.work = 1 + len(items)  # hashed from its members' stored hashes
            stands = [i.stand for i in items]
            if any(s is _UNHASHABLE for s in stands):
                sym.stand = _UNHASHABLE
            elif any(s is _OPAQUE for s in stands):
                sym.stand = _OPAQUE
            else:
                sym.stand = tuple(stands) if kind == "tuple" else frozenset(stands)
        return sym

    # -- opcodes (each returns True at STOP) --

    def op_proto(self, arg: int, pos: int) -> None:
        self.proto = arg

    def op_frame(self, arg: int, pos: int) -> None:
        pass

    def op_stop(self, arg: None, pos: int) -> bool:
        self.as_value(self.pop())
        return True

    def op_literal(self, arg: Any, pos: int) -> None:
        self.stack.append(_lit(arg))

    def op_bytearray(self, arg: Any, pos: int) -> None:
        self.stack.append(_Sym("bytearray", None, None, _UNHASHABLE, 1, 0))

    def op_none(self, arg: None, pos: int) -> None:
        self.stack.append(_NONE)

    def op_true(self, arg: None, pos: int) -> None:
        self.stack.append(_TRUE)

    def op_false(self, arg: None, pos: int) -> None:
        self.stack.append(_FALSE)

    def op_empty_tuple(self, arg: None, pos: int) -> None:
        self.stack.append(self.container("tuple", []))

    def op_tuple1(self, arg: None, pos: int) -> None:
        self.push(self.container("tuple", [self.pop()]))

    def op_tuple2(self, arg: None, pos: int) -> None:
        second = self.pop()
        self.push(self.container("tuple", [self.pop(), second]))

    def op_tuple3(self, arg: None, pos: int) -> None:
        third, second = self.pop(), self.pop()
        self.push(self.container("tuple", [self.pop(), second, third]))

    def op_tuple(self, arg: None, pos: int) -> None:
        self.push(self.container("tuple", self.pop_mark()))

    def op_empty_list(self, arg: None, pos: int) -> None:
        self.stack.append(_Sym("list", None, [], _UNHASHABLE, 1, 1))

    def op_list(self, arg: None, pos: int) -> None:
        self.push(self.container("list", self.pop_mark()))

    def op_empty_dict(self, arg: None, pos: int) -> None:
        self.stack.append(_Sym("dict", None, [], _UNHASHABLE, 1, 1))

    def op_dict(self, arg: None, pos: int) -> None:
        items = self.pop_mark()
        if len(items) % 2:
            _refuse("the pickle builds a dict from an odd number of items")
        for key in items[0::2]:
            self.hashed(key)
        self.push(self.container("dict", items))

    def op_empty_set(self, arg: None, pos: int) -> None:
        self.stack.append(_Sym("set", None, [], _UNHASHABLE, 1, 1))

    def op_frozenset(self, arg: None, pos: int) -> None:
        self.push(self.container("frozenset", self.pop_mark()))

    def op_append(self, arg: None, pos: int) -> None:
        item = self.pop()
        self.update(list, [item])

    def op_appends(self, arg: None, pos: int) -> None:
        self.update(list, self.pop_mark())

    def op_setitem(self, arg: None, pos: int) -> None:
        value = self.pop()
        self.setitems([self.pop(), value])

    def op_setitems(self, arg: None, pos: int) -> None:
        self.setitems(self.pop_mark())

    def setitems(self, items: list[_Sym]) -> None:
        if len(items) % 2:
            _refuse("the pickle sets an odd number of dict items")
        self.update(dict, items)
        for key in items[0::2]:
            self.hashed(key)

    def op_additems(self, arg: None, pos: int) -> None:
        items = self.pop_mark()
        self.update(set, items)
        for item in items:
            self.hashed(item)

    def op_mark(self, arg: None, pos: int) -> None:
        self.metastack.append(self.stack)
        self.stack = []

    def op_pop(self, arg: None, pos: int) -> None:
        if self.stack:
            self.stack.pop()
        else:
            self.pop_mark()

    def op_pop_mark(self, arg: None, pos: int) -> None:
        self.pop_mark()

    def op_dup(self, arg: None, pos: int) -> None:
        self.stack.append(self.top())

    def op_get(self, arg: int, pos: int) -> None:
        try:
            self.stack.append(self.memo[arg])
        except KeyError:
            _refuse("the pickle reads a memo slot it never wrote")

    def op_put(self, arg: int, pos: int) -> None:
        # The pickler numbers memo slots 0, 1, 2, ...; the C unpickler allocates (and zeroes) a memo
        # array up to twice the slot written, so a 9-byte pickle naming slot 2**27 costs 2 GiB.
        if not 0 <= arg <= len(self.memo):
            _refuse(f"the pickle writes memo slot {arg}, out of sequence (that would allocate as many slots)")
        self.memo[arg] = self.top()

    def op_memoize(self, arg: None, pos: int) -> None:
        if not self.stack:
            _refuse("the pickle memoizes an empty stack")
        self.memo[len(self.memo)] = self.stack[-1]

    def op_global(self, arg: str, pos: int) -> None:
        # The two lines as the C unpickler reads them (UTF-8, no escapes), not as pickletools shows them.
        lines = self.data[pos + 1 :].split(b"\n", 2)
        try:
            module, name = lines[0].decode("utf-8"), lines[1].decode("utf-8")
        except (IndexError, UnicodeDecodeError):
            _refuse("the pickle names a global that is not UTF-8")
        self.push(self.find_class(module, name))

    def op_stack_global(self, arg: None, pos: int) -> None:
        name, module = self.pop(), self.pop()
        if module.kind != "lit" or type(module.value) is not str or name.kind != "lit" or type(name.value) is not str:
            _refuse("the pickle names a global through operands that are not literal strings")
        self.push(self.find_class(module.value, name.value))

    def find_class(self, module: str, name: str) -> _Sym:
        key = (module, name, self.proto)
        found = self.limits.globals.get(key)
        if found is None:
            found = self.limits.globals[key] = _resolve_global(module, name, self.proto, self.allowed)
        return found

    def op_reduce(self, arg: None, pos: int) -> None:
        args = self.pop()
        self.push(self.call(self.pop(), args))

    def op_newobj(self, arg: None, pos: int) -> None:
        args = self.pop()
        self.push(self.new_object(self.pop(), args, None))

    def op_newobj_ex(self, arg: None, pos: int) -> None:
        kwargs, args = self.pop(), self.pop()
        self.push(self.new_object(self.pop(), args, kwargs))

    def op_build(self, arg: None, pos: int) -> None:
        state = self.pop()
        self.build(self.top(), state)


_UPDATED_KINDS: dict[type, str] = {list: "list", dict: "dict", set: "set"}
_OPCODES = {opcode.name: opcode for opcode in pickletools.opcodes}
_CODE2OP = {ord(opcode.code): opcode for opcode in pickletools.opcodes}
_NO_ARGUMENT = frozenset(code for code, opcode in _CODE2OP.items() if opcode.arg is None)
_ONE_BYTE_ARGUMENT = frozenset(ord(_OPCODES[name].code) for name in ("PROTO", "BININT1", "BINGET", "BINPUT"))
_SHORT_BINUNICODE = ord(_OPCODES["SHORT_BINUNICODE"].code)
_MEMOIZE = ord(_OPCODES["MEMOIZE"].code)
_NONE_CODE = ord(_OPCODES["NONE"].code)
_STOP_CODE = ord(_OPCODES["STOP"].code)


def _opcodes(data: bytes) -> Iterator[tuple[int, Any, int]]:
    """``(opcode byte, argument, position)`` of each opcode up to STOP, as ``pickletools.genops`` reads
    them (and the unpickler: one linear stream): the most frequent argument formats are read here,
    every other with pickletools' own reader. Malformed data raises ``ValueError``."""
    end = len(data)
    stream: io.BytesIO | None = None
    i = 0
    while i < end:
        pos, code = i, data[i]
        i += 1
        if code in _NO_ARGUMENT:
            yield code, None, pos
            if code == _STOP_CODE:
                return
        elif code == _SHORT_BINUNICODE:
            stop = i + 1 + data[i] if i < end else end + 1
            if stop > end:
                raise ValueError(f"at position {pos}, a string runs past the end of the pickle")
            yield code, data[i + 1 : stop].decode("utf-8", "surrogatepass"), pos
            i = stop
        elif code in _ONE_BYTE_ARGUMENT:
            if i >= end:
                raise ValueError(f"at position {pos}, an argument runs past the end of the pickle")
            yield code, data[i], pos
            i += 1
        else:
            opcode = _CODE2OP.get(code)
            if opcode is None or opcode.arg is None:
                raise ValueError(f"at position {pos}, opcode {bytes([code])!r} unknown")
            if stream is None:
                stream = io.BytesIO(data)
            stream.seek(i)
            arg = opcode.arg.reader(stream)
            i = stream.tell()
            yield code, arg, pos
    raise ValueError("pickle exhausted before seeing STOP")

#: Opcode -> check. Any opcode missing here (INST, OBJ: legacy calls; EXT1/2/4: copyreg extension
#: codes; PERSID/BINPERSID: persistent ids; NEXT_BUFFER/READONLY_BUFFER: out-of-band buffers) is refused.
_HANDLERS: dict[int, Any] = {
    ord(_OPCODES[name].code): handler
    for names, handler in [
        (("PROTO",), _PickleCheck.op_proto),
        (("FRAME",), _PickleCheck.op_frame),
        (("STOP",), _PickleCheck.op_stop),
        (
            (
                "INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4", "FLOAT", "BINFLOAT",
                "UNICODE", "SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "BINBYTES", "SHORT_BINBYTES",
                "BINBYTES8", "STRING", "BINSTRING", "SHORT_BINSTRING",
            ),
            _PickleCheck.op_literal,
        ),
        (("BYTEARRAY8",), _PickleCheck.op_bytearray),
        (("NONE",), _PickleCheck.op_none),
        (("NEWTRUE",), _PickleCheck.op_true),
        (("NEWFALSE",), _PickleCheck.op_false),
        (("EMPTY_TUPLE",), _PickleCheck.op_empty_tuple),
        (("TUPLE1",), _PickleCheck.op_tuple1),
        (("TUPLE2",), _PickleCheck.op_tuple2),
        (("TUPLE3",), _PickleCheck.op_tuple3),
        (("TUPLE",), _PickleCheck.op_tuple),
        (("EMPTY_LIST",), _PickleCheck.op_empty_list),
        (("LIST",), _PickleCheck.op_list),
        (("EMPTY_DICT",), _PickleCheck.op_empty_dict),
        (("DICT",), _PickleCheck.op_dict),
        (("EMPTY_SET",), _PickleCheck.op_empty_set),
        (("FROZENSET",), _PickleCheck.op_frozenset),
        (("APPEND",), _PickleCheck.op_append),
        (("APPENDS",), _PickleCheck.op_appends),
        (("SETITEM",), _PickleCheck.op_setitem),
        (("SETITEMS",), _PickleCheck.op_setitems),
        (("ADDITEMS",), _PickleCheck.op_additems),
        (("MARK",), _PickleCheck.op_mark),
        (("POP",), _PickleCheck.op_pop),
        (("POP_MARK",), _PickleCheck.op_pop_mark),
        (("DUP",), _PickleCheck.op_dup),
        (("GET", "BINGET", "LONG_BINGET"), _PickleCheck.op_get),
        (("PUT", "BINPUT", "LONG_BINPUT"), _PickleCheck.op_put),
        (("MEMOIZE",), _PickleCheck.op_memoize),
        (("GLOBAL",), _PickleCheck.op_global),
        (("STACK_GLOBAL",), _PickleCheck.op_stack_global),
        (("REDUCE",), _PickleCheck.op_reduce),
        (("NEWOBJ",), _PickleCheck.op_newobj),
        (("NEWOBJ_EX",), _PickleCheck.op_newobj_ex),
        (("BUILD",), _PickleCheck.op_build),
    ]
    for name in names
}


def _pickled_leaves(value: Any) -> Iterator[Any]:
    """Every value ``decode_checkpoint_value`` would unpickle, found as its ``_decode`` finds them."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            if _PICKLE_MARKER in item and _TYPE_MARKER in item:
                yield item[_PICKLE_MARKER]
            else:
                pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)


def _unbase64(encoded: Any) -> bytes:
    """A pickled leaf's bytes, decoded as ``_base64_to_unpickle`` decodes them."""
    if not isinstance(encoded, str):
        _refuse("a pickled value is not a base64 string")
    try:
        return base64.b64decode(encoded.encode("ascii"), validate=True)
    except (UnicodeEncodeError, binascii.Error) as exc:
        _refuse(f"a pickled value is not valid base64 ({exc})")


def _check_pickles(parsed: Any, allowed: frozenset[str]) -> None:
    """Run every pickled leaf of ``parsed`` through :class:`_PickleCheck`, under one set of limits."""
    pickles = [_unbase64(encoded) for encoded in _pickled_leaves(parsed)]
    limits = _Limits(sum(map(len, pickles)))
    for data in pickles:
        _PickleCheck(data, allowed, limits).run()


def _restricted_decode(parsed: Any, allowed_types: frozenset[str]) -> Any:
    """``decode_checkpoint_value(parsed)`` once every pickled leaf has passed :class:`_PickleCheck`."""
    _check_pickles(parsed, allowed_types | frozenset(_REGISTERED_CHECKPOINT_TYPE_KEYS))
    return decode_checkpoint_value(parsed, allowed_types=allowed_types)
