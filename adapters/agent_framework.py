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

import hashlib
import json
import logging
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

# The framework's own checkpoint types (WorkflowMessage, its events, Message / Content) are
# imported here, by code, so that a process that has not built a workflow yet can load a
# checkpoint holding them: loading never imports a module named in stored data.
from agent_framework import WorkflowCheckpoint, WorkflowCheckpointException
from agent_framework._workflows._checkpoint_encoding import (
    encode_checkpoint_value,
)

from checkpointers.backends import Backend, open_backend
from checkpointers.backends.base import ListQuery, Mode, Put, Record
from checkpointers.errors import (
    CheckpointerError,
    CorruptItemError,
    InvalidNameError,
    IsolationError,
)
from checkpointers.flows import Flow, GetOp, ListOp, arun, delete_present_flow, new_etag, raise_conflict, run
from checkpointers.integrity import Integrity, IntegrityKeys
from checkpointers.leases import Clock, HeldLease, LeaseInfo, LeaseRegistry, expired_listed_flow, listed_site
from checkpointers.names import (
    ANONYMOUS_USER,
    DEFAULT_MAX_ITEM_BYTES,
    MAX_TAG_VALUE_LENGTH,
    Partition,
    check_size,
    check_tags,
    encode_component,
    validate_user,
)

from ._pickle_guard import restricted_decode

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
        clock: the wall clock of run leases (:meth:`lease`; default ``time.time``).
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
        clock: Clock = time.time,
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
        #: The run lease this storage holds (one at a time), which fences every save.
        self.leases = LeaseRegistry(self.backend, clock, "allow", None)

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
            clock=self.leases.clock,
        )

    # -- run leases ----------------------------------------------------------

    def lease(self, run_id: str, *, owner: str, ttl: float) -> HeldLease:
        """Hold workflow run ``run_id``'s lease for an ``async with`` (or ``with``) block.

        Entering acquires it (:class:`~checkpointers.errors.LeaseHeldError`
        while another owner holds it: call this before ``workflow.run`` so no
        executor runs); inside, every ``save`` of this storage object is
        fenced with it (:class:`~checkpointers.errors.LeaseLostError` once
        another process took the run over: nothing is written; the framework
        logs the refused save and :meth:`raise_if_refused` raises it). It is
        renewed every ``ttl / 3`` in the background and released on exit. The
        framework gives a checkpoint no run id, so one storage object holds
        one run lease at a time (a second block: ``LeaseHeldError``); use a
        storage per concurrent run (:meth:`for_user`), and pass the same
        ``run_id`` on resume. Saves outside a lease block are not checked::

            async with storage.lease("order-42", owner="worker-7", ttl=30):
                await workflow.run(checkpoint_id=latest.checkpoint_id)
        """
        if not isinstance(run_id, str) or not run_id:
            raise InvalidNameError("run id", run_id, "must be a non-empty string")
        from .agent_framework_effects import LEASE_PREFIX

        return HeldLease(self.leases, listed_site(self.integrity, self.partition, LEASE_PREFIX, run_id), owner, ttl)

    def _expired_flow(self, limit: int | None) -> Flow[list[LeaseInfo]]:
        from .agent_framework_effects import LEASE_PREFIX

        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
            raise ValueError(f"limit must be None or an int >= 0, got {limit!r}")
        n = sys.maxsize if limit is None else limit
        return expired_listed_flow(self.integrity, self.partition, LEASE_PREFIX, n, self.leases.clock)

    def expired_leases(self, *, limit: int | None = 100) -> list[LeaseInfo]:
        """This user's workflow runs whose lease expired without release (``scope`` is the run id).

        For recovery: reclaim one with :meth:`lease` and resume it from
        ``get_latest``. One listing of the user's lease records.
        """
        return run(self._expired_flow(limit), self.backend)

    async def aexpired_leases(self, *, limit: int | None = 100) -> list[LeaseInfo]:
        """Async :meth:`expired_leases`."""
        return await arun(self._expired_flow(limit), self.backend)

    def effect(self, run_id: str, executor_id: str, name: str, **kw: Any) -> Any:
        """A journaled side effect of an executor: see :func:`adapters.agent_framework_effects.storage_effect`."""
        from .agent_framework_effects import storage_effect

        return storage_effect(self, run_id, executor_id, name, **kw)

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
        result = yield from self.leases.write_flow(self.partition, [put], ())
        raise_conflict(result, [put], (), [checkpoint.checkpoint_id])
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
            restricted_decode(_parse(data), self.allowed_checkpoint_types)
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
            decoded = restricted_decode(parsed, self.allowed_checkpoint_types)
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
