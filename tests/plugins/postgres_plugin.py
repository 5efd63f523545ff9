"""PostgreSQL for the tests: a real server, found or started, never a fake.

Where the server comes from, in order:

1. ``POSTGRES_URL`` when set (used as is);
2. the server on ``127.0.0.1:5432`` (database ``test``, user ``postgres`` or
   the current user, trust auth) when it answers;
3. a throwaway cluster (:class:`PostgresCluster`: ``initdb`` + ``pg_ctl`` on a
   free loopback port, in a temporary directory) when the binaries exist;
4. a ``testcontainers`` PostgreSQL when the package and Docker are available;
5. otherwise the PostgreSQL tests skip with the reason, except under
   ``CI=true``, where a missing PostgreSQL fails them.

The session works in its own schema (``cpt_<random>``), migrated once and
dropped at the end; ``postgres_backend`` yields a backend on it and empties
the tables after each test (a few ``DELETE``s: the shared bodies run ~600
tests per backend, so no per-test schema). Unless the server comes from
``POSTGRES_URL`` (which may be a PgBouncer that refuses startup options), the
session's connections run with ``synchronous_commit=off``: a commit returns
before its WAL reaches the disk (7 ms -> 0.08 ms per commit on this machine),
which only a crash of the server's machine could undo. The tests that crash
a server use a cluster of their own (:class:`PostgresCluster`), without it.
"""

from __future__ import annotations

import getpass
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from benchmarks.services import free_port

IN_CI = os.environ.get("CI", "").lower() == "true"
_LOCAL = "postgresql://{user}@127.0.0.1:5432/test"


def unavailable(reason: str) -> None:
    """Skip the test with ``reason``, or fail it under ``CI=true``."""
    if IN_CI:
        pytest.fail(f"PostgreSQL is required under CI=true: {reason}", pytrace=False)
    pytest.skip(reason)


def answers(url: str) -> bool:
    """Whether a PostgreSQL server accepts a connection at ``url`` (within 3 s)."""
    import psycopg

    try:
        with psycopg.connect(url, connect_timeout=3):
            return True
    except psycopg.Error:
        return False


def with_query(url: str, **query: str) -> str:
    """``url`` with ``query`` options appended."""
    parts = urlsplit(url)
    extra = "&".join(f"{k}={v}" for k, v in query.items())
    return urlunsplit(parts._replace(query=f"{parts.query}&{extra}" if parts.query else extra))


class PostgresCluster:
    """A throwaway PostgreSQL cluster: ``initdb`` in a temporary directory, ``pg_ctl`` on a loopback port.

    Runs as the ``postgres`` OS user when this process is root (``initdb``
    refuses root). ``fsync`` is off: the cluster lives for one test session
    (a process crash or ``pg_ctl stop -m immediate`` loses nothing the OS
    holds; only a machine crash would).
    """

    def __init__(self, port: int | None = None) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="cp-pg-"))
        self.port = port or free_port()
        self.data = self.root / "data"
        self._user = "postgres" if os.geteuid() == 0 else None
        if self._user is not None:
            shutil.chown(self.root, self._user)

    @staticmethod
    def available() -> bool:
        return shutil.which("initdb") is not None and shutil.which("pg_ctl") is not None

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str) -> None:
        done = subprocess.run(args, capture_output=True, text=True, timeout=120, user=self._user, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed: {done.stdout} {done.stderr}")

    def start(self) -> PostgresCluster:
        if not self.data.exists():
            self._run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync")
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={self.root} "
            "-c fsync=off -c full_page_writes=off -c max_connections=200"
        )
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "log"), "-o", options, "-w", "start")
        return self

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``immediate``: like a crash, recovery from the WAL at the next start)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def destroy(self) -> None:
        try:
            self.stop("immediate")
        except RuntimeError:
            pass  # not running
        shutil.rmtree(self.root, ignore_errors=True)


def _find_server() -> tuple[str | None, str]:
    """A reachable server that is already running: (url, why not)."""
    url = os.environ.get("POSTGRES_URL")
    if url:
        return url, ""
    for user in dict.fromkeys(("postgres", getpass.getuser())):
        if answers(_LOCAL.format(user=user)):
            return _LOCAL.format(user=user), ""
    return None, "POSTGRES_URL unset and nothing answers on 127.0.0.1:5432 (database test)"


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """The URL of a PostgreSQL server for this session (see the module docstring)."""
    url, why = _find_server()
    if url is not None:
        yield url
        return
    if PostgresCluster.available():
        cluster = PostgresCluster().start()
        try:
            yield cluster.url
        finally:
            cluster.destroy()
        return
    yield from _container(why)


def _container(why: str) -> Iterator[str]:
    try:
        from testcontainers.postgres import PostgresContainer  # type: ignore[import-not-found]
    except ImportError:
        unavailable(f"no PostgreSQL: {why}, no initdb/pg_ctl on PATH, testcontainers not installed")
        return
    try:
        container: Any = PostgresContainer("postgres:16-alpine").start()
    except Exception as exc:  # Docker absent or not running
        unavailable(f"no PostgreSQL: {why}, no initdb/pg_ctl on PATH, Docker failed: {exc}")
        return
    try:
        yield container.get_connection_url(driver=None)
    finally:
        container.stop()


@pytest.fixture(scope="session")
def postgres_schema_url(postgres_url: str) -> Iterator[str]:
    """``postgres_url`` with this session's own schema (migrated once, dropped at the end)."""
    import psycopg

    from checkpointers.backends.postgres import PostgresBackend

    schema = f"cpt_{uuid.uuid4().hex[:12]}"
    url = with_query(postgres_url, schema=schema)
    if not os.environ.get("POSTGRES_URL"):
        url = with_query(url, options="-csynchronous_commit%3Doff")
    with PostgresBackend.from_url(url) as backend:
        backend.migrate()
    try:
        yield url
    finally:
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


@pytest.fixture(scope="session")
def _postgres_admin(postgres_url: str) -> Iterator[Any]:
    import psycopg

    with psycopg.connect(postgres_url, autocommit=True) as conn:
        yield conn


@pytest.fixture
def postgres_backend(postgres_schema_url: str, _postgres_admin: Any) -> Iterator[object]:
    """A PostgresBackend on the session's schema, emptied after the test."""
    from checkpointers.backends.postgres import PostgresBackend

    backend = PostgresBackend.from_url(postgres_schema_url, timeout=5)
    try:
        yield backend
    finally:
        backend.close()
        s = backend.schema
        _postgres_admin.execute(f"DELETE FROM {s}.tags; DELETE FROM {s}.records; DELETE FROM {s}.partitions")
