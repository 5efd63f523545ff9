"""Drop-in LangGraph checkpointers over any backend, sync and async.

One class, :class:`Checkpointer`, works over every
:class:`~checkpointers.backends.Backend`; the named subclasses only open
their backend. Every operation is a flow of the saver's record layout
(:class:`~checkpointers._saver_flows.CheckpointLayout`, which it holds)
driven by the backend's sync methods in ``get_tuple``/``put``/... and by its
async methods in ``aget_tuple``/``aput``/..., so a sync call never bridges to
an event loop (no deadlock inside a loop's thread) and an async call never
blocks the loop.

>>> from langgraph.graph import StateGraph
>>> from checkpointers.savers import MemoryCheckpointer
>>> builder = StateGraph(int)
>>> _ = builder.add_node("inc", lambda x: x + 1)
>>> _ = builder.set_entry_point("inc")
>>> graph = builder.compile(checkpointer=MemoryCheckpointer().for_user("alice"))
>>> graph.invoke(1, {"configurable": {"thread_id": "t1"}})
2
>>> graph.get_state({"configurable": {"thread_id": "t1"}}).values
2

**Users.** A view bound to a user (:meth:`Checkpointer.for_user`) is
authoritative: it serves that user only, and a config whose ``user_id`` names
anyone else raises :class:`~checkpointers.errors.IsolationError` before any
I/O (the same user is fine). Inside a :meth:`Checkpointer.acting_for` block
the same holds for the block's user. An unbound saver outside such a block
takes ``config["configurable"]["user_id"]``, else the anonymous user,
isolated like any other. With ``require_user=True`` a call without a user
raises :class:`~checkpointers.errors.IsolationError` before any I/O. Methods that take no config (``delete_thread``,
``copy_thread``, ``prune``, ``delete_for_runs``, ``list(None)``) use the bound
user: bind a view per user to manage their threads. LangGraph's
``get_state(subgraphs=True)`` reads subgraph checkpoints with configs that
carry only ``thread_id`` and ``checkpoint_ns``: compile with a bound view, or
wrap the call in ``with saver.acting_for(user_id):``.

**One writer per thread.** ``with saver.lease(thread_id, owner=..., ttl=...)``
(or ``async with``) holds the thread's lease (:mod:`checkpointers.leases`)
while a worker runs it: a second worker gets ``LeaseHeldError`` before any
node runs, and a worker that was paused past its ttl and taken over gets
``LeaseLostError`` on its next write, which lands nothing (the check is in the
write's own atomic backend operation). ``saver.expired_leases()`` lists the
user's abandoned threads for recovery. Writes outside a lease block to a
thread another worker holds are refused (``unleased="refuse"``: the write
carries that check in its own backend operation, except on S3, which reads the
lease record first; ``"allow"`` skips it). See :mod:`checkpointers._saver_leases`.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import random
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager, contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_metadata,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from ._flows import Flow, arun, drop, run
from ._integrity import Integrity, IntegrityKeys
from ._names import ANONYMOUS_USER, DEFAULT_MAX_ITEM_BYTES, Partition, validate_user
from ._saver_flows import SPACE, CheckpointLayout, LoadedCheckpoint, WriteMismatch, ckpt_name, writes_prefix
from ._saver_leases import HeldLease, LeaseRegistry, Unleased, check_unleased
from ._serde import AllowedTypes, SafeSerializer
from .backends import Backend, open_backend
from .backends.base import Delete, Put, WriteResult
from .backends.memory import MemoryBackend
from .errors import InvalidArgumentError, IsolationError
from .leases import Clock, LeaseInfo, LeaseSite, expired_flow

__all__ = [
    "Checkpointer",
    "MemoryCheckpointer",
    "RedisCheckpointer",
    "S3Checkpointer",
    "SqliteCheckpointer",
    "WriteMismatch",
    "default_serde",
]

#: Names of the saver's record layout, for tools and the conformance kit
#: (see :mod:`checkpointers._saver_flows`): the partition space of every
#: LangGraph thread, a checkpoint record's name, the prefix of its writes.
LANGGRAPH_SPACE = SPACE
checkpoint_record_name = ckpt_name
checkpoint_writes_prefix = writes_prefix
logger = logging.getLogger("checkpointers.savers")

_STRATEGIES = ("keep_latest", "delete")
_SAVER_OPTIONS = (
    "user",
    "require_user",
    "serde",
    "max_item_bytes",
    "allowed_msgpack_modules",
    "strict_decoding",
    "integrity_key",
    "accept_unsealed",
    "strict_writes",
    "on_write_mismatch",
    "unleased",
    "clock",
)
#: Partitions (with their encoded keys) kept per saver, by (user, thread id).
_PARTITION_CACHE_SIZE = 4096


def _split(options: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split keyword options into the saver's own and the backend's."""
    saver = {k: v for k, v in options.items() if k in _SAVER_OPTIONS}
    return saver, {k: v for k, v in options.items() if k not in _SAVER_OPTIONS}


def default_serde(allowed_msgpack_modules: AllowedTypes | None = None, *, strict: bool = False) -> SerializerProtocol:
    """LangGraph's msgpack format, no pickle; decoding rebuilds an allowlist of types only.

    See :class:`checkpointers._serde.SafeSerializer`: LangGraph's safe types,
    ``allowed_msgpack_modules`` and (unless ``strict``) the pydantic models,
    dataclasses, enums and named tuples of modules already imported; anything
    else is never imported or called (:class:`~checkpointers.errors.DisallowedTypeError`).
    """
    return SafeSerializer(allowed_msgpack_modules, strict=strict)


def _thread_key(thread_id: object) -> str:
    """A thread id as the saver keys it: a string (ints and UUIDs are accepted as LangGraph does)."""
    if isinstance(thread_id, str):
        return thread_id
    if thread_id is None:
        raise InvalidArgumentError(
            "configurable.thread_id", "the config has none; pass one to name the thread"
        )
    if isinstance(thread_id, bool) or not isinstance(thread_id, (int, uuid.UUID)):
        raise InvalidArgumentError(
            "configurable.thread_id", f"must be a str (or an int or UUID), got {type(thread_id).__name__}"
        )
    return str(thread_id)


def _text(argument: str, value: object, default: str | None = None) -> str:
    """A config or call value that must be a string (checkpoint ns, ids, task ids)."""
    if value is None and default is not None:
        return default
    if not isinstance(value, str):
        raise InvalidArgumentError(argument, f"must be a str, got {type(value).__name__} {value!r:.60}")
    return value


def _ns(conf: Mapping[str, Any]) -> str:
    """The config's checkpoint namespace (``""`` when it names none)."""
    ns = conf.get("checkpoint_ns")
    return ns if type(ns) is str else _text("configurable.checkpoint_ns", ns, "")


class _Counter:
    """A count shared by a saver and its views (``copy.copy`` shares the object)."""

    def __init__(self) -> None:
        self.value = 0
        self.lock = threading.Lock()

    def add(self) -> None:
        with self.lock:
            self.value += 1


class Checkpointer(BaseCheckpointSaver[str]):
    """A LangGraph checkpointer over any backend, isolated per user.

    Args:
        backend: where records live (memory, SQLite, Redis, S3, ...).
        user: bind this saver to a user (same as ``for_user(user)``).
        require_user: refuse calls that name no user (``IsolationError``).
        serde: serializer; defaults to :func:`default_serde`, LangGraph's
            msgpack format without pickle, decoding only allowed types. A
            serializer of your own is trusted as it is.
        allowed_msgpack_modules: types (classes or ``(module, name)`` pairs)
            the default serializer may rebuild besides LangGraph's safe ones.
        strict_decoding: the default serializer rebuilds only LangGraph's safe
            types and ``allowed_msgpack_modules``, not also the data classes
            (pydantic models, dataclasses, enums, named tuples) of modules the
            process has imported.
        max_item_bytes: cap on each stored record (a checkpoint without its
            channel values, one channel value, one write); over it raises
            ``ItemTooLargeError`` before anything is written.
        integrity_key: secret(s) for HMAC record seals (a list rotates: the
            first signs, all verify); default ``CHECKPOINTERS_INTEGRITY_KEY``.
            Without one, seals still bind each record to its user, thread and
            name. See :mod:`checkpointers._integrity`.
        accept_unsealed: read records without a trustworthy seal (written
            before 0.2); default: only when no key is set.
        strict_writes: raise :class:`~checkpointers.errors.StepMismatchError`
            when a task's recomputation re-writes one of its stored writes
            with a different value. Default ``False``: the stored write is
            kept and the mismatch reported (logged, counted in
            :attr:`write_mismatches`, passed to ``on_write_mismatch``), as
            LangGraph's runtime needs for ``update_state``, forks and resumes.
        on_write_mismatch: called with a :class:`WriteMismatch` for every
            re-written write whose value differs from the stored one.
        unleased: a write to a thread this saver holds no :meth:`lease` on:
            ``"refuse"`` (default) raises
            :class:`~checkpointers.errors.LeaseHeldError` while another owner
            holds it, checked inside the write itself (on S3: one read of the
            lease record more per ``put``/``put_writes``);
            ``"allow"`` writes without looking (leases are then advisory for
            writers outside a ``lease`` block).
        clock: the wall clock of leases (seconds since the epoch, default
            ``time.time``).

    Using it as a context manager (``with``/``async with``) closes the backend.
    """

    def __init__(
        self,
        backend: Backend,
        *,
        user: str | None = None,
        require_user: bool = False,
        serde: SerializerProtocol | None = None,
        max_item_bytes: int = DEFAULT_MAX_ITEM_BYTES,
        allowed_msgpack_modules: AllowedTypes | None = None,
        strict_decoding: bool = False,
        integrity_key: IntegrityKeys = None,
        accept_unsealed: bool | None = None,
        strict_writes: bool = False,
        on_write_mismatch: Callable[[WriteMismatch], None] | None = None,
        unleased: Unleased = "refuse",
        clock: Clock = time.time,
    ) -> None:
        if serde is not None and (allowed_msgpack_modules is not None or strict_decoding):
            raise InvalidArgumentError(
                "allowed_msgpack_modules",
                "it and strict_decoding apply to the default serializer; configure your serde= instead",
            )
        if isinstance(max_item_bytes, bool) or not isinstance(max_item_bytes, int) or max_item_bytes <= 0:
            raise InvalidArgumentError("max_item_bytes", f"must be a positive int, got {max_item_bytes!r}")
        chosen = serde or default_serde(allowed_msgpack_modules, strict=strict_decoding)
        integrity = Integrity(integrity_key, accept_unsealed=accept_unsealed)
        #: The record layout (serializer, size cap, seals, parent-channel cache) and its flows.
        #: The leases this saver (and its views) holds, by thread; every write goes through it.
        self.leases = LeaseRegistry(
            backend, clock, check_unleased(unleased), lambda p: LeaseSite(integrity, p, p.name)
        )
        self.layout = CheckpointLayout(chosen, max_item_bytes, integrity, writer=self.leases.write_flow)
        super().__init__(serde=chosen)  # sets self.serde (LangGraph wraps it): see the property
        self.backend = backend
        self.user = None if user is None else validate_user(user)
        self.require_user = require_user
        self.strict_writes = strict_writes
        self.on_write_mismatch = on_write_mismatch
        self._mismatches = _Counter()
        self._acting: ContextVar[str | None] = ContextVar(f"checkpointers_user_{id(self)}", default=None)
        self._partitions: dict[tuple[str, str], Partition] = {}

    # The layout's settings, as LangGraph and callers know them. Setting one
    # gives this saver (a view or a clone: ``with_allowlist`` sets ``serde``
    # on a copy) a layout of its own that still shares the parent-channel cache.

    @property
    def serde(self) -> SerializerProtocol:
        """The serializer of channel values, checkpoints and writes."""
        return self.layout.serde

    @serde.setter
    def serde(self, value: SerializerProtocol) -> None:
        self.layout = dataclasses.replace(self.layout, serde=value)

    @property
    def max_item_bytes(self) -> int:
        """The cap on each stored record (``ItemTooLargeError`` over it, before anything is written)."""
        return self.layout.max_item_bytes

    @max_item_bytes.setter
    def max_item_bytes(self, value: int) -> None:
        self.layout = dataclasses.replace(self.layout, max_item_bytes=value)

    @property
    def integrity(self) -> Integrity:
        """How records are sealed and checked (:class:`~checkpointers.Integrity`)."""
        return self.layout.integrity

    @property
    def write_mismatches(self) -> int:
        """How many re-written writes differed from the stored ones (kept) since this saver was made."""
        return self._mismatches.value

    def _report_mismatch(self, mismatch: WriteMismatch) -> None:
        """Log, count and pass on a re-write whose value differs from the stored one."""
        self._mismatches.add()
        log = logger.warning if mismatch.kind == "recomputation" else logger.info
        log(
            "kept the stored write %d of task %r at checkpoint %r (thread %r, namespace %r): "
            "a %s wrote %r (sha256 %s) over %r (sha256 %s)",
            mismatch.idx,
            mismatch.task_id,
            mismatch.checkpoint_id,
            mismatch.thread_id,
            mismatch.checkpoint_ns,
            mismatch.kind,
            mismatch.new_channel,
            mismatch.new_digest[:16],
            mismatch.stored_channel,
            mismatch.stored_digest[:16],
        )
        if self.on_write_mismatch is not None:
            self.on_write_mismatch(mismatch)

    @classmethod
    def from_url(cls, url: str, **options: Any) -> Checkpointer:
        """Open the backend ``url`` names (``memory://``, ``sqlite:///x.db``, ``redis://``, ``s3://``).

        The saver's own keywords (``user``, ``require_user``, ``serde``,
        ``max_item_bytes``, ``allowed_msgpack_modules``, ``strict_decoding``, ``integrity_key``,
        ``accept_unsealed``, ``strict_writes``, ``on_write_mismatch``) go to
        the saver, the others to the backend.
        """
        saver, backend = _split(options)
        return Checkpointer(open_backend(url, **backend), **saver)

    def for_user(self, user: str) -> Checkpointer:
        """A view bound to ``user`` that shares this saver's backend and connections."""
        view = copy.copy(self)
        view.user = validate_user(user)
        return view

    @contextmanager
    def acting_for(self, user: str) -> Iterator[Checkpointer]:
        """Within the block, calls of views bound to no user act for ``user``.

        The user is kept in a context variable of this saver (shared by its
        views), so it follows the code into tasks and threads started with a
        copy of the context and is gone after the block. Inside it, a config
        whose ``user_id`` names someone else raises ``IsolationError``, as
        with a bound view; a view bound to a user keeps its own user.
        """
        token = self._acting.set(validate_user(user))
        try:
            yield self
        finally:
            self._acting.reset(token)

    # -- who and where ------------------------------------------------------

    def _user(self, config: RunnableConfig | None) -> str:
        return self._user_of(self._conf(config) if config else None)

    def _user_of(self, conf: Mapping[str, Any] | None) -> str:
        """The user a call acts for, given its config's ``configurable`` section (see the module doc)."""
        configured = conf.get("user_id") if conf else None
        bound = self.user if self.user is not None else self._acting.get()
        if bound is not None:
            if configured is not None and configured != bound:
                raise IsolationError(
                    f"this checkpointer is bound to user {bound!r:.60}, and the config names user "
                    f"{configured!r:.60}: a bound view serves its own user only (nothing was read or "
                    f"written). Use for_user({configured!r:.60}) for that user, or drop user_id from the config."
                )
            return bound
        if configured is not None:
            return validate_user(configured)
        if self.require_user:
            raise IsolationError(
                "this checkpointer requires a user (require_user=True): put "
                "configurable.user_id in the config or call for_user(user_id)"
            )
        return ANONYMOUS_USER

    def _partition(self, config: RunnableConfig | None, thread_id: object) -> Partition:
        return self._partition_of(self._conf(config) if config else None, thread_id)

    def _where(self, config: RunnableConfig | None) -> tuple[Mapping[str, Any], Partition]:
        """The config's ``configurable`` section and its thread's partition (the config parsed once)."""
        found: Any = config.get("configurable") if type(config) is dict else None
        # Nearly every call: a non-empty dict, :meth:`_conf`'s first case without its call.
        conf: Mapping[str, Any] = found if type(found) is dict and found else self._conf(config)
        return conf, self._partition_of(conf, conf.get("thread_id"))

    def _partition_of(self, conf: Mapping[str, Any] | None, thread_id: object) -> Partition:
        thread = thread_id if type(thread_id) is str else _thread_key(thread_id)
        user = self._user_of(conf)
        # Every put, put_writes and read names the same few threads again: a
        # cached Partition keeps its encoded key, instead of percent-encoding
        # user, space and thread id into a new one each call (GIL-held CPU
        # that competes with the graph runtime). Shared by every view.
        cache = self._partitions
        found = cache.get((user, thread))
        if found is None:
            if len(cache) >= _PARTITION_CACHE_SIZE:
                cache.clear()  # a bound, not an LRU: threads come back cheaply
            found = cache[(user, thread)] = Partition(user, SPACE, thread)
        return found

    @staticmethod
    def _conf(config: RunnableConfig | None) -> Mapping[str, Any]:
        """The config's ``configurable`` section (read only: never modified)."""
        if config is None:
            return {}
        if type(config) is dict:  # nearly every call: no ABC check
            conf = config.get("configurable") or {}
            if type(conf) is dict:
                return conf
        if not isinstance(config, Mapping):
            raise InvalidArgumentError("config", f"must be a dict (a RunnableConfig), got {type(config).__name__}")
        conf = config.get("configurable") or {}
        if not isinstance(conf, Mapping):
            raise InvalidArgumentError("configurable", f"must be a dict, got {type(conf).__name__}")
        return conf

    @staticmethod
    def _tuple(found: LoadedCheckpoint, thread_id: object, user_id: object) -> CheckpointTuple:
        """The tuple LangGraph gets; its configs name ``user_id`` when the caller's config did."""
        conf: dict[str, Any] = {"thread_id": thread_id, "checkpoint_ns": found.ns, "checkpoint_id": found.cid}
        if user_id is not None:
            conf["user_id"] = user_id
        parent: RunnableConfig | None = None
        if found.parent:
            of_parent = conf.copy()
            of_parent["checkpoint_id"] = found.parent
            parent = {"configurable": of_parent}
        return CheckpointTuple({"configurable": conf}, found.checkpoint, found.metadata, parent, found.pending_writes)

    # -- flows per public call (built once, driven sync or async) ---------------
    # ``_put_flow`` and ``_put_writes_flow`` check their arguments when called
    # (inside ``put``/``aput``, before any I/O; the writes themselves are checked by
    # the layout flow's first pass, also before its first step) and return the
    # layout's flow itself.

    def _get_tuple_flow(self, config: RunnableConfig) -> Flow[CheckpointTuple | None]:
        conf, p = self._where(config)
        ns = _ns(conf)
        cid = conf.get("checkpoint_id")
        if cid is not None and type(cid) is not str:
            cid = _text("configurable.checkpoint_id", cid)
        found = yield from self.layout.get_flow(p, ns, cid)
        return None if found is None else self._tuple(found, conf["thread_id"], conf.get("user_id"))

    def _list_flow(
        self,
        config: RunnableConfig | None,
        filter: dict[str, Any] | None,
        before: RunnableConfig | None,
        limit: int | None,
    ) -> Flow[list[CheckpointTuple]]:
        conf = self._conf(config)
        user = self._user_of(conf)
        thread_id = conf.get("thread_id")
        parts = None if thread_id is None else [self._partition_of(conf, thread_id)]
        before_id = self._conf(before).get("checkpoint_id") if before else None
        if before_id is not None:
            before_id = _text("before.configurable.checkpoint_id", before_id)
        ns = conf.get("checkpoint_ns")
        if ns is not None:
            ns = _text("configurable.checkpoint_ns", ns)
        cid = conf.get("checkpoint_id")
        if cid is not None:
            cid = _text("configurable.checkpoint_id", cid)
        if filter is not None and not isinstance(filter, Mapping):
            raise InvalidArgumentError("filter", f"must be a dict or None, got {type(filter).__name__}")
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)):
            raise InvalidArgumentError("limit", f"must be None or an int, got {limit!r}")
        found = yield from self.layout.list_flow(parts, user, ns, cid, filter, before_id, limit)
        user_id = conf.get("user_id")
        return [self._tuple(f, f.thread if thread_id is None else thread_id, user_id) for f in found]

    def _put_flow(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> Flow[RunnableConfig]:
        conf, p = self._where(config)
        ns = conf.get("checkpoint_ns")
        if type(ns) is not str:  # nearly every call: a str, no call to check it
            ns = _ns(conf)
        parent = conf.get("checkpoint_id")
        if parent is not None and type(parent) is not str:
            parent = _text("configurable.checkpoint_id", parent)
        if type(checkpoint) is not dict and not isinstance(checkpoint, Mapping):
            raise InvalidArgumentError("checkpoint", f"must be a dict, got {type(checkpoint).__name__}")
        if type(checkpoint.get("id")) is not str:
            _text("checkpoint['id']", checkpoint.get("id"))
        merged = get_checkpoint_metadata(config, metadata)
        out: dict[str, Any] = {"thread_id": conf["thread_id"], "checkpoint_ns": ns, "checkpoint_id": checkpoint["id"]}
        if conf.get("user_id") is not None:
            out["user_id"] = conf["user_id"]
        done: RunnableConfig = {"configurable": out}
        return self.layout.put_flow(p, ns, parent, checkpoint, merged, new_versions, done)

    def _put_writes_flow(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str
    ) -> Flow[None]:
        conf, p = self._where(config)
        ns = conf.get("checkpoint_ns")
        if type(ns) is not str:  # nearly every call: a str, no call to check it
            ns = _ns(conf)
        cid = conf.get("checkpoint_id")
        if cid is None:
            raise InvalidArgumentError(
                "configurable.checkpoint_id", "put_writes needs the id of the checkpoint the writes belong to"
            )
        if type(cid) is not str:  # nearly every call: str ids, no call to check them
            cid = _text("configurable.checkpoint_id", cid)
        if type(task_id) is not str:
            task_id = _text("task_id", task_id)
        if type(task_path) is not str:
            task_path = _text("task_path", task_path, "")
        # Each write is checked to be a (channel, value) pair by the flow's first pass over
        # them (``split_writes``), before its first step: one loop over the writes, not two.
        return self.layout.put_writes_flow(p, ns, cid, writes, task_id, task_path, self)

    def _delete_thread_flow(self, thread_id: str) -> Flow[None]:
        p = self._partition(None, thread_id)
        yield from drop(p)
        self.layout.parents.forget(p)

    def _copy_thread_flow(self, source_thread_id: str, target_thread_id: str) -> Flow[None]:
        src, dst = self._partition(None, source_thread_id), self._partition(None, target_thread_id)
        yield from self.layout.copy_flow(src, dst)

    def _prune_flow(self, thread_ids: Sequence[str], strategy: str) -> Flow[None]:
        if strategy not in _STRATEGIES:
            raise ValueError(f"unknown prune strategy {strategy!r}: use 'keep_latest' or 'delete'")
        if isinstance(thread_ids, (str, bytes)):
            raise InvalidArgumentError("thread_ids", "must be a list of thread ids, not one string")
        parts = [self._partition(None, t) for t in thread_ids]
        for p in parts:
            if strategy == "delete":
                yield from drop(p)
                self.layout.parents.forget(p)
            else:
                yield from self.layout.prune_flow(p)

    def _delete_for_runs_flow(self, run_ids: Sequence[str]) -> Flow[None]:
        if isinstance(run_ids, (str, bytes)):
            raise InvalidArgumentError("run_ids", "must be a list of run ids, not one string")
        user = self._user(None)
        yield from self.layout.delete_runs_flow(user, run_ids)
        self.layout.parents.clear()

    # -- leases (one writer per thread; see checkpointers._saver_leases) ------------

    def fenced_write_flow(self, p: Partition, puts: Sequence[Put], deletes: Sequence[Delete]) -> Flow[WriteResult]:
        """One atomic batch of thread partition ``p``, fenced by the lease this saver holds on it, if any.

        Without one, the ``unleased`` policy applies. Every write of the saver
        goes through here (its layout's writer), and so can a helper's own
        records in the thread (the effects journal).
        """
        return self.leases.write_flow(p, puts, deletes)

    def lease(self, thread_id: str, *, owner: str, ttl: float, config: RunnableConfig | None = None) -> HeldLease:
        """Hold thread ``thread_id``'s lease for a ``with`` (or ``async with``) block.

        Entering acquires it (:class:`~checkpointers.errors.LeaseHeldError`
        while another owner holds it, before anything of the graph runs, also
        for a second block of this saver on the same thread); inside, every
        ``put``/``put_writes`` of the thread by this saver or its views, on any
        thread, is fenced with it: once someone else took the thread over it
        raises :class:`~checkpointers.errors.LeaseLostError` and writes
        nothing. It is renewed every ``ttl / 3`` in the background and
        released on exit. The thread's user is the bound one (or
        ``config``'s ``user_id``)::

            with saver.lease("t1", owner="worker-7", ttl=30) as held:
                graph.invoke(None, {"configurable": {"thread_id": "t1"}})
        """
        p = self._partition(config, thread_id)
        return HeldLease(self.leases, LeaseSite(self.integrity, p, p.name), owner, ttl)

    alease = lease

    def _expired_flow(self, limit: int | None, config: RunnableConfig | None) -> Flow[list[LeaseInfo]]:
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
            raise InvalidArgumentError("limit", f"must be None or an int >= 0, got {limit!r}")
        user = self._user(config)
        return expired_flow(self.integrity, user, SPACE, sys.maxsize if limit is None else limit, self.leases.clock)

    def expired_leases(self, *, limit: int | None = 100, config: RunnableConfig | None = None) -> list[LeaseInfo]:
        """The user's threads whose lease expired without release (``scope`` is the thread id), for recovery.

        A starting worker reclaims one with :meth:`lease` (it succeeds after the
        expiry, with a higher token) and resumes it (``graph.invoke(None, ...)``).
        Only the bound user's (or ``config``'s) threads are listed.
        """
        return run(self._expired_flow(limit, config), self.backend)

    async def aexpired_leases(
        self, *, limit: int | None = 100, config: RunnableConfig | None = None
    ) -> list[LeaseInfo]:
        """Async :meth:`expired_leases`."""
        return await arun(self._expired_flow(limit, config), self.backend)

    def effect(self, config: RunnableConfig, name: str, **kw: Any) -> Any:
        """A journaled side effect of the thread ``config`` names: see :func:`checkpointers.effects.saver_effect`."""
        from .effects import saver_effect

        return saver_effect(self, config, name, **kw)

    # -- sync API ---------------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint ``config`` names, or the latest of its thread and namespace."""
        return run(self._get_tuple_flow(config), self.backend)

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """Checkpoints newest first; ``config=None`` lists every thread of the user.

        ``filter`` matches metadata keys by equality (any key, nested values
        included); ``before`` keeps checkpoints older than its checkpoint id.
        """
        yield from run(self._list_flow(config, filter, before, limit), self.backend)

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store a checkpoint; return a config naming it with the caller's thread id."""
        return run(self._put_flow(config, checkpoint, metadata, new_versions), self.backend)

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Store a task's writes atomically; regular writes are append-only.

        A regular write whose (checkpoint, task, idx) is stored already keeps
        the stored value, as in LangGraph's own savers (the runtime re-writes
        them in ``update_state``, forks and resumes); a *different* value is
        reported (logged, counted, ``on_write_mismatch``) and, with
        ``strict_writes=True`` and a task path (a recomputation), raised as
        :class:`~checkpointers.errors.StepMismatchError`. Special writes
        (errors, interrupts, resumes) are last-writer-wins.
        """
        run(self._put_writes_flow(config, writes, task_id, task_path), self.backend)

    def delete_thread(self, thread_id: str) -> None:
        """Delete a thread of the bound user: checkpoints, writes and blobs."""
        run(self._delete_thread_flow(thread_id), self.backend)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint and write of a thread to another thread of the same user."""
        run(self._copy_thread_flow(source_thread_id, target_thread_id), self.backend)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """``keep_latest``: keep the newest checkpoint per namespace; ``delete``: drop the threads.

        Blobs that no remaining checkpoint references are deleted too. Each
        thread is pruned in one atomic batch.
        """
        run(self._prune_flow(thread_ids, strategy), self.backend)

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the bound user's checkpoints whose metadata ``run_id`` is in ``run_ids``."""
        run(self._delete_for_runs_flow(run_ids), self.backend)

    def get_next_version(self, current: str | int | None, channel: None = None) -> str:
        """A monotonic string version, unique across forks (InMemorySaver's scheme)."""
        if current is None:
            n = 0
        elif isinstance(current, int):
            n = current
        else:
            n = int(str(current).split(".")[0])
        return f"{n + 1:032}.{random.random():016}"

    # -- async API: the same flows, driven by the backend's async methods --------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """Async :meth:`get_tuple`."""
        return await arun(self._get_tuple_flow(config), self.backend)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """Async :meth:`list`."""
        for item in await arun(self._list_flow(config, filter, before, limit), self.backend):
            yield item

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Async :meth:`put`."""
        return await arun(self._put_flow(config, checkpoint, metadata, new_versions), self.backend)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Async :meth:`put_writes`."""
        await arun(self._put_writes_flow(config, writes, task_id, task_path), self.backend)

    async def adelete_thread(self, thread_id: str) -> None:
        """Async :meth:`delete_thread`."""
        await arun(self._delete_thread_flow(thread_id), self.backend)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Async :meth:`copy_thread`."""
        await arun(self._copy_thread_flow(source_thread_id, target_thread_id), self.backend)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Async :meth:`prune`."""
        await arun(self._prune_flow(thread_ids, strategy), self.backend)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Async :meth:`delete_for_runs`."""
        await arun(self._delete_for_runs_flow(run_ids), self.backend)

    # -- lifecycle ------------------------------------------------------------------

    def close(self) -> None:
        """Close the backend (shared by every ``for_user`` view)."""
        self.backend.close()

    async def aclose(self) -> None:
        """Async :meth:`close`."""
        await self.backend.aclose()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Checkpointer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class MemoryCheckpointer(Checkpointer):
    """A checkpointer over an in-process :class:`MemoryBackend` (tests, quick starts).

    The saver's keywords go to the saver, the others (``ttl``, ``refresh_on_read``) to the backend.
    """

    def __init__(self, **options: Any) -> None:
        saver, backend_options = _split(options)
        super().__init__(MemoryBackend(**backend_options), **saver)


class SqliteCheckpointer(Checkpointer):
    """A checkpointer over one SQLite file (WAL; several processes may share it).

    ``SqliteCheckpointer.from_conn_string(path)`` works like LangGraph's
    ``SqliteSaver.from_conn_string``, with both ``with`` and ``async with``.
    The saver's keywords go to the saver, the others (``ttl``,
    ``refresh_on_read``, ``timeout``, ...) to
    :class:`~checkpointers.backends.sqlite.SqliteBackend`.
    """

    def __init__(self, path: str | Path, **options: Any) -> None:
        from .backends.sqlite import SqliteBackend

        saver, backend_options = _split(options)
        super().__init__(SqliteBackend(path, **backend_options), **saver)

    @classmethod
    def from_conn_string(cls, path: str | Path, **options: Any) -> _Opening:
        """A context manager (sync or async) yielding a saver, closed on exit."""
        return _Opening(lambda: cls(path, **options))


class RedisCheckpointer(Checkpointer):
    """A checkpointer over Redis or Valkey 7+ (no modules needed).

    Pass a URL (``redis://host:6379/0``), or a ready ``client=``. Keywords
    ``user``, ``require_user``, ``serde`` and ``max_item_bytes`` go to the
    saver, the others to :class:`~checkpointers.backends.redis.RedisBackend`.
    """

    def __init__(self, url: str = "redis://127.0.0.1:6379/0", *, client: Any = None, **options: Any) -> None:
        from .backends.redis import RedisBackend

        saver, backend_options = _split(options)
        if client is not None:
            backend = RedisBackend(client, **backend_options)
        else:
            backend = RedisBackend.from_url(url, **backend_options)
        super().__init__(backend, **saver)

    @classmethod
    def from_conn_string(cls, url: str, **options: Any) -> _Opening:
        """A context manager (sync or async) yielding a saver, closed on exit."""
        return _Opening(lambda: cls(url, **options))


class S3Checkpointer(Checkpointer):
    """A checkpointer over an S3 bucket (or any S3-compatible ``endpoint_url=``).

    Keywords ``user``, ``require_user``, ``serde`` and ``max_item_bytes`` go to
    the saver, the others to :class:`~checkpointers.backends.s3.S3Backend`.
    """

    def __init__(self, bucket: str, prefix: str = "", **options: Any) -> None:
        from .backends.s3 import S3Backend

        saver, backend_options = _split(options)
        super().__init__(S3Backend(bucket, prefix, **backend_options), **saver)


class _Opening(AbstractContextManager, AbstractAsyncContextManager):  # type: ignore[type-arg]
    """``with`` / ``async with`` a saver made on entry and closed on exit."""

    def __init__(self, make: Any) -> None:
        self._make = make
        self._saver: Checkpointer | None = None

    def __enter__(self) -> Any:
        self._saver = self._make()
        return self._saver

    def __exit__(self, *exc: object) -> None:
        if self._saver is not None:
            self._saver.close()

    async def __aenter__(self) -> Any:
        self._saver = self._make()
        return self._saver

    async def __aexit__(self, *exc: object) -> None:
        if self._saver is not None:
            await self._saver.aclose()
