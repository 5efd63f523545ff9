"""Drop-in LangGraph checkpointers over any backend, sync and async.

One class, :class:`Checkpointer`, works over every
:class:`~checkpointers.backends.Backend`; the named subclasses only open
their backend. Every operation is a flow (:mod:`checkpointers._saver_flows`)
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

**Users.** The user of a call is ``config["configurable"]["user_id"]`` if
present, else the user the view is bound to (:meth:`Checkpointer.for_user`),
else the user of the surrounding :meth:`Checkpointer.acting_for` block, else
the anonymous user, isolated like any other. With ``require_user=True``
a call without a user raises :class:`~checkpointers.errors.IsolationError`
before any I/O. Methods that take no config (``delete_thread``,
``copy_thread``, ``prune``, ``delete_for_runs``, ``list(None)``) use the bound
user: bind a view per user to manage their threads. LangGraph's
``get_state(subgraphs=True)`` reads subgraph checkpoints with configs that
carry only ``thread_id`` and ``checkpoint_ns``: compile with a bound view, or
wrap the call in ``with saver.acting_for(user_id):``.
"""

from __future__ import annotations

import copy
import random
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
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
    SerializerProtocol,
    get_checkpoint_metadata,
)
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from ._flows import DropOp, Flow, arun, run
from ._names import ANONYMOUS_USER, DEFAULT_MAX_ITEM_BYTES, Partition, validate_user
from ._saver_flows import SPACE, Found, SaverFlows
from .backends import Backend, open_backend
from .backends.memory import MemoryBackend
from .errors import IsolationError

__all__ = [
    "Checkpointer",
    "MemoryCheckpointer",
    "RedisCheckpointer",
    "S3Checkpointer",
    "SqliteCheckpointer",
]

_STRATEGIES = ("keep_latest", "delete")
_SAVER_OPTIONS = ("user", "require_user", "serde", "max_item_bytes")
#: Partitions (with their encoded keys) kept per saver, by (user, thread id).
_PARTITION_CACHE_SIZE = 4096


def _split(options: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split keyword options into the saver's own and the backend's."""
    saver = {k: v for k, v in options.items() if k in _SAVER_OPTIONS}
    return saver, {k: v for k, v in options.items() if k not in _SAVER_OPTIONS}


def default_serde() -> SerializerProtocol:
    """LangGraph's msgpack serializer with the pickle fallback off: loading never unpickles."""
    return JsonPlusSerializer(pickle_fallback=False)


class Checkpointer(SaverFlows, BaseCheckpointSaver[str]):
    """A LangGraph checkpointer over any backend, isolated per user.

    Args:
        backend: where records live (memory, SQLite, Redis, S3, ...).
        user: bind this saver to a user (same as ``for_user(user)``).
        require_user: refuse calls that name no user (``IsolationError``).
        serde: serializer; defaults to LangGraph's msgpack serializer without
            pickle fallback.
        max_item_bytes: cap on each stored record (a checkpoint without its
            channel values, one channel value, one write); over it raises
            ``ItemTooLargeError`` before anything is written.

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
    ) -> None:
        super().__init__(serde=serde or default_serde())
        if max_item_bytes <= 0:
            raise ValueError(f"max_item_bytes must be positive, got {max_item_bytes}")
        self.backend = backend
        self.user = None if user is None else validate_user(user)
        self.require_user = require_user
        self.max_item_bytes = max_item_bytes
        self._acting: ContextVar[str | None] = ContextVar(f"checkpointers_user_{id(self)}", default=None)
        self._partitions: dict[tuple[str, str], Partition] = {}
        self._init_flows()

    @classmethod
    def from_url(cls, url: str, **options: Any) -> Checkpointer:
        """Open the backend ``url`` names (``memory://``, ``sqlite:///x.db``, ``redis://``, ``s3://``).

        The saver's own keywords (``user``, ``require_user``, ``serde``,
        ``max_item_bytes``) go to the saver, the others to the backend.
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
        """Within the block, calls that name no user (and views bound to none) act for ``user``.

        The user is kept in a context variable of this saver (shared by its
        views), so it follows the code into tasks and threads started with a
        copy of the context and is gone after the block. A ``user_id`` in a
        call's config and a view's binding still win.
        """
        token = self._acting.set(validate_user(user))
        try:
            yield self
        finally:
            self._acting.reset(token)

    # -- who and where ------------------------------------------------------

    def _user(self, config: RunnableConfig | None) -> str:
        configured = (config or {}).get("configurable", {}).get("user_id")
        if configured is not None:
            return validate_user(configured)
        if self.user is not None:
            return self.user
        acting = self._acting.get()
        if acting is not None:
            return acting
        if self.require_user:
            raise IsolationError(
                "this checkpointer requires a user (require_user=True): put "
                "configurable.user_id in the config or call for_user(user_id)"
            )
        return ANONYMOUS_USER

    def _partition(self, config: RunnableConfig | None, thread_id: object) -> Partition:
        if thread_id is None:
            raise ValueError("the config has no configurable.thread_id; pass one to name the thread")
        user, thread = self._user(config), str(thread_id)
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
    def _conf(config: RunnableConfig) -> Mapping[str, Any]:
        """The config's ``configurable`` section (read only: never modified)."""
        return config.get("configurable") or {}

    def _tuple(self, found: Found, thread_id: object, config: RunnableConfig | None) -> CheckpointTuple:
        extra: dict[str, Any] = {}
        if config is not None and (config.get("configurable") or {}).get("user_id") is not None:
            extra["user_id"] = config["configurable"]["user_id"]

        def cfg(cid: str) -> RunnableConfig:
            return {
                "configurable": {
                    "thread_id": thread_id,
                    "checkpoint_ns": found.ns,
                    "checkpoint_id": cid,
                    **extra,
                }
            }

        return CheckpointTuple(
            config=cfg(found.cid),
            checkpoint=found.checkpoint,
            metadata=found.metadata,
            parent_config=cfg(found.parent) if found.parent else None,
            pending_writes=found.pending_writes,
        )

    # -- flows per public call (built once, driven sync or async) ---------------

    def _get_tuple_flow(self, config: RunnableConfig) -> Flow[CheckpointTuple | None]:
        conf = self._conf(config)
        p = self._partition(config, conf.get("thread_id"))
        found = yield from self.get_flow(p, conf.get("checkpoint_ns", ""), conf.get("checkpoint_id"))
        return None if found is None else self._tuple(found, conf["thread_id"], config)

    def _list_flow(
        self,
        config: RunnableConfig | None,
        filter: dict[str, Any] | None,
        before: RunnableConfig | None,
        limit: int | None,
    ) -> Flow[list[CheckpointTuple]]:
        conf = self._conf(config) if config else {}
        user = self._user(config)
        thread_id = conf.get("thread_id")
        parts = None if thread_id is None else [Partition(user, SPACE, str(thread_id))]
        before_id = self._conf(before).get("checkpoint_id") if before else None
        found = yield from self.list_flow(
            parts, user, conf.get("checkpoint_ns"), conf.get("checkpoint_id"), filter, before_id, limit
        )
        return [self._tuple(f, f.thread if thread_id is None else thread_id, config) for f in found]

    def _put_flow(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> Flow[RunnableConfig]:
        conf = self._conf(config)
        p = self._partition(config, conf.get("thread_id"))
        ns = conf.get("checkpoint_ns", "")
        merged = get_checkpoint_metadata(config, metadata)
        yield from self.put_flow(p, ns, conf.get("checkpoint_id"), checkpoint, merged, new_versions)
        out: dict[str, Any] = {"thread_id": conf["thread_id"], "checkpoint_ns": ns, "checkpoint_id": checkpoint["id"]}
        if conf.get("user_id") is not None:
            out["user_id"] = conf["user_id"]
        return {"configurable": out}

    def _put_writes_flow(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str
    ) -> Flow[None]:
        conf = self._conf(config)
        p = self._partition(config, conf.get("thread_id"))
        yield from self.put_writes_flow(
            p, conf.get("checkpoint_ns", ""), conf["checkpoint_id"], writes, task_id, task_path
        )

    def _delete_thread_flow(self, thread_id: str) -> Flow[None]:
        p = self._partition(None, thread_id)
        yield DropOp(p)
        self._forget(p)

    def _copy_thread_flow(self, source_thread_id: str, target_thread_id: str) -> Flow[None]:
        src, dst = self._partition(None, source_thread_id), self._partition(None, target_thread_id)
        yield from self.copy_flow(src, dst)

    def _prune_flow(self, thread_ids: Sequence[str], strategy: str) -> Flow[None]:
        if strategy not in _STRATEGIES:
            raise ValueError(f"unknown prune strategy {strategy!r}: use 'keep_latest' or 'delete'")
        parts = [self._partition(None, t) for t in thread_ids]
        for p in parts:
            if strategy == "delete":
                yield DropOp(p)
                self._forget(p)
            else:
                yield from self.prune_flow(p)

    def _delete_for_runs_flow(self, run_ids: Sequence[str]) -> Flow[None]:
        user = self._user(None)
        yield from self.delete_runs_flow(user, run_ids)
        with self._recent_lock:
            self._recent.clear()

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

        Writing the same regular write again is a no-op; a different value
        raises :class:`~checkpointers.errors.StepMismatchError`. Special
        writes (errors, interrupts, resumes) are last-writer-wins.
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
    """A checkpointer over an in-process :class:`MemoryBackend` (tests, quick starts)."""

    def __init__(self, **options: Any) -> None:
        super().__init__(MemoryBackend(), **options)


class SqliteCheckpointer(Checkpointer):
    """A checkpointer over one SQLite file (WAL; several processes may share it).

    ``SqliteCheckpointer.from_conn_string(path)`` works like LangGraph's
    ``SqliteSaver.from_conn_string``, with both ``with`` and ``async with``.
    """

    def __init__(self, path: str | Path, **options: Any) -> None:
        from .backends.sqlite import SqliteBackend

        super().__init__(SqliteBackend(path), **options)

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
