"""A pytest plugin: run the conformance suite against your own backend, saver or storage.

Enable it in your ``conftest.py`` and call the ``checkpointers_conformance``
fixture from an async test (``pytest-asyncio`` or ``anyio``) with your
factories; the test fails with the full report if any check fails::

    # conftest.py
    pytest_plugins = ["checkpointers.conformance.pytest_plugin"]

    # test_my_backend.py
    from my_company.store import MyBackend

    async def test_my_backend_conforms(checkpointers_conformance):
        await checkpointers_conformance(backend_factory=MyBackend)

    async def test_my_saver_isolates(checkpointers_conformance):
        await checkpointers_conformance(saver_for=lambda user: my_saver.for_tenant(user))

Keyword arguments are those of :func:`checkpointers.conformance.run_suite`
(``backend_factory``, ``saver_for``, ``storage_for``, ``store_factory``,
``groups``). If your suite defines a ``--deep`` option (as ours does), the
hypothesis properties run many random examples under it; otherwise a small,
fixed-seed run.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from .properties import use_depth
from .runner import Report, run_suite

__all__ = ["checkpointers_conformance"]


@pytest.fixture
def checkpointers_conformance(request: pytest.FixtureRequest) -> Callable[..., Awaitable[Report]]:
    """``await checkpointers_conformance(**targets)``: run the suite, fail the test on a failure."""
    try:
        deep = bool(request.config.getoption("--deep"))
    except ValueError:
        deep = False

    async def run(**targets: Any) -> Report:
        use_depth(deep)
        report = await run_suite(target=request.node.name, **targets)
        if not report.passed_all():
            pytest.fail(report.format(), pytrace=False)
        return report

    return run
