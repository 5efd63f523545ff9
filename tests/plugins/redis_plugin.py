"""Redis for the tests: a real server, found or started, never a fake.

Where the server comes from, in order:

1. ``REDIS_URL`` when set (used as is; every test works under its own key
   prefix and removes its keys afterwards);
2. a throwaway ``redis-server`` on a free loopback port, started once per
   session in a temporary directory with persistence off, when the binary is
   on ``PATH`` (Debian: ``apt install redis-server``);
3. a ``testcontainers`` Redis when the package and Docker are available;
4. otherwise the Redis tests skip with the reason, except under ``CI=true``,
   where a missing Redis fails them.

``redis_backend`` and ``redis_stock_backend`` are the backend on each of its
transports (:data:`REDIS_TRANSPORTS`); ``redis_transport`` names each in turn.
``redis_cluster_backend`` runs on a real three-master Redis Cluster started
with ``redis-server --cluster-enabled yes`` and ``redis-cli --cluster create``
on loopback ports (skipped only when the binaries are absent, never under CI).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator

import pytest

# The launchers, shared with the benchmarks (re-exported: tests import them from here).
from benchmarks.services import RedisServer as RedisServer
from benchmarks.services import free_port as free_port

IN_CI = os.environ.get("CI", "").lower() == "true"
_START_TIMEOUT = 15.0


def unavailable(reason: str) -> None:
    """Skip the test with ``reason``, or fail it under ``CI=true``."""
    if IN_CI:
        pytest.fail(f"Redis is required under CI=true: {reason}", pytrace=False)
    pytest.skip(reason)


def have_binaries() -> bool:
    return shutil.which("redis-server") is not None and shutil.which("redis-cli") is not None


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The URL of a Redis server for this session (see the module docstring)."""
    url = os.environ.get("REDIS_URL")
    if url:
        yield url
        return
    if have_binaries():
        server = RedisServer(tmp_path_factory.mktemp("redis"), free_port()).start()
        try:
            yield server.url
        finally:
            server.stop()
        return
    try:
        from testcontainers.redis import RedisContainer  # type: ignore[import-not-found]
    except ImportError:
        unavailable(
            "no Redis: set REDIS_URL, install redis-server (apt install redis-server) "
            "or testcontainers with Docker"
        )
        return
    try:
        container = RedisContainer("redis:7-alpine").start()
    except Exception as exc:  # Docker absent or not running
        unavailable(f"no Redis: REDIS_URL unset, no redis-server binary, Docker failed: {exc}")
        return
    try:
        host = container.get_container_host_ip()
        yield f"redis://{host}:{container.get_exposed_port(6379)}/0"
    finally:
        container.stop()


@pytest.fixture(scope="session")
def redis_cluster_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real 3-master Redis Cluster on loopback ports; the URL of one node."""
    if not have_binaries():
        unavailable("no redis-server/redis-cli binaries to start a Redis Cluster")
    root = tmp_path_factory.mktemp("redis-cluster")
    nodes: list[RedisServer] = []
    try:
        for i in range(3):
            port = free_port(with_bus=True)
            args = [
                "--cluster-enabled", "yes",
                "--cluster-config-file", f"nodes-{port}.conf",
                "--cluster-node-timeout", "5000",
            ]  # fmt: skip
            nodes.append(RedisServer(root / f"node{i}", port, args).start())
        addresses = [f"127.0.0.1:{n.port}" for n in nodes]
        created = subprocess.run(
            ["redis-cli", "--cluster", "create", *addresses, "--cluster-replicas", "0", "--cluster-yes"],
            capture_output=True,
            timeout=60,
            check=False,
        )
        if created.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed: {created.stdout!r} {created.stderr!r}")
        deadline = time.monotonic() + _START_TIMEOUT
        while not all("cluster_state:ok" in n.cli("CLUSTER", "INFO") for n in nodes):
            if time.monotonic() > deadline:
                raise RuntimeError("the Redis Cluster did not reach cluster_state:ok")
            time.sleep(0.1)
        yield f"redis://127.0.0.1:{nodes[0].port}/0?cluster=true"
    finally:
        for node in nodes:
            node.stop()


def _drop_prefix(url: str, prefix: str) -> None:
    """Remove every key under ``prefix`` (test teardown only; glob-safe prefix)."""
    import redis

    cluster = "cluster=true" in url
    client = (
        redis.cluster.RedisCluster.from_url(url.replace("?cluster=true", ""))
        if cluster
        else redis.Redis.from_url(url)
    )
    try:
        keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        for key in keys:  # one by one: keys live in different cluster slots
            client.unlink(key)
    finally:
        client.close()


#: The transports the Redis fixtures come in (``RedisBackend(transport=...)``):
#: test id -> option. ``redis`` is the default (lean, falling back to stock
#: where it cannot run), ``redis_stock`` plain redis-py pipelines. A Cluster
#: always runs on stock, so ``redis_cluster_backend`` needs no second one.
REDIS_TRANSPORTS = {"redis": "lean", "redis_stock": "stock"}


def _backend(url: str, transport: str = "lean") -> Iterator[object]:
    from checkpointers.backends.redis import RedisBackend

    prefix = f"t{uuid.uuid4().hex[:12]}"
    backend = RedisBackend.from_url(url, prefix=prefix, transport=transport)
    try:
        yield backend
    finally:
        backend.close()
        _drop_prefix(url, prefix)


@pytest.fixture
def redis_backend(redis_url: str) -> Iterator[object]:
    """A fresh RedisBackend (own key prefix) on the session's Redis server, lean transport."""
    yield from _backend(redis_url, REDIS_TRANSPORTS["redis"])


@pytest.fixture
def redis_stock_backend(redis_url: str) -> Iterator[object]:
    """The same on the stock transport (public redis-py only)."""
    yield from _backend(redis_url, REDIS_TRANSPORTS["redis_stock"])


@pytest.fixture(params=list(REDIS_TRANSPORTS.values()), ids=list(REDIS_TRANSPORTS))
def redis_transport(request: pytest.FixtureRequest) -> str:
    """Each transport in turn (ids ``redis``, ``redis_stock``), for tests that build their own backends."""
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def redis_cluster_backend(redis_cluster_url: str) -> Iterator[object]:
    """A fresh RedisBackend (own key prefix) on the session's 3-master Redis Cluster."""
    yield from _backend(redis_cluster_url)
