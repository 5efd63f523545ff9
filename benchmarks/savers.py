"""The registry: which savers and storages the benchmarks compare, and how to open them.

Each :class:`SaverEntry` is one product (ours on a backend, or an anchor
package) with a sync and/or an async factory. A factory opens a **fresh**
saver on fresh storage (a new SQLite file, a new Redis database or prefix, a
new S3 bucket) and yields an :class:`Opened` with the saver and a way to
measure its bytes at rest. Entries that cannot run here (package not
installed, Redis modules missing, our backend not built yet) are kept and
reported with the reason, never crash the run.

Adding a saver means adding one entry to :func:`saver_entries` (and, for the
Agent Framework, one to :func:`storage_entries`).
"""

from __future__ import annotations

import collections
import contextlib
import importlib
import inspect
import itertools
import sqlite3
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .services import REDIS_PY_TRIPS, S3_REQUESTS, PostgresService, RedisService, S3Service, Unavailable

__all__ = [
    "Env",
    "Opened",
    "REFERENCE",
    "SaverEntry",
    "StorageEntry",
    "saver_entries",
    "storage_entries",
]

#: Reference anchor per backend family: ratios in the tables are against it.
REFERENCE: Mapping[str, str] = {
    "memory": "InMemorySaver",
    "sqlite": "langgraph-checkpoint-sqlite",
    "redis": "langgraph-checkpoint-plainredis",
    "s3": "langgraph-checkpoint-s3",
    "postgres": "langgraph-checkpoint-postgres",
}

#: The backend families, in table and chart order.
FAMILIES = ("memory", "sqlite", "redis", "s3", "postgres")

Requests = Callable[[], "collections.Counter[str]"]


@dataclass
class Opened:
    """A saver (or storage) ready to use, and how to measure what it stores."""

    saver: Any
    #: bytes at rest (file incl. WAL, Redis ``MEMORY USAGE``, S3 object sizes, PostgreSQL database size)
    footprint: Callable[[], int] | None = None
    #: requests sent so far, by kind (Redis round trips, S3 requests by method); deltas are what count
    requests: Requests | None = None


class Env:
    """Resources shared by one benchmark run: a temp dir and lazily started services."""

    def __init__(self) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="checkpointers-bench-")
        self.tmp = Path(self._tmp.name)
        self._ids = itertools.count(1)
        self._redis: RedisService | Unavailable | None = None
        self._s3: S3Service | Unavailable | None = None
        self._postgres: PostgresService | Unavailable | None = None

    def path(self, stem: str, suffix: str = ".db") -> Path:
        """A new, unused path in the temp dir."""
        return self.tmp / f"{stem}-{next(self._ids)}{suffix}"

    def _service(self, attr: str, start: Callable[[], Any]) -> Any:
        """Start a service once; remember and re-raise why it is unavailable."""
        if getattr(self, attr) is None:
            try:
                setattr(self, attr, start())
            except Unavailable as exc:
                setattr(self, attr, exc)
        service = getattr(self, attr)
        if isinstance(service, Unavailable):
            raise service
        return service

    @property
    def redis(self) -> RedisService:
        return self._service("_redis", RedisService)  # type: ignore[no-any-return]

    @property
    def s3(self) -> S3Service:
        return self._service("_s3", S3Service)  # type: ignore[no-any-return]

    @property
    def postgres(self) -> PostgresService:
        return self._service("_postgres", PostgresService)  # type: ignore[no-any-return]

    def close(self) -> None:
        for service in (self._redis, self._s3, self._postgres):
            if service is not None and not isinstance(service, Unavailable):
                service.close()
        self._tmp.cleanup()


SyncFactory = Callable[[Env], contextlib.AbstractContextManager[Opened]]
AsyncFactory = Callable[[Env], contextlib.AbstractAsyncContextManager[Opened]]


@dataclass(eq=False)  # hashable by identity: used as dict keys
class SaverEntry:
    """One LangGraph saver in the comparison."""

    name: str
    family: str  #: one of :data:`FAMILIES`
    ours: bool
    sync: SyncFactory | None = None
    async_: AsyncFactory | None = None
    #: returns why the entry cannot run here, or None
    check: Callable[[Env], str | None] = field(default=lambda env: None)
    #: the classes used, shown in the tables
    label_sync: str = ""
    label_async: str = ""

    def factory(self, mode: str) -> SyncFactory | AsyncFactory | None:
        return self.sync if mode == "sync" else self.async_

    def label(self, mode: str) -> str:
        return (self.label_sync if mode == "sync" else self.label_async) or self.name


@dataclass(eq=False)
class StorageEntry:
    """One Agent Framework ``CheckpointStorage`` in the comparison (async only)."""

    name: str
    family: str
    ours: bool
    open: Callable[[Env], contextlib.AbstractAsyncContextManager[Any]]
    check: Callable[[Env], str | None] = field(default=lambda env: None)


# -- helpers ---------------------------------------------------------------


def _missing(*modules: str, pip: str) -> Callable[[Env], str | None]:
    """A check: the reason (``not installed: ...``) if a module cannot be imported."""

    def check(env: Env) -> str | None:
        for module in modules:
            try:
                importlib.import_module(module)
            except Exception as exc:  # ImportError, or a broken install
                return f"not installed: `{module}` ({type(exc).__name__}: {exc}); pip install {pip}"
        return None

    return check


def _all(*checks: Callable[[Env], str | None]) -> Callable[[Env], str | None]:
    def check(env: Env) -> str | None:
        for c in checks:
            reason = c(env)
            if reason:
                return reason
        return None

    return check


def _service(name: str) -> Callable[[Env], str | None]:
    def check(env: Env) -> str | None:
        try:
            getattr(env, name)
        except Unavailable as exc:
            return f"cannot run here: {exc}"
        return None

    return check


def sqlite_footprint(path: Path) -> int:
    """Size of a SQLite database file plus its WAL, after a WAL checkpoint."""
    with contextlib.closing(sqlite3.connect(path, timeout=30)) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return sum(p.stat().st_size for p in (path, Path(f"{path}-wal")) if p.exists())


def heap_bytes(obj: Any, _seen: set[int] | None = None) -> int:
    """Bytes of serialized payloads (``bytes``) reachable from an in-memory store."""
    seen = set() if _seen is None else _seen
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return len(obj)
    if isinstance(obj, str):
        return len(obj.encode())
    if isinstance(obj, Mapping):
        return sum(heap_bytes(k, seen) + heap_bytes(v, seen) for k, v in obj.items())
    if isinstance(obj, (list, tuple, set, frozenset)):
        return sum(heap_bytes(v, seen) for v in obj)
    if hasattr(obj, "__dataclass_fields__"):
        return sum(heap_bytes(getattr(obj, f), seen) for f in obj.__dataclass_fields__)
    if hasattr(obj, "__slots__"):
        return sum(heap_bytes(getattr(obj, f, None), seen) for f in obj.__slots__)
    return 0


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


def _close(obj: Any) -> None:
    close = getattr(obj, "close", None)
    if callable(close):
        close()


async def _aclose(obj: Any) -> None:
    for name in ("aclose", "close"):
        close = getattr(obj, name, None)
        if callable(close):
            await _maybe_await(close())
            return


# -- our backends, by family -------------------------------------------------

_BACKEND_MODULES = {
    "memory": "checkpointers.backends.memory",
    "sqlite": "checkpointers.backends.sqlite",
    "redis": "checkpointers.backends.redis",
    "s3": "checkpointers.backends.s3",
    "postgres": "checkpointers.backends.postgres",
}


def _our_backend_check(family: str) -> Callable[[Env], str | None]:
    def check(env: Env) -> str | None:
        try:
            importlib.import_module(_BACKEND_MODULES[family])
        except ImportError as exc:
            return f"not built yet: `{_BACKEND_MODULES[family]}` ({exc})"
        if family in ("redis", "s3", "postgres"):
            return _service(family)(env)
        return None

    return check


def _our_store(env: Env, family: str) -> tuple[str, Callable[[], int] | None]:
    """A fresh store URL of ``family`` for our backends, and its footprint function."""
    if family == "memory":
        return "memory://", None
    if family == "sqlite":
        path = env.path("ours")
        return f"sqlite:///{path}", lambda: sqlite_footprint(path)
    if family == "redis":
        url, prefix = env.redis.fresh()
        return url, lambda: env.redis.footprint(url, prefix)
    if family == "s3":
        bucket = env.s3.fresh_bucket()
        url = f"s3://{bucket}/ckpt?endpoint_url={env.s3.endpoint_url}"
        return url, lambda: env.s3.footprint(bucket)
    if family == "postgres":
        url = env.postgres.fresh()
        return url, lambda: env.postgres.footprint(url)
    raise ValueError(family)


def _s3_requests() -> collections.Counter[str]:
    return S3_REQUESTS.snapshot()


def _redis_py_requests() -> collections.Counter[str]:
    return REDIS_PY_TRIPS.snapshot()


def _our_requests(backend: Any, family: str) -> Requests | None:
    """How our backend's requests are read: its own Redis counter, moto's for S3."""
    if family == "redis":
        return lambda: collections.Counter(trips=backend.round_trips)
    return _s3_requests if family == "s3" else None


def _our_backend(env: Env, family: str) -> tuple[Any, Callable[[], int] | None, Requests | None]:
    from checkpointers.backends import open_backend

    url, footprint = _our_store(env, family)
    if family == "postgres":  # open_backend may not know postgresql:// yet
        from checkpointers.backends.postgres import PostgresBackend

        backend: Any = PostgresBackend.from_url(url)
    else:
        backend = open_backend(url)
    if footprint is None:  # memory: the records it holds
        footprint = lambda: heap_bytes(getattr(backend, "_data", {}))  # noqa: E731
    return backend, footprint, _our_requests(backend, family)


def _ours(family: str) -> SaverEntry:
    @contextlib.contextmanager
    def sync(env: Env) -> Iterator[Opened]:
        from checkpointers.savers import Checkpointer

        backend, footprint, requests = _our_backend(env, family)
        saver = Checkpointer(backend)
        try:
            yield Opened(saver, footprint, requests)
        finally:
            _close(saver)  # closes the backend too

    @contextlib.asynccontextmanager
    async def async_(env: Env) -> AsyncIterator[Opened]:
        from checkpointers.savers import Checkpointer

        backend, footprint, requests = _our_backend(env, family)
        saver = Checkpointer(backend)
        try:
            yield Opened(saver, footprint, requests)
        finally:
            await _aclose(saver)  # closes the backend too

    return SaverEntry(
        name=f"ours: {family}",
        family=family,
        ours=True,
        sync=sync,
        async_=async_,
        check=_all(_missing("checkpointers.savers", pip="-e ."), _our_backend_check(family)),
        label_sync=f"ours: Checkpointer({family})",
        label_async=f"ours: Checkpointer({family})",
    )


# -- anchors -----------------------------------------------------------------


def _sqlite_anchor() -> SaverEntry:
    @contextlib.contextmanager
    def sync(env: Env) -> Iterator[Opened]:
        from langgraph.checkpoint.sqlite import SqliteSaver

        path = env.path("sqlitesaver")
        conn = sqlite3.connect(path, check_same_thread=False)
        saver = SqliteSaver(conn)
        saver.setup()
        try:
            yield Opened(saver, lambda: sqlite_footprint(path))
        finally:
            conn.close()

    @contextlib.asynccontextmanager
    async def async_(env: Env) -> AsyncIterator[Opened]:
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

        path = env.path("asyncsqlitesaver")
        async with AsyncSqliteSaver.from_conn_string(str(path)) as saver:
            await saver.setup()
            yield Opened(saver, lambda: sqlite_footprint(path))

    return SaverEntry(
        name="langgraph-checkpoint-sqlite",
        family="sqlite",
        ours=False,
        sync=sync,
        async_=async_,
        check=_missing("langgraph.checkpoint.sqlite", "aiosqlite", pip="langgraph-checkpoint-sqlite"),
        label_sync="SqliteSaver",
        label_async="AsyncSqliteSaver",
    )


def _inmemory_anchor() -> SaverEntry:
    def held(saver: Any) -> Callable[[], int]:
        return lambda: heap_bytes([saver.storage, saver.blobs, saver.writes])

    @contextlib.contextmanager
    def sync(env: Env) -> Iterator[Opened]:
        from langgraph.checkpoint.memory import InMemorySaver

        saver = InMemorySaver()
        yield Opened(saver, held(saver))

    @contextlib.asynccontextmanager
    async def async_(env: Env) -> AsyncIterator[Opened]:
        from langgraph.checkpoint.memory import InMemorySaver

        saver = InMemorySaver()
        yield Opened(saver, held(saver))

    return SaverEntry(
        name="InMemorySaver",
        family="memory",
        ours=False,
        sync=sync,
        async_=async_,
        check=_missing("langgraph.checkpoint.memory", pip="langgraph-checkpoint"),
        label_sync="InMemorySaver",
        label_async="InMemorySaver",
    )


def _plainredis_anchor() -> SaverEntry:
    @contextlib.contextmanager
    def sync(env: Env) -> Iterator[Opened]:
        from langgraph_checkpoint_plainredis import RedisSaver

        url, prefix = env.redis.fresh()
        saver = RedisSaver(url=url, prefix=prefix)
        try:
            yield Opened(saver, lambda: env.redis.footprint(url, prefix), _redis_py_requests)
        finally:
            saver.client.close()

    @contextlib.asynccontextmanager
    async def async_(env: Env) -> AsyncIterator[Opened]:
        from langgraph_checkpoint_plainredis import AsyncRedisSaver

        url, prefix = env.redis.fresh()
        saver = AsyncRedisSaver(url=url, prefix=prefix)
        try:
            yield Opened(saver, lambda: env.redis.footprint(url, prefix), _redis_py_requests)
        finally:
            await saver.client.aclose()

    return SaverEntry(
        name="langgraph-checkpoint-plainredis",
        family="redis",
        ours=False,
        sync=sync,
        async_=async_,
        check=_all(
            _missing("langgraph_checkpoint_plainredis", pip="langgraph-checkpoint-plainredis"),
            _service("redis"),
        ),
        label_sync="plainredis RedisSaver",
        label_async="plainredis AsyncRedisSaver",
    )


def _redis_modules_check(env: Env) -> str | None:
    needed = {"rejson": "RedisJSON", "search": "RediSearch"}
    missing = [label for module, label in needed.items() if module not in env.redis.modules]
    if missing:
        return (
            "cannot run here: needs RedisJSON+RediSearch (server modules: "
            f"{', '.join(sorted(env.redis.modules)) or 'none'}; missing {'+'.join(missing)})"
        )
    return None


def _langgraph_redis_anchor() -> SaverEntry:
    @contextlib.contextmanager
    def sync(env: Env) -> Iterator[Opened]:
        from langgraph.checkpoint.redis import RedisSaver

        url, prefix = env.redis.fresh()
        saver = RedisSaver(redis_url=url)
        saver.setup()
        yield Opened(saver, lambda: env.redis.footprint(url, ""))

    @contextlib.asynccontextmanager
    async def async_(env: Env) -> AsyncIterator[Opened]:
        from langgraph.checkpoint.redis.aio import AsyncRedisSaver

        url, prefix = env.redis.fresh()
        async with AsyncRedisSaver.from_conn_string(url) as saver:
            await saver.asetup()
            yield Opened(saver, lambda: env.redis.footprint(url, ""))

    return SaverEntry(
        name="langgraph-checkpoint-redis",
        family="redis",
        ours=False,
        sync=sync,
        async_=async_,
        check=_all(
            _missing("langgraph.checkpoint.redis", pip="langgraph-checkpoint-redis"),
            _service("redis"),
            _redis_modules_check,
        ),
        label_sync="langgraph RedisSaver",
        label_async="langgraph AsyncRedisSaver",
    )


def _legacy_serde() -> Any:
    """LangGraph's serializer plus the ``dumps``/``loads`` that langgraph-checkpoint 4 removed.

    ``langgraph-checkpoint-s3`` 0.1.x still calls ``serde.dumps(metadata)``;
    metadata is JSON-able, so JSON bytes are what the older serializer made.
    """
    import json

    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    class LegacySerde(JsonPlusSerializer):
        def dumps(self, obj: Any) -> bytes:
            return json.dumps(obj, default=str).encode()

        def loads(self, data: bytes) -> Any:
            return json.loads(data)

    return LegacySerde()


def _s3_anchor() -> SaverEntry:
    @contextlib.contextmanager
    def sync(env: Env) -> Iterator[Opened]:
        from langgraph_checkpoint_s3 import S3CheckpointSaver

        bucket = env.s3.fresh_bucket()
        saver = S3CheckpointSaver(bucket, prefix="ckpt/", s3_client=env.s3.client(),
                                  serde=_legacy_serde())
        yield Opened(saver, lambda: env.s3.footprint(bucket), _s3_requests)

    @contextlib.asynccontextmanager
    async def async_(env: Env) -> AsyncIterator[Opened]:
        import aioboto3
        from langgraph_checkpoint_s3 import AsyncS3CheckpointSaver

        class LoopbackSaver(AsyncS3CheckpointSaver):  # type: ignore[misc]
            """The anchor opens a client per call with no endpoint: point it at moto."""

            @contextlib.asynccontextmanager
            async def _get_s3_client(self) -> AsyncIterator[Any]:
                async with self.session.client(
                    "s3", endpoint_url=env.s3.endpoint_url, region_name=env.s3.region
                ) as client:
                    yield client

        bucket = env.s3.fresh_bucket()
        saver = LoopbackSaver(bucket, prefix="ckpt/", session=aioboto3.Session(),
                              serde=_legacy_serde())
        yield Opened(saver, lambda: env.s3.footprint(bucket), _s3_requests)

    return SaverEntry(
        name="langgraph-checkpoint-s3",
        family="s3",
        ours=False,
        sync=sync,
        async_=async_,
        check=_all(
            _missing("langgraph_checkpoint_s3", "aioboto3", pip="langgraph-checkpoint-s3"),
            _service("s3"),
        ),
        label_sync="S3CheckpointSaver",
        label_async="AsyncS3CheckpointSaver",
    )


def _objectstorage_anchor() -> SaverEntry:
    def open_saver(env: Env) -> Opened:
        from langgraph_checkpoint_objectstorage import ObjectStorageSaver

        bucket = env.s3.fresh_bucket()
        saver = ObjectStorageSaver.from_conn_string(
            f"s3://{bucket}/ckpt",
            endpoint_url=env.s3.endpoint_url,
            key="testing",
            secret="testing",
            client_kwargs={"region_name": env.s3.region},
        )
        return Opened(saver, lambda: env.s3.footprint(bucket), _s3_requests)

    @contextlib.contextmanager
    def sync(env: Env) -> Iterator[Opened]:
        yield open_saver(env)

    @contextlib.asynccontextmanager
    async def async_(env: Env) -> AsyncIterator[Opened]:
        yield open_saver(env)

    return SaverEntry(
        name="langgraph-checkpoint-objectstorage",
        family="s3",
        ours=False,
        sync=sync,
        async_=async_,
        check=_all(
            _missing("langgraph_checkpoint_objectstorage", "s3fs",
                     pip="langgraph-checkpoint-objectstorage s3fs"),
            _service("s3"),
        ),
        label_sync="ObjectStorageSaver (S3)",
        label_async="ObjectStorageSaver (S3)",
    )


def _postgres_anchor() -> SaverEntry:
    @contextlib.contextmanager
    def sync(env: Env) -> Iterator[Opened]:
        from langgraph.checkpoint.postgres import PostgresSaver

        url = env.postgres.fresh()
        with PostgresSaver.from_conn_string(url) as saver:
            saver.setup()
            yield Opened(saver, lambda: env.postgres.footprint(url))

    @contextlib.asynccontextmanager
    async def async_(env: Env) -> AsyncIterator[Opened]:
        from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

        url = env.postgres.fresh()
        async with AsyncPostgresSaver.from_conn_string(url) as saver:
            await saver.setup()
            yield Opened(saver, lambda: env.postgres.footprint(url))

    return SaverEntry(
        name="langgraph-checkpoint-postgres",
        family="postgres",
        ours=False,
        sync=sync,
        async_=async_,
        check=_all(_missing("langgraph.checkpoint.postgres", pip="langgraph-checkpoint-postgres"),
                   _service("postgres")),
        label_sync="PostgresSaver",
        label_async="AsyncPostgresSaver",
    )


def saver_entries() -> list[SaverEntry]:
    """Every LangGraph saver the benchmarks know, ours first."""
    return [
        _ours("memory"),
        _ours("sqlite"),
        _ours("redis"),
        _ours("s3"),
        _ours("postgres"),
        _sqlite_anchor(),
        _inmemory_anchor(),
        _plainredis_anchor(),
        _langgraph_redis_anchor(),
        _s3_anchor(),
        _objectstorage_anchor(),
        _postgres_anchor(),
    ]


# -- Agent Framework storages --------------------------------------------------


def _our_storage(family: str) -> StorageEntry:
    @contextlib.asynccontextmanager
    async def open_storage(env: Env) -> AsyncIterator[Any]:
        from adapters.agent_framework import IsolatedCheckpointStorage

        backend, _, _ = _our_backend(env, family)
        storage = IsolatedCheckpointStorage(backend, user="bench")
        try:
            yield storage
        finally:
            await backend.aclose()

    return StorageEntry(
        name=f"ours: {family}",
        family=family,
        ours=True,
        open=open_storage,
        check=_all(_missing("adapters.agent_framework", pip="-e .[agent-framework]"),
                   _our_backend_check(family)),
    )


def _framework_storage(cls_name: str) -> StorageEntry:
    @contextlib.asynccontextmanager
    async def open_storage(env: Env) -> AsyncIterator[Any]:
        import agent_framework

        cls = getattr(agent_framework, cls_name)
        if cls_name == "FileCheckpointStorage":
            yield cls(env.path("afw-files", suffix=""))
        else:
            yield cls()

    return StorageEntry(
        name=cls_name,
        family="framework",
        ours=False,
        open=open_storage,
        check=_missing("agent_framework", pip="agent-framework-core"),
    )


def storage_entries() -> list[StorageEntry]:
    """Every Agent Framework storage the benchmarks know, ours first."""
    return [
        _our_storage("memory"),
        _our_storage("sqlite"),
        _our_storage("redis"),
        _our_storage("s3"),
        _framework_storage("InMemoryCheckpointStorage"),
        _framework_storage("FileCheckpointStorage"),
    ]
