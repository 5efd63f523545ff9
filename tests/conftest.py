"""One test body, every backend.

Each backend contributes one fixture named ``<name>_backend`` that yields a
fresh, empty :class:`~checkpointers.backends.Backend` (memory and SQLite here,
Redis, S3 and PostgreSQL in ``tests/plugins``). The ``backend`` fixture is parametrized
over :data:`BACKEND_NAMES`; adding a backend means adding one fixture and one
name.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from checkpointers import Store
from checkpointers.backends import Backend, MemoryBackend

pytest_plugins = ["tests.plugins.redis_plugin", "tests.plugins.s3_plugin", "tests.plugins.postgres_plugin"]

#: Every backend the shared test bodies run against.
BACKEND_NAMES = ["memory", "sqlite", "redis", "redis_stock", "redis_cluster", "s3", "s3_http", "postgres"]
IN_CI = os.environ.get("CI", "").lower() == "true"
#: Per-test timeout under --deep (the default, 300 s, is in pyproject.toml).
DEEP_TIMEOUT = 3600


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--deep",
        action="store_true",
        default=False,
        help="run deep checks: many hypothesis examples, long crash loops",
    )


def pytest_configure(config: pytest.Config) -> None:
    from hypothesis import settings

    settings.register_profile("ci", max_examples=40, derandomize=True, deadline=None)
    settings.register_profile("deep", max_examples=2000, deadline=None)
    settings.load_profile("deep" if config.getoption("--deep") else "ci")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Deep checks are deselected (not skipped) without --deep, so the summary
    # never counts them as run: "N deselected" says what was left out.
    # A module may name backends whose cases only run under --deep
    # (``DEEP_BACKENDS = {"s3_http"}``): the same logic is covered on a faster
    # form of that backend in the normal run.
    for item in items:
        callspec = getattr(item, "callspec", None)
        deep_backends = getattr(getattr(item, "module", None), "DEEP_BACKENDS", ())
        if callspec is not None and callspec.params.get("backend_name") in deep_backends:
            item.add_marker(pytest.mark.deep)
    if config.getoption("--deep"):
        # Hundreds of examples per property take minutes per test on S3 over
        # HTTP (the langgraph isolation property went past the 300 s default).
        for item in items:
            item.add_marker(pytest.mark.timeout(DEEP_TIMEOUT))
        return
    deep = [item for item in items if "deep" in item.keywords]
    if deep:
        config.hook.pytest_deselected(items=deep)
        items[:] = [item for item in items if "deep" not in item.keywords]


@pytest.fixture
def memory_backend() -> Iterator[Backend]:
    with MemoryBackend() as backend:
        yield backend


@pytest.fixture
def sqlite_backend(tmp_path: Path) -> Iterator[Backend]:
    from checkpointers.backends.sqlite import SqliteBackend

    with SqliteBackend(tmp_path / "state.db") as backend:
        yield backend


@pytest.fixture(params=BACKEND_NAMES)
def backend_name(request: pytest.FixtureRequest) -> str:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def backend(request: pytest.FixtureRequest, backend_name: str) -> Backend:
    """A fresh, empty backend of every kind in turn."""
    return request.getfixturevalue(f"{backend_name}_backend")  # type: ignore[no-any-return]


@pytest.fixture
def store(backend: Backend) -> Store:
    """A store bound to a fresh user on every backend."""
    return Store(backend).for_user(f"u-{uuid.uuid4().hex}")
