"""Adversarial isolation properties, generated with ``hypothesis``.

Each ``check_prop_*`` is an async check like the fixed ones (a function of a
backend, an :class:`~checkpointers.conformance.contract.Api`, ...) that runs a
hypothesis property: ids drawn from :mod:`.strategies`, two users per example,
every read, list, partition listing, drop and delete path, through the sync
and the async methods (drawn per example).

How many examples run is set by :func:`property_settings`: a small, fixed-seed
run by default (CI), many random ones with ``deep=True`` (``--deep``). Change
it for a whole run with :func:`use_depth`.

Property bodies are coroutines run on the caller's event loop (where the
backend's connections live); hypothesis itself runs in a worker thread and
waits for each example, so shrinking works as usual and a failure reports the
smallest falsifying example.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Coroutine
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from ..backends.base import Backend, Delete, ListQuery
from ..flows import Flow, arun, drop, get, listing, make_put, partitions, run, write
from ..names import Partition, encode_component
from .contract import Api, only_modes
from .strategies import (
    any_text,
    backend_names,
    distinct_pairs,
    item_keys,
    scope_names,
    user_pairs,
)

__all__ = [
    "PROPERTY_CHECKS_BACKEND",
    "PROPERTY_CHECKS_STORE",
    "check_prop_backend_isolation",
    "check_prop_encoding",
    "check_prop_store_isolation",
    "property_settings",
    "run_property",
    "use_depth",
]

_DEPTH = {"deep": False, "shrink": True}
#: Examples per property per target: (fixed-seed CI run, --deep run).
IO_EXAMPLES = (5, 300)
PURE_EXAMPLES = (50, 5_000)


def use_depth(deep: bool, *, shrink: bool = True) -> None:
    """Make every property of this process run the CI (False) or deep (True) amount.

    ``shrink=False`` reports the first failing example as found, without
    minimizing it (faster when a failure is expected, as in our own tests).
    """
    _DEPTH["deep"] = deep
    _DEPTH["shrink"] = shrink


def property_settings(*, pure: bool = False, deep: bool | None = None) -> settings:
    """Hypothesis settings for one property: few fixed-seed examples, or many random.

    ``pure`` properties do no I/O and get many more examples.
    """
    deep = _DEPTH["deep"] if deep is None else deep
    counts = PURE_EXAMPLES if pure else IO_EXAMPLES
    phases = list(Phase) if _DEPTH["shrink"] else [p for p in Phase if p is not Phase.shrink]
    return settings(
        phases=phases,
        max_examples=counts[1] if deep else counts[0],
        derandomize=not deep,
        deadline=None,
        database=None,
        report_multiple_bugs=False,
        suppress_health_check=list(HealthCheck),
    )


async def run_property(
    body: Callable[..., Coroutine[Any, Any, None]],
    strategies: dict[str, st.SearchStrategy[Any]],
    *,
    pure: bool = False,
) -> None:
    """Run ``body(**drawn)`` for many draws of ``strategies``; re-raise the smallest failure.

    The failing example is added to the ``AssertionError`` message.
    """
    loop = asyncio.get_running_loop()

    @property_settings(pure=pure)
    @given(**strategies)
    def example(**drawn: Any) -> None:
        asyncio.run_coroutine_threadsafe(body(**drawn), loop).result()

    try:
        await asyncio.to_thread(example)
    except AssertionError as exc:
        notes = [n for n in getattr(exc, "__notes__", []) if "Falsifying" in n or "=" in n]
        raise AssertionError(f"{exc}\n" + "\n".join(notes)) from exc


async def _drive(flow: Flow[Any], backend: Backend, sync: bool) -> Any:
    """Run one flow with the backend's sync methods (in a thread) or async ones."""
    if sync:
        return await asyncio.to_thread(run, flow, backend)
    return await arun(flow, backend)


# -- (a) the encoding --------------------------------------------------------

_SAFE = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_%-")


async def check_prop_encoding() -> None:
    """encode_component is injective and glob-safe; partition keys never nest."""

    async def body(a: tuple[str, str], spaces: tuple[str, str], names: tuple[str, str]) -> None:
        ea, eb = encode_component(a[0]), encode_component(a[1])
        for raw, enc in ((a[0], ea), (a[1], eb)):
            assert enc and set(enc) <= _SAFE, f"encode_component({raw!r}) = {enc!r} has unsafe chars"
        assert ea != eb, f"encode_component collides: {a[0]!r} and {a[1]!r} -> {ea!r}"
        parts = [Partition(u, s, n) for u in a for s in spaces for n in names]
        keys = {(p.user, p.space, p.name): (p.key, p.user_key) for p in parts}
        assert len({k for k, _ in keys.values()}) == len(keys), f"Partition.key collides among {keys}"
        for t1, (k1, uk1) in keys.items():
            for t2, (k2, _) in keys.items():
                if t1 == t2:
                    continue
                assert not k2.startswith(k1 + "/"), f"key of {t1} prefixes key of {t2}"
                if t1[:2] != t2[:2]:
                    assert not k2.startswith(uk1), f"user_key of {t1} prefixes key of {t2}"

    await run_property(
        body,
        {
            "a": distinct_pairs(any_text(), keep=lambda s: True),
            "spaces": st.tuples(st.sampled_from(["items", "langgraph"]), any_text()),
            "names": distinct_pairs(any_text(), keep=lambda s: True),
        },
        pure=True,
    )


# -- (b) the raw backend -----------------------------------------------------


def _isolation_flow(
    users: tuple[str, str], space: str, parts: list[str], names: list[str]
) -> Flow[None]:
    """Both users write the same partition and record names; neither sees the other."""

    def value(u: int, p: str, n: str) -> bytes:
        return f"{u}|{p}|{n}".encode("utf-8", "surrogatepass")

    def own(u: int, p: str) -> list[tuple[str, bytes]]:
        return sorted((n, value(u, p, n)) for n in names)

    for u, user in enumerate(users):
        for p in parts:
            yield from write(Partition(user, space, p), [make_put(n, value(u, p, n)) for n in names])
    for u, user in enumerate(users):
        got_parts = yield from partitions(user, space)
        assert sorted(got_parts) == sorted(parts), f"partitions({user!r}) = {got_parts}, wrote {parts}"
        for p in parts:
            part = Partition(user, space, p)
            listed = yield from listing(part, ListQuery())
            assert sorted((r.name, r.value) for r in listed) == own(u, p), (user, p, listed)
            got = yield from get(part, names)
            assert [r and r.value for r in got] == [value(u, p, n) for n in names], (user, p, got)
            for n in names:
                pre = yield from listing(part, ListQuery(prefix=n, order="seq", descending=True))
                assert {r.value for r in pre} <= {v for _, v in own(u, p)}, (user, p, n, pre)
    # B deletes a record and drops a partition: A's are untouched.
    victim, other = Partition(users[1], space, parts[0]), Partition(users[0], space, parts[0])
    yield from write(victim, [], [Delete(names[0])])
    got = yield from get(other, names)
    assert [r and r.value for r in got] == [value(0, parts[0], n) for n in names], "B's delete hit A"
    yield from drop(victim)
    listed = yield from listing(other, ListQuery())
    assert sorted((r.name, r.value) for r in listed) == own(0, parts[0]), "B's drop hit A"
    got_parts = yield from partitions(users[0], space)
    assert sorted(got_parts) == sorted(parts), f"after B's drop, A's partitions are {got_parts}"
    for user in users:
        for p in parts:
            yield from drop(Partition(user, space, p))


async def check_prop_backend_isolation(backend: Backend) -> None:
    """Two hostile users' records never meet through get/list/partitions/write/drop."""

    async def body(users: tuple[str, str], parts: list[str], names: list[str], sync: bool) -> None:
        space = f"conformance-{uuid.uuid4().hex}"
        await _drive(_isolation_flow(users, space, parts, names), backend, sync)

    await run_property(
        body,
        {
            "users": user_pairs(),
            "parts": st.lists(any_text(), min_size=1, max_size=3, unique=True),
            "names": st.lists(backend_names(), min_size=1, max_size=3, unique=True),
            "sync": st.booleans(),
        },
    )


# -- (b) the Store -----------------------------------------------------------


@only_modes("async")  # each example draws sync or async itself
async def check_prop_store_isolation(api: Api) -> None:
    """Two hostile users with the same scope and keys never see or change each other's."""

    async def body(users: tuple[str, str], scope: str, keys: list[str], sync: bool) -> None:
        tag = f"cf{uuid.uuid4().hex[:8]}-"
        a, b = (Api(api.store.for_user(tag + u), sync=sync) for u in users)
        for i, view in enumerate((a, b)):
            for k in keys:
                await view.set(scope, k, [i, k])
            await view.step(scope, "1", i)
        for i, view in enumerate((a, b)):
            items = await view.list(scope)
            assert sorted(it.key for it in items) == sorted(keys + ["steps/1"]), (users[i], items)
            assert all(it.value in ([i, it.key], i) for it in items), (users[i], items)
            for k in keys:
                assert (await view.get(scope, k)).value == [i, k], (users[i], k)
                listed = await view.list(scope, prefix=k)
                assert all(it.value in ([i, it.key], i) for it in listed), (users[i], k, listed)
        before = await a.snapshot(scope)
        for k in keys:
            assert await b.delete(scope, k) is True
        await b.step(scope, "2", "b only")
        assert await a.snapshot(scope) == before, f"user {users[1]!r} changed {users[0]!r}'s scope"
        assert await a.get(scope, "steps/2") is None

    await run_property(
        body,
        {
            "users": user_pairs(),
            "scope": scope_names(),
            "keys": st.lists(item_keys(), min_size=1, max_size=3, unique=True).filter(
                lambda ks: not any(k.startswith("steps/") for k in ks)
            ),
            "sync": st.booleans(),
        },
    )


PROPERTY_CHECKS_BACKEND = [check_prop_backend_isolation]
PROPERTY_CHECKS_STORE = [check_prop_store_isolation]
