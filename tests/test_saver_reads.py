"""get_tuple by id reads the record and its writes in one listing: what that listing may pick.

The listing asks for the lowest name at depth 0 under the checkpoint's own
name. That is the record when it is stored; an id that only *extends* the one
asked for (``ab1`` for ``ab``) sorts after it and must never be returned for it.
"""

from __future__ import annotations

from typing import Any

from langgraph.checkpoint.base import empty_checkpoint

from checkpointers.backends.base import Backend
from checkpointers.savers import Checkpointer


def _put(saver: Checkpointer, cid: str, value: str) -> dict[str, Any]:
    c = empty_checkpoint()
    c["id"] = cid
    c["channel_values"] = {"x": value}
    c["channel_versions"] = {"x": 1}
    cfg = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    return saver.put(cfg, c, {"step": 1}, {"x": 1})  # type: ignore[return-value]


def _by_id(cid: str) -> Any:
    return {"configurable": {"thread_id": "t", "checkpoint_ns": "", "checkpoint_id": cid}}


def test_an_id_that_only_extends_the_asked_one_is_not_returned(backend: Backend) -> None:
    saver = Checkpointer(backend, user="u")
    cfg = _put(saver, "ab1", "longer")
    saver.put_writes(cfg, [("x", "w")], "task")
    assert saver.get_tuple(_by_id("ab")) is None
    assert saver.get_tuple(_by_id("a")) is None
    _put(saver, "ab", "shorter")
    got = saver.get_tuple(_by_id("ab"))
    assert got is not None and got.checkpoint["channel_values"] == {"x": "shorter"}
    assert got.pending_writes == []  # the writes of ab1 are not ab's
    longer = saver.get_tuple(_by_id("ab1"))
    assert longer is not None and longer.checkpoint["channel_values"] == {"x": "longer"}
    assert longer.pending_writes == [("task", "x", "w")]
    assert saver.get_tuple(_by_id("ab2")) is None
