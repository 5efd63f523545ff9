"""The memory backend's async read path: parity with sync, and no Task per operation (h6)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from langgraph.checkpoint.base import empty_checkpoint

from checkpointers.backends.base import ListQuery, Put, Record
from checkpointers.backends.memory import MemoryBackend
from checkpointers.backends.ops import GetOp, ListOp
from checkpointers.names import Partition
from checkpointers.savers import Checkpointer


class _Watched(MemoryBackend):
    """Records the asyncio task each async read runs in."""

    def __init__(self) -> None:
        super().__init__()
        self.tasks: list[asyncio.Task[Any] | None] = []

    async def aget(self, partition: Partition, names: Sequence[str]) -> list[Record | None]:
        self.tasks.append(asyncio.current_task())
        return await super().aget(partition, names)

    async def alist(self, partition: Partition, query: ListQuery) -> list[Record]:
        self.tasks.append(asyncio.current_task())
        return await super().alist(partition, query)


def _filled(b: MemoryBackend) -> Partition:
    p = Partition("u", "s", "t")
    b.write(p, [Put(f"k/{i}", f"v{i}".encode(), f"d{i}", f"e{i}") for i in range(3)])
    return p


def test_amany_runs_in_the_callers_task_through_acall_and_equals_many() -> None:
    b = _Watched()
    p = _filled(b)
    ops = [ListOp(p, ListQuery(prefix="k/")), GetOp(p, ["k/1", "nope"]), ListOp(p, ListQuery(prefix="k/", limit=1))]
    expected = b.many(ops)

    async def main() -> tuple[list[Any], asyncio.Task[Any] | None]:
        return await b.amany(ops), asyncio.current_task()

    got, caller = asyncio.run(main())
    assert got == expected
    # Each op went through its acall (the subclass's async methods), in the caller's own
    # task: asyncio.gather would have wrapped each in a new Task.
    assert len(b.tasks) == len(ops)
    assert all(t is caller for t in b.tasks)


def test_async_saver_listing_creates_no_task_and_matches_sync() -> None:
    b = _Watched()
    saver = Checkpointer(b)
    config: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    for i in range(4):
        c = empty_checkpoint()
        c["id"] = f"1ef0000{i}-0000-6000-8000-000000000000"
        c["channel_values"] = {"x": i}
        c["channel_versions"] = {"x": str(i + 1)}
        config = saver.put(config, c, {"step": i}, {"x": str(i + 1)})
        saver.put_writes(config, [("x", i)], f"task-{i}")
    thread: Any = {"configurable": {"thread_id": "t"}}

    async def main() -> tuple[list[Any], asyncio.Task[Any] | None]:
        return [t async for t in saver.alist(thread, limit=3)], asyncio.current_task()

    b.tasks.clear()
    got, caller = asyncio.run(main())
    assert b.tasks and all(t is caller for t in b.tasks)
    assert got == list(saver.list(thread, limit=3))


def _reference(b: MemoryBackend, p: Partition, q: ListQuery) -> list[tuple[str, bytes]]:
    """What a name-order listing must return, by brute force over every record."""
    every = sorted(b.list(p, ListQuery()), key=lambda r: r.name)
    picks = [r for r in every if q.matches(r)]
    if q.descending:
        picks.reverse()
    out: list[tuple[str, bytes]] = []
    for r in picks[: q.limit]:
        out.append((r.name, r.value if q.values else b""))
        if q.children:
            out += [(c.name, c.value if q.values else b"") for c in every if c.name.startswith(r.name + "/")]
    return out


def test_name_order_listing_matches_a_brute_force_reading() -> None:
    # Names that sort between a record and its children (``a-x``, ``a%``, ``a.``
    # before ``a/``) and children of children: the index walk must not take them for children.
    b = MemoryBackend()
    p = Partition("u", "s", "t")
    names = [
        "c/a", "c/a-x", "c/a%y", "c/a.z", "c/a/w1", "c/a/w2", "c/a/w2/deep", "c/a-x/w3", "c/b", "c/b/w",
        "c/ab", "c/ab/w", "d", "d/e", "c0", "c",
    ]
    b.write(p, [Put(n, n.encode(), f"d{i}", f"e{i}", {"k": str(i % 2)}) for i, n in enumerate(names)])
    queries = [
        ListQuery(prefix=pre, depth=depth, children=kids, descending=desc, limit=limit, values=values, tags=tags)
        for pre in ("c/", "c/a", "", "c")
        for depth in (0, 1)
        for kids in (False, True)
        for desc in (False, True)
        for limit in (None, 1, 2)
        for values in (True, False)
        for tags in ({}, {"k": "0"})
    ]
    queries += [
        ListQuery(start="c/a", stop=stop, depth=1, children=kids, descending=desc, limit=limit)
        for stop in ("c/a/w1", "c/ab", "c/b", "c/b/w", "d")
        for kids in (False, True)
        for desc in (False, True)
        for limit in (None, 2)
    ]
    for q in queries:
        assert [(r.name, r.value) for r in b.list(p, q)] == _reference(b, p, q), q


def test_list_newest_orders_by_id_then_thread_then_name_descending() -> None:
    import random

    from checkpointers._saver_flows import CheckpointRecord, list_newest

    rng = random.Random(6)
    for _ in range(300):
        found = {}
        for _ in range(rng.randrange(0, 12)):
            i, name, cid = rng.randrange(3), f"c/_{rng.choice('abc')}/_{rng.randrange(5)}", str(rng.randrange(4))
            found[(i, name)] = CheckpointRecord(name, "", cid, None, {}, {}, {}, {}, 3)
        # The reference: stable sorts, the last key first applied last.
        keys = sorted(found, key=lambda k: k[1], reverse=True)
        keys.sort(key=lambda k: k[0])
        keys.sort(key=lambda k: found[k].cid, reverse=True)
        for limit in (None, 1, 3):
            got = list_newest(found, limit)
            assert [(i, s) for i, s in got] == [(k[0], found[k]) for k in keys[:limit]]
            assert all(s is found[(i, s.name)] for i, s in got)


def test_inline_values_of_mixed_frames_and_a_damaged_one() -> None:
    import ormsgpack
    import pytest

    from checkpointers._saver_flows import _frame
    from checkpointers.errors import CorruptItemError
    from tests.test_read_path import _with_inline

    mp = b"\x07msgpack"
    saver, config = _with_inline({"a": mp + ormsgpack.packb(1), "b": _frame(("bytes", b"xyz")), "c": mp + b"\xa1s"})
    got = saver.get_tuple(config)
    assert got is not None
    assert got.checkpoint["channel_values"] == {"a": 1, "b": b"xyz", "c": "s"}
    assert [t.checkpoint["channel_values"] for t in saver.list(config)] == [{"a": 1, "b": b"xyz", "c": "s"}]
    saver, config = _with_inline({"a": mp + ormsgpack.packb(1), "bad": mp + b"\xc1"})  # 0xc1: never used
    with pytest.raises(CorruptItemError, match="'bad'"):
        saver.get_tuple(config)
