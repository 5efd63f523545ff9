"""The contract and isolation suite (checkpointers.conformance) on every backend.

Fixed checks run through the async and the sync API; the hypothesis
properties (fixed seed, few examples; many with ``--deep``) draw hostile ids
and the API mode per example.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from checkpointers import Store
from checkpointers.backends import Backend
from checkpointers.conformance import ALL_BACKEND_CHECKS, ALL_STORE_CHECKS, Api, modes_of
from checkpointers.conformance.agent_framework_checks import check_agent_framework_isolation
from checkpointers.conformance.langgraph_checks import check_langgraph_isolation
from checkpointers.conformance.properties import (
    PROPERTY_CHECKS_BACKEND,
    PROPERTY_CHECKS_STORE,
    check_prop_encoding,
    use_depth,
)
from checkpointers.conformance.runner import saver_binder, storage_binder

STORE_CASES = [
    pytest.param(check, mode, id=f"{check.__name__}-{mode}")
    for check in ALL_STORE_CHECKS + PROPERTY_CHECKS_STORE
    for mode in modes_of(check)
]


@pytest.fixture(autouse=True)
def _depth(request: pytest.FixtureRequest) -> Iterator[None]:
    use_depth(bool(request.config.getoption("--deep")))
    yield
    use_depth(False)


@pytest.mark.parametrize(("check", "mode"), STORE_CASES)
async def test_store_contract(backend: Backend, check, mode: str) -> None:  # type: ignore[no-untyped-def]
    store = Store(backend, max_item_bytes=4096).for_user("conformance-user")
    await check(Api(store, sync=mode == "sync"))


@pytest.mark.parametrize("check", ALL_BACKEND_CHECKS + PROPERTY_CHECKS_BACKEND, ids=lambda c: c.__name__)
async def test_backend_contract(backend: Backend, check) -> None:  # type: ignore[no-untyped-def]
    await check(backend)


async def test_langgraph_isolation(backend: Backend) -> None:
    """Every saver method, hostile users/threads/namespaces (checkpointers.savers)."""
    note = await check_langgraph_isolation(saver_binder()(backend))
    assert note == "", note  # our saver implements every optional method


async def test_agent_framework_isolation(backend: Backend) -> None:
    """get_latest/list/load/delete of two hostile users on one hostile workflow name."""
    await check_agent_framework_isolation(storage_binder()(backend))


async def test_encoding_property() -> None:
    """encode_component is injective and glob-free; partition keys never nest (no backend)."""
    await check_prop_encoding()
