"""put_writes checks each write is a ``(channel name, value)`` pair before anything is written.

The check runs in the flow's one pass over the writes (``split_writes``), so
these pin that it still names the bad write and leaves the store untouched,
sync and async, and that the pairs LangGraph passes (tuples, lists, str
subclasses as channel names, a deque of them) are accepted.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint

from checkpointers.backends.base import ListQuery
from checkpointers.errors import InvalidArgumentError
from checkpointers.savers import MemoryCheckpointer


class _Name(str):
    """A str subclass as a channel name: accepted, as before."""


def _saver_and_config() -> tuple[MemoryCheckpointer, dict[str, Any]]:
    saver = MemoryCheckpointer()
    checkpoint = empty_checkpoint()
    config = saver.put({"configurable": {"thread_id": "t", "checkpoint_ns": ""}}, checkpoint, {}, {})
    return saver, config


def _records(saver: MemoryCheckpointer) -> int:
    backend = saver.backend
    return sum(len(backend.list(p, ListQuery())) for p in saver._partitions.values())


def _put_writes(saver: MemoryCheckpointer, face: str, config: dict[str, Any], writes: Any) -> None:
    if face == "sync":
        saver.put_writes(config, writes, "task")
    else:
        asyncio.run(saver.aput_writes(config, writes, "task"))


@pytest.mark.parametrize("face", ["sync", "async"])
@pytest.mark.parametrize(
    ("bad", "index"),
    [
        ("ab", 1),  # a 2-character string unpacks as a pair: still refused
        (("a", 1, 2), 1),
        ((1, "v"), 1),  # channel name not a str
        ({"a": 1, "b": 2}, 1),  # a 2-key dict unpacks too
        (None, 1),
    ],
)
def test_a_write_that_is_not_a_pair_is_refused_and_nothing_is_written(face: str, bad: Any, index: int) -> None:
    saver, config = _saver_and_config()
    before = _records(saver)
    with pytest.raises(InvalidArgumentError, match=rf"writes\[{index}\]"):
        _put_writes(saver, face, config, [("ok", 1), bad, ("later", 2)])
    assert _records(saver) == before


@pytest.mark.parametrize("face", ["sync", "async"])
def test_pairs_as_tuples_lists_and_str_subclasses_are_written(face: str) -> None:
    saver, config = _saver_and_config()
    _put_writes(saver, face, config, deque([("a", 1), ["b", 2], (_Name("c"), 3)]))
    got = saver.get_tuple(config)
    assert got is not None
    assert [(w[1], w[2]) for w in got.pending_writes or []] == [("a", 1), ("b", 2), ("c", 3)]
