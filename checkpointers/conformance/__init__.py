"""The contract and isolation conformance suite, runnable against any backend.

Checks are plain async functions; each raises ``AssertionError`` naming the
failing case. Two kinds exist:

* **store checks** take an :class:`Api` (a :class:`~checkpointers.Store`
  bound to a fresh user, driven through its async or its sync methods);
* **backend checks** take a :class:`~checkpointers.backends.Backend` and test
  the backend interface directly (conditions, listing, partitions, isolation).

Run them from pytest (see ``tests/test_contract.py``) or with
:func:`run_checks`, which returns one result per check::

    import asyncio
    from checkpointers.backends import MemoryBackend
    from checkpointers.conformance import run_checks

    results = asyncio.run(run_checks(MemoryBackend))
    assert all(r.passed for r in results)
"""

from __future__ import annotations

import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from ..backends.base import Backend
from ..store import Store
from .contract import BACKEND_CHECKS, CONTRACT_CHECKS, Api
from .isolation import BACKEND_ISOLATION_CHECKS, HOSTILE_IDS, ISOLATION_CHECKS

__all__ = [
    "ALL_BACKEND_CHECKS",
    "ALL_STORE_CHECKS",
    "Api",
    "CheckResult",
    "HOSTILE_IDS",
    "run_checks",
]

#: Checks that take an :class:`Api`.
ALL_STORE_CHECKS = CONTRACT_CHECKS + ISOLATION_CHECKS
#: Checks that take a :class:`Backend`.
ALL_BACKEND_CHECKS = BACKEND_CHECKS + BACKEND_ISOLATION_CHECKS


@dataclass(frozen=True)
class CheckResult:
    """Outcome of one check in one mode."""

    name: str
    mode: str
    passed: bool
    detail: str = ""


async def run_checks(
    backend_factory: Callable[[], Backend], *, max_item_bytes: int = 4096
) -> list[CheckResult]:
    """Run every check against fresh backends from ``backend_factory``.

    Store checks run twice (async API and sync API). ``max_item_bytes`` keeps
    the cap checks small and fast; the cap logic is the same at 1 MiB.
    """
    results: list[CheckResult] = []
    for check in ALL_BACKEND_CHECKS:
        results.append(await _one(check, "backend", backend_factory, None, max_item_bytes))
    for check in ALL_STORE_CHECKS:
        for mode in ("async", "sync"):
            results.append(await _one(check, mode, backend_factory, mode == "sync", max_item_bytes))
    return results


async def _one(check, mode, factory, sync, max_item_bytes) -> CheckResult:  # type: ignore[no-untyped-def]
    backend = factory()
    try:
        if sync is None:
            await check(backend)
        else:
            store = Store(backend, max_item_bytes=max_item_bytes).for_user(f"u-{uuid.uuid4().hex}")
            await check(Api(store, sync=sync))
        return CheckResult(check.__name__, mode, True)
    except AssertionError as exc:
        return CheckResult(check.__name__, mode, False, str(exc) or traceback.format_exc())
    except Exception as exc:  # a crash is a failure too, reported with its type
        return CheckResult(check.__name__, mode, False, f"{type(exc).__name__}: {exc}")
    finally:
        await backend.aclose()
