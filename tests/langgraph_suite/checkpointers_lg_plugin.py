"""pytest plugin loaded into LangGraph's own test suite: our savers in its checkpointer fixtures.

Loaded by ``tests/langgraph_suite/run.py`` as ``-p checkpointers_lg_plugin``
(this folder on ``PYTHONPATH``, so it is never imported as part of our own
``tests`` package: in that process ``tests`` is LangGraph's). It edits none of
LangGraph's files. When LangGraph's ``tests/conftest.py`` is registered (before
pytest reads its fixtures), the plugin replaces that module's
``sync_checkpointer`` and ``async_checkpointer`` fixtures with two of its own,
parametrized over the one saver named by ``CHECKPOINTERS_LG_SAVER`` (its id
in the test ids is in :data:`PARAM_IDS`):

* ``InMemorySaver`` and ``SqliteSaver``: the controls, made by LangGraph's own
  ``tests/conftest_checkpointer.py`` helpers (``_checkpointer_memory``, which is
  its ``InMemorySaver`` subclass asserting that stored checkpoints are never
  mutated; ``_checkpointer_sqlite`` / ``_checkpointer_sqlite_aio``);
* ``ours-memory``, ``ours-sqlite``, ``ours-redis``, ``ours-s3``,
  ``ours-postgres``: our savers, fresh for each test and bound to a fresh
  random user (``for_user(...)``), or unbound with ``CHECKPOINTERS_LG_UNBOUND=1``
  (Redis then gets a fresh key prefix per test instead, PostgreSQL a fresh
  schema). PostgreSQL's schemas (``CHECKPOINTERS_LG_POSTGRES_SCHEMA``, plus a
  suffix per test when unbound) are dropped at the end of the session.

Tests of the selected files that use neither fixture do not depend on the
saver and are deselected. Each test's outcome (and the crash line of a
failure) is written as JSON to ``CHECKPOINTERS_LG_RESULTS`` at the end.
"""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import pytest

SAVER = os.environ.get("CHECKPOINTERS_LG_SAVER", "ours-memory")
RESULTS = os.environ.get("CHECKPOINTERS_LG_RESULTS")
UNBOUND = os.environ.get("CHECKPOINTERS_LG_UNBOUND", "") == "1"
REDIS_URL = os.environ.get("CHECKPOINTERS_LG_REDIS_URL", "")
#: Keys of this run in Redis start with it; removed at the end of the session.
REDIS_PREFIX = os.environ.get("CHECKPOINTERS_LG_REDIS_PREFIX", f"lgsuite-{secrets.token_hex(6)}")
#: Our project's S3 test plugin (moto's conditional-write lock), loaded by path.
S3_PLUGIN = os.environ.get("CHECKPOINTERS_LG_S3_PLUGIN", "")
POSTGRES_URL = os.environ.get("CHECKPOINTERS_LG_POSTGRES_URL", "")
POSTGRES_SCHEMA = os.environ.get("CHECKPOINTERS_LG_POSTGRES_SCHEMA", f"lgsuite_{secrets.token_hex(6)}")
FIXTURES = ("sync_checkpointer", "async_checkpointer")
SAVERS = ("InMemorySaver", "SqliteSaver", "ours-memory", "ours-sqlite", "ours-redis", "ours-s3", "ours-postgres")
#: The saver's id in the test ids. The controls keep LangGraph's own ("memory",
#: "sqlite"): its syrupy snapshots are named after them (``test_x[memory]``),
#: and it compares them only on InMemorySaver. Ours have no "-" in them, so a
#: test id splits into its parameters on "-".
PARAM_IDS = {name: {"InMemorySaver": "memory", "SqliteSaver": "sqlite"}.get(name, name.replace("-", "_")) for name in SAVERS}
PARAM_ID = PARAM_IDS.get(SAVER, SAVER)
S3_BUCKET = "checkpointers-lg-suite"

_conftest: Any = None  # LangGraph's tests/conftest.py module, once registered
_results: dict[str, dict[str, Any]] = {}
_keys: dict[str, str] = {}  # nodeid -> the test's id without the saver (same on every saver)
_s3: dict[str, Any] = {}
_schemas: set[str] = set()  # PostgreSQL schemas this session used (dropped at the end)


# -- the fixtures -------------------------------------------------------------------


def _token() -> str:
    # Never uuid.uuid4(): LangGraph's deterministic_uuids fixture mocks it with a
    # sequence, and one draw of ours would shift every id the test expects.
    return secrets.token_hex(16)


def _user() -> str:
    return f"lg-{_token()}"


def _redis_url() -> str:
    if not REDIS_URL:
        pytest.fail("ours-redis: no Redis URL (CHECKPOINTERS_LG_REDIS_URL unset)", pytrace=False)
    prefix = REDIS_PREFIX + (f"-{_token()[:12]}" if UNBOUND else "")
    return f"{REDIS_URL}{'&' if '?' in REDIS_URL else '?'}prefix={prefix}"


def _postgres() -> Any:
    from checkpointers.postgres_saver import PostgresCheckpointer

    if not POSTGRES_URL:
        pytest.fail("ours-postgres: no PostgreSQL URL (CHECKPOINTERS_LG_POSTGRES_URL unset)", pytrace=False)
    schema = POSTGRES_SCHEMA + (f"_{_token()[:8]}" if UNBOUND else "")
    _schemas.add(schema)
    return PostgresCheckpointer(POSTGRES_URL, schema=schema)


def _ours(tmp_path: Path) -> Any:
    """A fresh saver of ours (not yet bound) for SAVER."""
    from checkpointers import savers

    if SAVER == "ours-memory":
        return savers.MemoryCheckpointer()
    if SAVER == "ours-sqlite":
        return savers.SqliteCheckpointer(tmp_path / "state.db")
    if SAVER == "ours-redis":
        return savers.RedisCheckpointer(_redis_url())
    if SAVER == "ours-s3":
        return savers.S3Checkpointer(S3_BUCKET, f"t-{_token()}", client=_s3_client(), max_workers=8)
    if SAVER == "ours-postgres":
        return _postgres()
    raise NotImplementedError(f"unknown saver {SAVER!r} (known: {', '.join(SAVERS)})")


def _bind(saver: Any) -> Any:
    return saver if UNBOUND else saver.for_user(_user())


@contextmanager
def _sync_saver(tmp_path: Path) -> Any:
    if SAVER == "InMemorySaver":
        with _conftest._checkpointer_memory() as saver:
            yield saver
    elif SAVER == "SqliteSaver":
        with _conftest._checkpointer_sqlite() as saver:
            yield saver
    else:
        with _ours(tmp_path) as saver:
            yield _bind(saver)


@asynccontextmanager
async def _async_saver(tmp_path: Path) -> Any:
    if SAVER == "InMemorySaver":
        with _conftest._checkpointer_memory() as saver:
            yield saver
    elif SAVER == "SqliteSaver":
        async with _conftest._checkpointer_sqlite_aio() as saver:
            yield saver
    else:
        async with _ours(tmp_path) as saver:
            yield _bind(saver)


@pytest.fixture(scope="function", params=[PARAM_ID], name="sync_checkpointer")
def _sync_checkpointer(tmp_path: Path) -> Any:
    with _sync_saver(tmp_path) as saver:
        yield saver


@pytest.fixture(scope="function", params=[PARAM_ID], name="async_checkpointer")
async def _async_checkpointer(tmp_path: Path) -> Any:
    async with _async_saver(tmp_path) as saver:
        yield saver


# -- S3 over moto in-process ------------------------------------------------------


def _s3_client() -> Any:
    client = _s3.get("client")
    if client is None:
        pytest.fail("ours-s3: moto was not started", pytrace=False)
    return client


def _start_moto() -> None:
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        os.environ[name] = value
    if S3_PLUGIN:  # the project's lock making moto's conditional writes atomic, as S3's are
        spec = importlib.util.spec_from_file_location("checkpointers_s3_test_plugin", S3_PLUGIN)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        module._make_moto_conditional_writes_atomic()
    import boto3
    from botocore.config import Config
    from moto import mock_aws

    mock = mock_aws()
    mock.start()
    client = boto3.client(
        "s3",
        region_name="us-east-1",
        config=Config(retries={"mode": "standard", "max_attempts": 3}, max_pool_connections=32),
    )
    client.create_bucket(Bucket=S3_BUCKET)
    _s3.update(mock=mock, client=client)


# -- hooks --------------------------------------------------------------------------


@pytest.hookimpl(tryfirst=True)
def pytest_plugin_registered(plugin: Any, plugin_name: str) -> None:
    """Swap LangGraph's checkpointer fixtures for ours before pytest reads its conftest."""
    global _conftest
    if not (plugin_name or "").replace(os.sep, "/").endswith("tests/conftest.py"):
        return
    missing = [name for name in FIXTURES if not hasattr(plugin, name)]
    if missing:
        raise pytest.UsageError(f"{plugin_name} defines no {missing}: this LangGraph's tests select savers differently")
    _conftest = plugin
    plugin.sync_checkpointer = _sync_checkpointer
    plugin.async_checkpointer = _async_checkpointer


def pytest_configure(config: pytest.Config) -> None:
    if SAVER not in SAVERS:
        raise pytest.UsageError(f"CHECKPOINTERS_LG_SAVER={SAVER!r}: known savers are {', '.join(SAVERS)}")
    if SAVER == "ours-s3":
        _start_moto()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep only the tests that run on a checkpointer fixture (the others do not depend on it)."""
    keep, drop = [], []
    for item in items:
        callspec = getattr(item, "callspec", None)
        params = getattr(callspec, "params", {})
        if any(name in params for name in FIXTURES):
            keep.append(item)
            # The same test on another saver: the same parameters but the saver's.
            # (Not the id with the saver's id taken out: "memory" is both
            # InMemorySaver's id and one of the cache fixture's.)
            others = sorted((k, i) for k, i in callspec.indices.items() if k not in FIXTURES)
            _keys[item.nodeid] = item.nodeid.partition("[")[0] + "[" + ",".join(f"{k}={i}" for k, i in others) + "]"
        else:
            drop.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def _crash_line(report: pytest.TestReport) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        message = str(crash.message).strip().splitlines() or [""]
        return f"{Path(str(crash.path)).name}:{crash.lineno}: {message[0][:300]}"
    text = str(report.longrepr or "").strip().splitlines()
    return text[-1][:300] if text else ""


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    entry = _results.setdefault(report.nodeid, {"outcome": "passed", "crash": "", "key": _keys.get(report.nodeid, report.nodeid)})
    if report.when == "call" and report.passed:
        entry["duration"] = round(report.duration, 3)
    if report.failed:
        if entry["outcome"] != "failed":  # the first failure (setup, call or teardown) is the cause
            entry["outcome"] = "failed" if report.when == "call" else "error"
            entry["when"] = report.when
            entry["crash"] = _crash_line(report)
    elif report.skipped and entry["outcome"] == "passed":
        xfail = hasattr(report, "wasxfail")
        entry["outcome"] = "xfailed" if xfail else "skipped"
        if not xfail and isinstance(report.longrepr, tuple):
            entry["crash"] = str(report.longrepr[2])[:300]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if RESULTS:
        from importlib import metadata

        import checkpointers

        Path(RESULTS).write_text(
            json.dumps(
                {
                    "saver": SAVER,
                    "param_id": PARAM_ID,
                    "unbound": UNBOUND,
                    "langgraph": metadata.version("langgraph"),
                    "exitstatus": int(exitstatus),
                    "checkpointers": str(Path(checkpointers.__file__).parent),
                    "results": _results,
                },
                indent=1,
                sort_keys=True,
            )
        )
    if SAVER == "ours-redis" and REDIS_URL:
        _drop_redis_keys()
    if _schemas:
        _drop_postgres_schemas()
    mock = _s3.pop("mock", None)
    if mock is not None:
        mock.stop()


def _drop_postgres_schemas() -> None:
    """Drop this session's PostgreSQL schemas (and only those)."""
    import psycopg

    try:
        with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
            for schema in sorted(_schemas):
                conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    except Exception as exc:  # cleanup only: report, never fail the run
        print(f"\ncheckpointers_lg_plugin: could not drop PostgreSQL schemas {sorted(_schemas)}: {exc!r}")


def _drop_redis_keys() -> None:
    """Remove this run's keys (and only those: they all start with REDIS_PREFIX)."""
    import redis

    try:
        client = redis.Redis.from_url(REDIS_URL.split("?")[0])
        batch = []
        for key in client.scan_iter(match=f"{REDIS_PREFIX}*", count=1000):
            batch.append(key)
            if len(batch) >= 500:
                client.unlink(*batch)
                batch.clear()
        if batch:
            client.unlink(*batch)
        client.close()
    except Exception as exc:  # cleanup only: report, never fail the run
        print(f"\ncheckpointers_lg_plugin: could not remove Redis keys {REDIS_PREFIX}*: {exc!r}")
