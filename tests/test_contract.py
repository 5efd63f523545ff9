"""The contract and isolation suite (checkpointers.conformance) on every backend."""

from __future__ import annotations

import pytest

from checkpointers import Store
from checkpointers.backends import Backend
from checkpointers.conformance import ALL_BACKEND_CHECKS, ALL_STORE_CHECKS, Api


@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
@pytest.mark.parametrize("check", ALL_STORE_CHECKS, ids=lambda c: c.__name__)
async def test_store_contract(backend: Backend, check, sync: bool) -> None:  # type: ignore[no-untyped-def]
    store = Store(backend, max_item_bytes=4096).for_user("conformance-user")
    await check(Api(store, sync=sync))


@pytest.mark.parametrize("check", ALL_BACKEND_CHECKS, ids=lambda c: c.__name__)
async def test_backend_contract(backend: Backend, check) -> None:  # type: ignore[no-untyped-def]
    await check(backend)
