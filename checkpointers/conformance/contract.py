"""Contract checks: what every backend must do through the item API.

Each check is a plain async function of an :class:`Api` (a store bound to a
fresh user, driven sync or async) and raises ``AssertionError`` with the
failing case on a violation.
"""

from __future__ import annotations

import asyncio
import builtins
import threading
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from ..backends.base import Backend, Delete, ListQuery, Mode, Put
from ..errors import (
    ConcurrencyError,
    CorruptItemError,
    InvalidNameError,
    ItemTooLargeError,
    StepMismatchError,
    TooManyTagsError,
)
from ..flows import digest, make_put
from ..names import Partition
from ..store import Store, _name

__all__ = ["Api", "CONTRACT_CHECKS", "BACKEND_CHECKS", "modes_of"]

F = TypeVar("F", bound=Callable[..., Any])


def only_modes(*modes: str) -> Callable[[F], F]:
    """Mark a store check as meaningful in some API modes only (``"sync"``, ``"async"``)."""

    def mark(check: F) -> F:
        check.modes = modes  # type: ignore[attr-defined]
        return check

    return mark


def modes_of(check: Callable[..., Any]) -> tuple[str, ...]:
    """The API modes a store check runs in (both unless marked with :func:`only_modes`)."""
    return getattr(check, "modes", ("async", "sync"))


class Api:
    """The item API of one store, called through its async or its sync methods.

    With ``sync=True`` every call goes to the sync method on a worker thread,
    so the same check bodies prove sync/async parity.
    """

    def __init__(self, store: Store, *, sync: bool = False) -> None:
        self.store = store
        self.sync = sync

    def for_user(self, user: str) -> Api:
        return Api(self.store.for_user(user), sync=self.sync)

    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        if self.sync:
            return await asyncio.to_thread(getattr(self.store, method), *args, **kwargs)
        return await getattr(self.store, "a" + method)(*args, **kwargs)

    async def create(self, *a: Any, **k: Any) -> Any:
        return await self.call("create_item", *a, **k)

    async def set(self, *a: Any, **k: Any) -> Any:
        return await self.call("set_item", *a, **k)

    async def get(self, *a: Any, **k: Any) -> Any:
        return await self.call("get_item", *a, **k)

    async def delete(self, *a: Any, **k: Any) -> Any:
        return await self.call("delete_item", *a, **k)

    async def list(self, *a: Any, **k: Any) -> Any:
        return await self.call("list_items", *a, **k)

    async def step(self, *a: Any, **k: Any) -> Any:
        return await self.call("append_step", *a, **k)

    async def snapshot(self, scope: str) -> builtins.list[tuple[str, Any, str]]:
        """Everything in ``scope``, for before/after comparisons."""
        return sorted((i.key, repr(i.value), i.etag) for i in await self.list(scope))


async def _raises(exc: type[BaseException], coro: Any, case: str) -> BaseException:
    try:
        await coro
    except exc as e:
        return e
    raise AssertionError(f"{case}: expected {exc.__name__}, nothing was raised")


async def check_roundtrip_bytes_and_json(api: Api) -> None:
    """Bytes and JSON values come back as stored, with tags, etag and digest."""
    a = await api.create("runs/r1", "blob", b"\x00\xffraw", tags={"kind": "raw"})
    b = await api.create("runs/r1", "doc", {"n": 1, "s": "é", "l": [1, 2]})
    got_a, got_b = await api.get("runs/r1", "blob"), await api.get("runs/r1", "doc")
    assert got_a.value == b"\x00\xffraw" and dict(got_a.tags) == {"kind": "raw"}, got_a
    assert got_b.value == {"n": 1, "s": "é", "l": [1, 2]}, got_b
    assert (got_a.etag, got_a.digest) == (a.etag, a.digest)
    assert b.seq > a.seq, "seq must grow with every write"
    assert await api.get("runs/r1", "missing") is None


async def check_create_refuses_existing(api: Api) -> None:
    """create_item on an existing key raises ConcurrencyError and keeps the value."""
    await api.create("s", "k", 1)
    await _raises(ConcurrencyError, api.create("s", "k", 2), "create twice")
    assert (await api.get("s", "k")).value == 1


async def check_etag_changes_and_if_match(api: Api) -> None:
    """Every write moves the etag; set_item(if_match=stale) raises ConcurrencyError."""
    first = await api.set("s", "k", "v1")
    second = await api.set("s", "k", "v1")
    assert first.etag != second.etag, "etag must change on every write, even same value"
    third = await api.set("s", "k", "v2", if_match=second.etag)
    err = await _raises(ConcurrencyError, api.set("s", "k", "v3", if_match=second.etag), "stale etag")
    assert err.expected_etag == second.etag and err.actual_etag == third.etag  # type: ignore[attr-defined]
    assert (await api.get("s", "k")).value == "v2"
    await _raises(ConcurrencyError, api.set("s", "absent", 1, if_match=third.etag), "if_match on absent")
    assert await api.get("s", "absent") is None


async def check_concurrent_if_match_one_winner(api: Api) -> None:
    """Two writers with the same etag: exactly one wins."""
    base = await api.set("s", "counter", 0)
    results = await asyncio.gather(
        *(api.set("s", "counter", i, if_match=base.etag) for i in (1, 2)), return_exceptions=True
    )
    wins = [r for r in results if not isinstance(r, BaseException)]
    losses = [r for r in results if isinstance(r, ConcurrencyError)]
    assert len(wins) == 1 and len(losses) == 1, results
    assert (await api.get("s", "counter")).value == wins[0].value


async def check_delete(api: Api) -> None:
    """delete_item reports whether it deleted (one winner among concurrent deletes); if_match guards it."""
    item = await api.set("s", "k", 1)
    await _raises(ConcurrencyError, api.delete("s", "k", if_match="stale"), "delete stale etag")
    assert await api.get("s", "k") is not None
    assert await api.delete("s", "k", if_match=item.etag) is True
    assert await api.get("s", "k") is None
    assert await api.delete("s", "k") is False
    for _ in range(5):  # of concurrent deletes of one item, exactly one deleted it
        await api.set("s", "k", 1)
        done = await asyncio.gather(*(api.delete("s", "k") for _ in range(4)))
        assert sorted(done) == [False, False, False, True], f"concurrent deletes returned {done}"
        assert await api.get("s", "k") is None


async def check_append_only_steps(api: Api) -> None:
    """Identical re-append is a no-op; a different value raises with both digests."""
    first = await api.step("run", "7", {"result": 42})
    again = await api.step("run", "7", {"result": 42})
    assert first.key == "steps/7" and (again.etag, again.seq) == (first.etag, first.seq)
    err = await _raises(StepMismatchError, api.step("run", "7", {"result": 43}), "different step")
    assert err.stored_digest == first.digest and err.new_digest != first.digest  # type: ignore[attr-defined]
    assert (await api.get("run", "steps/7")).value == {"result": 42}


async def check_size_cap_before_write(api: Api) -> None:
    """Over the cap: ItemTooLargeError names key, size and limit; nothing stored."""
    limit = api.store.max_item_bytes
    await api.set("s", "keep", "x")
    before = await api.snapshot("s")
    err = await _raises(ItemTooLargeError, api.set("s", "big", b"x" * (limit + 1)), "over cap")
    assert (err.key, err.size, err.limit) == ("big", limit + 1, limit)  # type: ignore[attr-defined]
    await _raises(ItemTooLargeError, api.set("s", "keep", b"x" * (limit + 1)), "over cap replace")
    assert await api.snapshot("s") == before, "a refused item changed the store"
    ok = await api.set("s", "edge", b"x" * limit)
    assert len(ok.value) == limit, "a value of exactly the cap must be accepted"


async def check_tag_limit(api: Api) -> None:
    """16 tags are fine, a 17th raises TooManyTagsError and nothing is stored."""
    tags = {f"t{i}": str(i) for i in range(16)}
    assert len((await api.set("s", "ok", 1, tags=tags)).tags) == 16
    err = await _raises(TooManyTagsError, api.set("s", "no", 1, tags={**tags, "t16": "x"}), "17 tags")
    assert (err.count, err.limit) == (17, 16)  # type: ignore[attr-defined]
    assert await api.get("s", "no") is None


async def check_invalid_names(api: Api) -> None:
    """Bad scopes and keys raise InvalidNameError (a ValueError) before any I/O."""
    for scope in ["", "/a", "a/", "a//b", "a/../b", "x" * 129, "a b", "a*", None]:
        await _raises(InvalidNameError, api.set(scope, "k", 1), f"scope {scope!r}")
    for key in ["", "a\x00b", "x" * 257, 5]:
        await _raises(InvalidNameError, api.set("s", key, 1), f"key {key!r}")
    assert issubclass(InvalidNameError, ValueError)


async def check_list_order_prefix_tags_limit(api: Api) -> None:
    """Listing by prefix and tags, newest or oldest first, with a limit."""
    for i in range(6):
        await api.set("s", f"a/{i}", i, tags={"even": str(i % 2 == 0)})
    await api.set("s", "b/0", "other")
    newest = await api.list("s", prefix="a/")
    assert [i.value for i in newest] == [5, 4, 3, 2, 1, 0]
    oldest = await api.list("s", prefix="a/", newest_first=False, limit=2)
    assert [i.value for i in oldest] == [0, 1]
    evens = await api.list("s", tags={"even": "True"}, limit=2)
    assert [i.value for i in evens] == [4, 2]
    await api.set("s", "a/0", 0, tags={"even": "True"})
    assert (await api.list("s", prefix="a/", limit=1))[0].key == "a/0", "rewrite makes it newest"
    assert [i.key for i in await api.list("s", prefix="b/")] == ["b/0"]
    assert await api.list("s", prefix="a/", limit=0) == []


async def check_atomic_batch(api: Api) -> None:
    """A batch whose one condition fails writes nothing; a good batch writes all."""
    store = api.store
    await api.set("s", "exists", 1)
    before = await api.snapshot("s")
    try:
        if api.sync:
            with store.batch("s") as b:
                b.set("new1", 1).append_step("1", "x").create("exists", 2)
        else:
            async with store.abatch("s") as b:
                b.set("new1", 1).append_step("1", "x").create("exists", 2)
    except ConcurrencyError:
        pass
    else:
        raise AssertionError("batch with a failing create did not raise")
    assert await api.snapshot("s") == before, "a refused batch left partial writes"
    if api.sync:
        with store.batch("s") as b:
            b.set("new1", 1).append_step("1", "x").delete("exists")
    else:
        async with store.abatch("s") as b:
            b.set("new1", 1).append_step("1", "x").delete("exists")
    assert [i.key for i in await api.list("s", newest_first=False)] == ["new1", "steps/1"]


@only_modes("sync")
async def check_concurrent_if_match_threads(api: Api) -> None:
    """Two OS threads race set_item(if_match=same etag), many rounds: one winner each."""
    store, rounds = api.store, 20
    barrier = threading.Barrier(2)

    def writer(value: int, etag: str, out: list[Any]) -> None:
        barrier.wait()
        try:
            out.append(store.set_item("s", "counter", value, if_match=etag))
        except ConcurrencyError as exc:
            out.append(exc)

    def start_then_join(threads: list[threading.Thread]) -> None:
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    for r in range(rounds):
        base = store.set_item("s", "counter", -1)
        out: list[Any] = []
        threads = [threading.Thread(target=writer, args=(2 * r + i, base.etag, out)) for i in (0, 1)]
        await asyncio.to_thread(start_then_join, threads)
        wins = [o for o in out if not isinstance(o, BaseException)]
        assert len(wins) == 1 and len(out) == 2, f"round {r}: two threads with one etag -> {out}"
        stored = store.get_item("s", "counter")
        assert stored is not None and stored.value == wins[0].value, f"round {r}: loser's value stored"


async def check_atomic_visibility(api: Api) -> None:
    """A reader polling during many multi-record batches never sees a partial batch."""
    width, batches = 6, 15
    keys = [f"k{j}" for j in range(width)]
    stop = threading.Event()
    seen: list[list[tuple[str, Any]]] = []

    async def writer() -> None:
        for n in range(batches):
            if api.sync:
                def apply(n: int = n) -> None:
                    with api.store.batch("vis") as b:
                        for k in keys:
                            b.set(k, n)
                await asyncio.to_thread(apply)
            else:
                async with api.store.abatch("vis") as b:
                    for k in keys:
                        b.set(k, n)
            await asyncio.sleep(0)  # let the reader in between batches, at least
        stop.set()

    async def reader() -> None:
        while not stop.is_set():
            items = await api.list("vis")
            seen.append(sorted((i.key, i.value) for i in items))
            await asyncio.sleep(0)

    await asyncio.gather(writer(), reader())
    seen.append(sorted((i.key, i.value) for i in await api.list("vis")))
    for snap in seen:
        values = {v for _, v in snap}
        assert not snap or ([k for k, _ in snap] == keys and len(values) == 1), (
            f"a reader saw a partial batch: {snap}"
        )
    assert seen[-1] == [(k, batches - 1) for k in keys], seen[-1]


async def check_corrupt_item_detected(api: Api) -> None:
    """A record whose bytes do not match its digest raises CorruptItemError, never returns."""
    store = api.store
    part = store.partition("s")
    good = await api.set("s", "ok", {"fine": True})
    value = b'j{"v":1}'
    bad = Put(_name("bad"), value, digest(b'j{"v":2}'), "etag-bad")
    undecodable = make_put(_name("garbled"), b"j{not json")
    for put in (bad, undecodable):
        if api.sync:
            result = await asyncio.to_thread(store.backend.write, part, [put])
        else:
            result = await store.backend.awrite(part, [put])
        assert result.conflict is None, result
    await _raises(CorruptItemError, api.get("s", "bad"), "get of an item whose digest is wrong")
    await _raises(CorruptItemError, api.get("s", "garbled"), "get of an undecodable item")
    await _raises(CorruptItemError, api.list("s"), "list over a corrupt item")
    assert (await api.get("s", "ok")).etag == good.etag


CONTRACT_CHECKS = [
    check_roundtrip_bytes_and_json,
    check_create_refuses_existing,
    check_etag_changes_and_if_match,
    check_concurrent_if_match_one_winner,
    check_delete,
    check_append_only_steps,
    check_size_cap_before_write,
    check_tag_limit,
    check_invalid_names,
    check_list_order_prefix_tags_limit,
    check_atomic_batch,
    check_concurrent_if_match_threads,
    check_atomic_visibility,
    check_corrupt_item_detected,
]


# -- checks on the raw backend interface --------------------------------------


def _p(name: str = "p") -> Partition:
    return Partition(f"conformance-{uuid.uuid4().hex}", "raw", name)


async def check_backend_conditions_and_noops(backend: Backend) -> None:
    """Mode rules of base.evaluate(), applied by the backend itself."""
    p = _p()
    r = await backend.awrite(p, [make_put("x", b"1", mode=Mode.CREATE)])
    assert r.conflict is None and len(r.records) == 1, r
    stored = r.records[0]
    again = await backend.awrite(p, [make_put("x", b"1", mode=Mode.APPEND)])
    assert again.conflict is None and again.records[0].seq == stored.seq, "append no-op must keep seq"
    bad = await backend.awrite(p, [make_put("y", b"2"), make_put("x", b"other", mode=Mode.APPEND)])
    assert bad.conflict is not None and bad.conflict.index == 1 and bad.records == [], bad
    assert (await backend.aget(p, ["y"])) == [None], "refused batch wrote its first put"
    stale = await backend.awrite(p, [], [Delete("x", if_match="nope")])
    assert stale.conflict is not None and stale.conflict.index == 0
    ok = await backend.awrite(p, [make_put("x", b"3", mode=Mode.IF_MATCH, if_match=stored.etag)])
    assert ok.conflict is None and ok.records[0].seq > stored.seq


async def check_backend_list_query(backend: Backend) -> None:
    """Prefix is literal (names contain % and _), ranges, orders, tags, values=False."""
    p = _p()
    names = ["a%2F1", "a%2F2", "a_1", "ab", "b"]
    for n in names:
        await backend.awrite(p, [make_put(n, n.encode(), tags={"t": n[:1]})])
    got = await backend.alist(p, ListQuery(prefix="a%2F"))
    assert [r.name for r in got] == ["a%2F1", "a%2F2"], got
    got = await backend.alist(p, ListQuery(prefix="a_"))
    assert [r.name for r in got] == ["a_1"], "prefix must not be a LIKE pattern"
    got = await backend.alist(p, ListQuery(order="name", descending=True, limit=2))
    assert [r.name for r in got] == ["b", "ab"]
    got = await backend.alist(p, ListQuery(order="name", start="a_", stop="b"))
    assert [r.name for r in got] == ["a_1", "ab"]
    got = await backend.alist(p, ListQuery(order="seq", descending=True, tags={"t": "a"}, values=False))
    assert [r.name for r in got] == ["ab", "a_1", "a%2F2", "a%2F1"] and all(r.value == b"" for r in got)
    full = await backend.alist(p, ListQuery(prefix="b"))
    assert full[0].value == b"b" and full[0].digest == digest(b"b")


async def check_backend_list_depth_and_children(backend: Backend) -> None:
    """``depth`` selects one level of the ``/`` tree; ``children`` brings each pick's subtree along.

    The layout mirrors the LangGraph saver's (``c/<ns>/<id>`` with writes
    under ``c/<ns>/<id>/<task>/<i>``), with a tag only on the parents, an
    orphan child whose parent does not exist, and a sibling name that shares
    a parent's text but not its ``/`` (``c/x/2a``).
    """
    p = _p()
    parents = ["c/x/1", "c/x/2", "c/x/2a", "c/x/3", "c/y/1"]
    kids = ["c/x/1/t/0", "c/x/2/t/-1", "c/x/2/t/0", "c/x/2/u/0", "c/x/4/t/0", "c/y/1/t/0"]
    for n in parents:
        await backend.awrite(p, [make_put(n, n.encode(), tags={"k": "c", "n": n[-1]})])
    for n in kids:
        await backend.awrite(p, [make_put(n, n.encode())])

    def names(recs: list[Any]) -> list[str]:
        return [r.name for r in recs]

    got = await backend.alist(p, ListQuery(prefix="c/x/", depth=0))
    assert names(got) == ["c/x/1", "c/x/2", "c/x/2a", "c/x/3"], names(got)
    got = await backend.alist(p, ListQuery(prefix="c/", depth=1, descending=True, limit=3))
    assert names(got) == ["c/y/1", "c/x/3", "c/x/2a"], names(got)
    got = await backend.alist(p, ListQuery(prefix="c/x/", depth=2))
    assert names(got) == ["c/x/1/t/0", "c/x/2/t/-1", "c/x/2/t/0", "c/x/2/u/0", "c/x/4/t/0"], names(got)
    got = await backend.alist(p, ListQuery(prefix="c/x/", depth=0, descending=True, limit=1, children=True))
    assert names(got) == ["c/x/3"], f"c/x/3 has no children (c/x/4/t/0 is not one): {names(got)}"
    got = await backend.alist(
        p, ListQuery(prefix="c/x/", depth=0, descending=True, limit=2, stop="c/x/3", children=True, values=False)
    )
    assert names(got) == ["c/x/2a", "c/x/2", "c/x/2/t/-1", "c/x/2/t/0", "c/x/2/u/0"], names(got)
    assert all(r.value == b"" for r in got), "values=False applies to children too"
    got = await backend.alist(p, ListQuery(prefix="c/", depth=1, children=True, tags={"n": "1"}))
    assert names(got) == ["c/x/1", "c/x/1/t/0", "c/y/1", "c/y/1/t/0"], names(got)
    assert [r.value for r in got] == [n.encode() for n in names(got)]
    got = await backend.alist(
        p, ListQuery(prefix="c/x/", depth=0, order="seq", descending=True, limit=2, children=True)
    )
    assert names(got) == ["c/x/3", "c/x/2a"], names(got)
    got = await backend.alist(p, ListQuery(prefix="c/x/", depth=0, order="seq", limit=1, children=True))
    assert names(got) == ["c/x/1", "c/x/1/t/0"], names(got)


async def check_backend_partitions_and_drop(backend: Backend) -> None:
    """partitions() returns raw names of one user+space only; drop() empties one."""
    user = f"conformance-{uuid.uuid4().hex}"
    odd = ["t/1", "t:2*", "", "é" * 300]
    for name in odd:
        await backend.awrite(Partition(user, "lg", name), [make_put("x", b"1")])
    await backend.awrite(Partition(user + "2", "lg", "other"), [make_put("x", b"1")])
    await backend.awrite(Partition(user, "lg2", "other"), [make_put("x", b"1")])
    assert sorted(await backend.apartitions(user, "lg")) == sorted(odd)
    assert await backend.adrop(Partition(user, "lg", "t/1")) == 1
    assert sorted(await backend.apartitions(user, "lg")) == sorted(odd[1:])
    assert await backend.aget(Partition(user, "lg", "t/1"), ["x"]) == [None]


BACKEND_CHECKS = [
    check_backend_conditions_and_noops,
    check_backend_list_query,
    check_backend_list_depth_and_children,
    check_backend_partitions_and_drop,
]
