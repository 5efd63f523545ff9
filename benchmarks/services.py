"""Services the benchmarks talk to, on loopback only, and the request counters.

* :class:`RedisService` — ``REDIS_URL`` when set, else a throwaway
  ``redis-server`` (:class:`~.launchers.RedisServer`) on a free loopback port.
* :class:`S3Service` — moto's ``ThreadedMotoServer`` (:class:`~.launchers.MotoServer`)
  on a free loopback port, in a child process, with a WSGI middleware that
  counts every HTTP request it serves (read back through ``/_bench/requests``).
* :class:`PostgresService` — ``POSTGRES_URL`` when set, else the server on
  127.0.0.1:5432 (database ``test``) when it answers; :meth:`~PostgresService.fresh`
  creates an empty database per saver and the service drops them at close.
* Counters: :data:`S3_REQUESTS` (server-side, every client alike) and
  :data:`REDIS_PY_TRIPS`, the round trips of the anchors' redis-py clients,
  counted where redis-py writes a request while :func:`counting_redis_py`
  runs (one call = one round trip; a pipeline or MULTI/EXEC block is one).
  Our ``RedisBackend`` is not counted here: it counts its own round trips
  (``round_trips``), which the registry reads (:mod:`benchmarks.savers`).

The launchers live in :mod:`benchmarks.launchers` (re-exported here).
"""

from __future__ import annotations

import collections
import contextlib
import json
import multiprocessing
import os
import shutil
import tempfile
import threading
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit, urlunsplit

from .launchers import MotoServer, RedisServer, free_port

__all__ = [
    "REDIS_PY_TRIPS",
    "S3_REQUESTS",
    "MotoServer",
    "PostgresService",
    "RedisServer",
    "RedisService",
    "RemoteCounter",
    "RequestCounter",
    "S3Service",
    "Unavailable",
    "counting_redis_py",
    "free_port",
]


class Unavailable(RuntimeError):
    """A service a saver needs cannot run here; the message says why."""


class RequestCounter:
    """A thread-safe counter of requests by kind (``GET``, ``PUT``, ``LIST``...)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: collections.Counter[str] = collections.Counter()

    def add(self, kind: str) -> None:
        with self._lock:
            self._counts[kind] += 1

    def reset(self) -> None:
        with self._lock:
            self._counts.clear()

    def snapshot(self) -> collections.Counter[str]:
        with self._lock:
            return collections.Counter(self._counts)

    def total(self) -> int:
        with self._lock:
            return sum(self._counts.values())


#: Round trips of redis-py clients (the anchors'), while :func:`counting_redis_py` runs.
REDIS_PY_TRIPS = RequestCounter()


@contextlib.contextmanager
def counting_redis_py() -> Iterator[RequestCounter]:
    """Count every request redis-py writes (sync and async) into :data:`REDIS_PY_TRIPS`.

    Wraps ``send_packed_command`` of redis-py's connections: one call is one
    request written, one round trip. This counts the anchors' clients; our
    ``RedisBackend`` is read from its own ``round_trips`` instead, whatever
    its transport, and nothing of it is patched.
    """
    import redis.asyncio.connection as aconn
    import redis.connection as sconn

    sync_orig: Any = sconn.AbstractConnection.send_packed_command
    async_orig: Any = aconn.AbstractConnection.send_packed_command

    def sync_send(self: Any, command: Any, check_health: bool = True) -> Any:
        REDIS_PY_TRIPS.add("sync")
        return sync_orig(self, command, check_health)

    async def async_send(self: Any, command: Any, check_health: bool = True) -> Any:
        REDIS_PY_TRIPS.add("async")
        return await async_orig(self, command, check_health)

    sconn.AbstractConnection.send_packed_command = sync_send  # type: ignore[method-assign]
    aconn.AbstractConnection.send_packed_command = async_send  # type: ignore[method-assign]
    try:
        yield REDIS_PY_TRIPS
    finally:
        sconn.AbstractConnection.send_packed_command = sync_orig  # type: ignore[method-assign]
        aconn.AbstractConnection.send_packed_command = async_orig  # type: ignore[method-assign]


class RedisService:
    """A Redis server for the benchmarks; :meth:`fresh` hands out empty key spaces.

    With a throwaway server every :meth:`fresh` call gets its own database
    number (flushed first), so sizes can be measured per saver without knowing
    its key layout. With ``REDIS_URL`` (a shared server: never flushed) each
    call gets a unique key prefix instead.
    """

    def __init__(self) -> None:
        self._server: RedisServer | None = None
        self._dir: str | None = None
        self._next_db = 0
        self.databases = 256
        env_url = os.environ.get("REDIS_URL")
        if env_url:
            self.base_url = env_url
            self.shared = True
        else:
            if shutil.which("redis-server") is None:
                raise Unavailable("no redis-server binary and no REDIS_URL")
            self._dir = tempfile.mkdtemp(prefix="bench-redis-")
            server = RedisServer(Path(self._dir), free_port(), ["--databases", str(self.databases)])
            try:
                self._server = server.start()
            except RuntimeError as exc:
                server.stop()
                self.close()
                raise Unavailable(f"redis-server did not start: {exc}") from exc
            self.base_url = self._server.url
            self.shared = False
        self.modules = self._modules()

    def _client(self, url: str | None = None) -> Any:
        import redis

        return redis.Redis.from_url(url or self.base_url)

    def _modules(self) -> set[str]:
        try:
            rows = self._client().execute_command("MODULE", "LIST")
        except Exception:
            return set()
        names = set()
        for row in rows or []:
            fields = dict(zip(row[::2], row[1::2], strict=False)) if isinstance(row, list) else row
            name = fields.get(b"name") or fields.get("name")
            if name:
                names.add(name.decode() if isinstance(name, bytes) else str(name))
        return {n.lower() for n in names}

    def fresh(self) -> tuple[str, str]:
        """``(url, prefix)`` of an empty key space for one saver."""
        prefix = f"bench{uuid.uuid4().hex[:10]}"
        if self.shared:
            return self.base_url, prefix
        self._next_db = self._next_db % (self.databases - 1) + 1
        parts = urlsplit(self.base_url)
        url = urlunsplit(parts._replace(path=f"/{self._next_db}"))
        client = self._client(url)
        client.flushdb()
        client.close()
        return url, prefix

    def footprint(self, url: str, prefix: str) -> int:
        """Bytes Redis reports (``MEMORY USAGE``) for the keys of one key space."""
        client = self._client(url)
        pattern = f"{prefix}*" if self.shared else "*"
        total = 0
        try:
            for key in client.scan_iter(match=pattern, count=1000):
                total += int(client.memory_usage(key, samples=0) or 0)
        finally:
            client.close()
        return total

    def close(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


class PostgresService:
    """A PostgreSQL server for the benchmarks; :meth:`fresh` creates an empty database per saver."""

    def __init__(self) -> None:
        try:
            import psycopg
        except ImportError as exc:
            raise Unavailable(f"psycopg not installed: {exc}") from exc
        self.base_url = os.environ.get("POSTGRES_URL") or "postgresql://postgres@127.0.0.1:5432/test"
        self._created: list[str] = []
        try:
            self._admin = psycopg.connect(self.base_url, autocommit=True, connect_timeout=5)
        except psycopg.Error as exc:
            raise Unavailable(f"no PostgreSQL at {self.base_url}: {exc}".splitlines()[0]) from exc

    def fresh(self) -> str:
        """The URL of a new, empty database (dropped at :meth:`close`)."""
        name = f"bench_{uuid.uuid4().hex[:12]}"
        self._admin.execute(f'CREATE DATABASE "{name}"')
        self._created.append(name)
        return urlunsplit(urlsplit(self.base_url)._replace(path=f"/{name}"))

    def footprint(self, url: str) -> int:
        """Bytes of the database (``pg_database_size``: tables, indexes, TOAST, free space)."""
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute("SELECT pg_database_size(current_database())").fetchone()
            base = conn.execute("SELECT pg_database_size('template1')").fetchone()
        assert row is not None and base is not None
        return int(row[0]) - int(base[0])

    def close(self) -> None:
        for name in self._created:
            with contextlib.suppress(Exception):
                self._admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        self._created.clear()
        self._admin.close()


def _s3_kind(environ: dict[str, Any]) -> str:
    """``LIST`` for a bucket listing, else the HTTP method."""
    method = str(environ.get("REQUEST_METHOD", "GET")).upper()
    path = str(environ.get("PATH_INFO", "/")).strip("/")
    query = parse_qs(str(environ.get("QUERY_STRING", "")), keep_blank_values=True)
    if method == "GET" and "/" not in path and not ({"uploads", "versioning", "location",
                                                      "policy", "acl", "tagging"} & query.keys()):
        return "LIST"
    return method


_COUNTS_PATH = "/_bench/requests"


class _CountingApp:
    """WSGI middleware: count each S3 request; ``GET /_bench/requests[?reset=1]`` reads them."""

    def __init__(self, app: Callable[..., Any]) -> None:
        self.app = app
        self.counter = RequestCounter()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        if environ.get("PATH_INFO") == _COUNTS_PATH:
            body = json.dumps(self.counter.snapshot()).encode()
            if "reset" in str(environ.get("QUERY_STRING", "")):
                self.counter.reset()
            start_response("200 OK", [("Content-Type", "application/json")])
            return [body]
        self.counter.add(_s3_kind(environ))
        return self.app(environ, start_response)


def _serve_moto(port: int, ready: Any) -> None:
    """Child process: moto's ThreadedMotoServer on 127.0.0.1:port, counting requests."""
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    MotoServer(port, wrap=_CountingApp).start()
    ready.set()
    threading.Event().wait()


class RemoteCounter:
    """:class:`RequestCounter`'s reading side for the counts kept by the moto process."""

    def __init__(self) -> None:
        self.url: str | None = None

    def _read(self, reset: bool) -> collections.Counter[str]:
        if self.url is None:
            return collections.Counter()
        with urllib.request.urlopen(self.url + ("?reset=1" if reset else ""), timeout=10) as r:
            return collections.Counter(json.loads(r.read()))

    def reset(self) -> None:
        self._read(reset=True)

    def snapshot(self) -> collections.Counter[str]:
        return self._read(reset=False)

    def total(self) -> int:
        return sum(self.snapshot().values())


S3_REQUESTS = RemoteCounter()


class S3Service:
    """moto's S3 over real HTTP on loopback, counting requests; one bucket per saver.

    The server runs in a child process (moto's ``ThreadedMotoServer``), so it
    does not compete with the savers for this process's GIL: its CPU is the
    server's, as with a real endpoint.
    """

    def __init__(self) -> None:
        os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
        os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
        os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
        try:
            import moto.moto_server.threaded_moto_server  # noqa: F401
        except ImportError as exc:
            raise Unavailable(f"moto[server] not installed: {exc}") from exc
        ctx = multiprocessing.get_context("spawn")
        ready = ctx.Event()
        port = free_port()
        self._proc = ctx.Process(target=_serve_moto, args=(port, ready), daemon=True)
        self._proc.start()
        if not ready.wait(60):
            self._proc.kill()
            raise Unavailable("moto server did not start within 60 s")
        self.endpoint_url = f"http://127.0.0.1:{port}"
        S3_REQUESTS.url = self.endpoint_url + _COUNTS_PATH
        # A client created without endpoint_url must still reach moto, never AWS.
        if not os.environ.get("AWS_ENDPOINT_URL_S3"):
            os.environ["AWS_ENDPOINT_URL_S3"] = self.endpoint_url
        self.region = os.environ["AWS_DEFAULT_REGION"]

    def client(self) -> Any:
        """A plain boto3 S3 client on the moto endpoint."""
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint_url, region_name=self.region)

    def fresh_bucket(self) -> str:
        """Create and return an empty bucket."""
        name = f"bench-{uuid.uuid4().hex[:16]}"
        self.client().create_bucket(Bucket=name)
        return name

    def footprint(self, bucket: str, prefix: str = "") -> int:
        """Sum of the sizes of the objects under ``bucket/prefix``."""
        paginator = self.client().get_paginator("list_objects_v2")
        return sum(
            obj["Size"]
            for page in paginator.paginate(Bucket=bucket, Prefix=prefix)
            for obj in page.get("Contents", [])
        )

    def close(self) -> None:
        S3_REQUESTS.url = None
        self._proc.terminate()
        self._proc.join(timeout=10)
