"""Services the benchmarks talk to, on loopback only, and the request counters.

* :class:`RedisService` — ``REDIS_URL`` when set, else a throwaway
  ``redis-server`` (:class:`RedisServer`) on a free loopback port (no
  persistence, removed at exit).
* :class:`S3Service` — moto's ``ThreadedMotoServer`` (:class:`MotoServer`) on
  a free loopback port, in a child process, with a WSGI middleware that counts
  every HTTP request it serves (read back through ``/_bench/requests``).
* :func:`free_port`, :class:`RedisServer`, :class:`MotoServer` — the
  launchers, also the tests' (``tests/plugins`` imports them from here:
  the tests already import the benchmarks, while the benchmarks run without
  pytest or ``tests/``). Standard library only at import time.
* :data:`REDIS_TRIPS` / :data:`S3_REQUESTS` — counters the workloads reset
  and read around one operation. Redis round trips are counted client-side:
  our backend's by its own ``round_trips`` counter, every other client's by
  wrapping ``send_packed_command`` of redis-py's sync and async connections
  (one call = one request written = one round trip; a pipeline or MULTI/EXEC
  block is one). S3 requests are counted server-side, so every client
  (boto3, aioboto3, s3fs) is counted the same way.

The counters are process-wide: the workloads that read them run one saver at
a time.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import json
import multiprocessing
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request
import uuid
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit, urlunsplit

__all__ = [
    "REDIS_TRIPS",
    "S3_REQUESTS",
    "MotoServer",
    "RedisServer",
    "RedisService",
    "RemoteCounter",
    "RequestCounter",
    "S3Service",
    "Unavailable",
    "counting_redis_round_trips",
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


class RedisRoundTrips(RequestCounter):
    """:data:`REDIS_TRIPS`: the requests added here plus, while
    :func:`counting_redis_round_trips` runs, our backends' own counts."""

    def __init__(self) -> None:
        super().__init__()
        self.ours: _OurRoundTrips | None = None

    def reset(self) -> None:
        super().reset()
        if self.ours is not None:
            self.ours.reset()

    def snapshot(self) -> collections.Counter[str]:
        counts = super().snapshot()
        if self.ours is not None:
            counts.update(self.ours.counts())
        return counts

    def total(self) -> int:
        return sum(self.snapshot().values())


REDIS_TRIPS = RedisRoundTrips()


def free_port(with_bus: bool = False) -> int:
    """A TCP port nobody listens on at 127.0.0.1 right now (``with_bus``: port + 10000 too, for a cluster node)."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if not with_bus:
            return port
        if port + 10000 < 65536:
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port + 10000))
                except OSError:
                    continue
            return port
    raise RuntimeError("no free loopback port found")


#: The operations of our RedisBackend, whose round trips it counts itself.
_OUR_REDIS_OPERATIONS = ("get", "write", "list", "partitions", "drop", "many")


@contextlib.contextmanager
def counting_redis_round_trips() -> Iterator[RequestCounter]:
    """Count every Redis round trip (sync and async) into :data:`REDIS_TRIPS`.

    Our ``RedisBackend`` counts its own round trips (``round_trips``, whatever
    transport it runs on): every backend one of its operations ran on is
    read at ``reset`` and ``snapshot``, its round trips since the last reset
    counted under the face its operations used (``async`` when all were
    async, else ``sync``). Every other client (the anchors' redis-py clients)
    is counted where redis-py writes a request, ``send_packed_command`` (one
    call = one request written = one round trip; a pipeline or MULTI/EXEC
    block is one), except while one of our operations runs: those are
    already in the backend's counter. So the handshake of a connection opened
    meanwhile (``HELLO``, ``CLIENT SETINFO``: a graph run's background threads
    open some) counts for the other clients, not for ours, which counts the
    round trips of its operations only.
    """
    import redis.asyncio.connection as aconn
    import redis.connection as sconn

    from checkpointers.backends.redis import RedisBackend

    inside_ours: contextvars.ContextVar[bool] = contextvars.ContextVar("inside_ours", default=False)
    ours = _OurRoundTrips()
    sync_orig: Any = sconn.AbstractConnection.send_packed_command
    async_orig = aconn.AbstractConnection.send_packed_command

    def sync_send(self: Any, command: Any, check_health: bool = True) -> Any:
        if not inside_ours.get():
            REDIS_TRIPS.add("sync")
        return sync_orig(self, command, check_health)

    async def async_send(self: Any, command: Any, check_health: bool = True) -> Any:
        if not inside_ours.get():
            REDIS_TRIPS.add("async")
        return await async_orig(self, command, check_health)

    def counted(fn: Callable[..., Any], face: str) -> Callable[..., Any]:
        if face == "async":

            async def operation(backend: Any, *args: Any, **kwargs: Any) -> Any:
                ours.seen(backend, face)
                token = inside_ours.set(True)
                try:
                    return await fn(backend, *args, **kwargs)
                finally:
                    inside_ours.reset(token)

            return operation

        def sync_operation(backend: Any, *args: Any, **kwargs: Any) -> Any:
            ours.seen(backend, face)
            token = inside_ours.set(True)
            try:
                return fn(backend, *args, **kwargs)
            finally:
                inside_ours.reset(token)

        return sync_operation

    names = [face + name for name in _OUR_REDIS_OPERATIONS for face in ("", "a")]
    originals = {name: getattr(RedisBackend, name) for name in names}
    sconn.AbstractConnection.send_packed_command = sync_send  # type: ignore[method-assign]
    aconn.AbstractConnection.send_packed_command = async_send  # type: ignore[method-assign]
    for name, fn in originals.items():
        setattr(RedisBackend, name, counted(fn, "async" if name.startswith("a") else "sync"))
    REDIS_TRIPS.ours = ours
    try:
        yield REDIS_TRIPS
    finally:
        sconn.AbstractConnection.send_packed_command = sync_orig  # type: ignore[method-assign]
        aconn.AbstractConnection.send_packed_command = async_orig  # type: ignore[method-assign]
        for name, fn in originals.items():
            setattr(RedisBackend, name, fn)
        REDIS_TRIPS.ours = None


class _OurRoundTrips:
    """Our backends' own round-trip counters, read against a baseline taken at reset."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._backends: weakref.WeakKeyDictionary[Any, tuple[int, set[str]]] = weakref.WeakKeyDictionary()

    def seen(self, backend: Any, face: str) -> None:
        """``backend`` runs an operation of ``face`` now (before it sends anything)."""
        with self._lock:
            self._backends.setdefault(backend, (backend.round_trips, set()))[1].add(face)

    def reset(self) -> None:
        with self._lock:
            for backend in list(self._backends):
                self._backends[backend] = (backend.round_trips, set())

    def counts(self) -> collections.Counter[str]:
        out: collections.Counter[str] = collections.Counter()
        with self._lock:
            for backend, (base, faces) in list(self._backends.items()):
                if backend.round_trips > base:
                    out["async" if faces == {"async"} else "sync"] += backend.round_trips - base
        return out


#: How long :meth:`RedisServer.start` waits for ``PING`` to be answered.
_START_TIMEOUT = 15.0


@dataclass
class RedisServer:
    """One ``redis-server`` process on 127.0.0.1, persistence off, logging to ``directory``.

    ``args`` are appended to the command line (a later option wins, so
    ``["--appendonly", "yes"]`` turns the append-only file on). ``start``
    waits until the server answers ``PING``; calling it again after
    :meth:`kill` or :meth:`stop` restarts it on the same port and directory.
    """

    directory: Path
    port: int
    args: list[str] = field(default_factory=list)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        self.directory.mkdir(parents=True, exist_ok=True)
        command = [
            "redis-server",
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.directory),
            "--save", "",
            "--appendonly", "no",
            "--daemonize", "no",
            "--logfile", str(self.directory / "redis.log"),
            *self.args,
        ]  # fmt: skip
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.wait_ready()
        return self

    def wait_ready(self) -> None:
        deadline = time.monotonic() + _START_TIMEOUT
        while True:
            assert self.process is not None
            if self.process.poll() is not None:
                log = (self.directory / "redis.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"redis-server on port {self.port} exited: {log}")
            if self.ping():
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis-server on port {self.port} did not answer PING")
            time.sleep(0.05)

    def ping(self) -> bool:
        """Whether the server answers ``PING`` (not while it is still loading its data)."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=2) as s:
                s.sendall(b"PING\r\n")
                return s.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def cli(self, *args: str) -> str:
        """``redis-cli`` on this server; its output."""
        out = subprocess.run(
            ["redis-cli", "-h", "127.0.0.1", "-p", str(self.port), *args],
            capture_output=True,
            timeout=10,
            check=False,
        )
        return out.stdout.decode(errors="replace")

    def kill(self) -> None:
        """SIGKILL: no shutdown, no final save."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()


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
            fields = dict(zip(row[::2], row[1::2])) if isinstance(row, list) else row
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


class MotoServer:
    """moto's ``ThreadedMotoServer`` (S3 over real HTTP) on a loopback port, in this process.

    ``port`` defaults to a free one. ``wrap`` wraps moto's WSGI app, as the
    benchmarks' request counter does (:class:`_CountingApp`).
    """

    def __init__(self, port: int | None = None, wrap: Callable[[Any], Any] | None = None) -> None:
        self.port = free_port() if port is None else port
        self.endpoint_url = f"http://127.0.0.1:{self.port}"
        self._wrap = wrap
        self._server: Any = None

    def start(self) -> MotoServer:
        from moto.server import ThreadedMotoServer

        kind = ThreadedMotoServer if self._wrap is None else _wrapping_moto_server(self._wrap)
        self._server = kind(ip_address="127.0.0.1", port=self.port, verbose=False)
        self._server.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None


def _wrapping_moto_server(wrap: Callable[[Any], Any]) -> Any:
    """A ``ThreadedMotoServer`` whose WSGI app is ``wrap(moto's app)``."""
    from moto.moto_server.threaded_moto_server import ThreadedMotoServer
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import make_server

    class WrappingMotoServer(ThreadedMotoServer):  # type: ignore[misc]
        def _server_entry(self) -> None:
            app = wrap(DomainDispatcherApplication(create_backend_app))
            self._server = make_server(
                self._ip_address, self._port, app, True, request_handler=MotoRequestHandler
            )
            self._server_ready_event.set()
            self._server.serve_forever()

    return WrappingMotoServer


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
