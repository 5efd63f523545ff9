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
