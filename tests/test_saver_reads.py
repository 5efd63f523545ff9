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


def _put_in(saver: Checkpointer, ns: str, cid: str) -> None:
    c = empty_checkpoint()
    c["id"] = cid
    saver.put({"configurable": {"thread_id": "t", "checkpoint_ns": ns}}, c, {"step": 1}, {})


def test_a_namespace_sorting_below_the_root_is_still_walked(backend: Backend) -> None:
    """list(limit=) over every namespace probes for names below ``c/_/``; found ones are walked.

    ``-x`` and ``:x`` encode as ``_-x`` and ``_%3Ax``, which sort below the
    root namespace's ``_/``: their newer checkpoints must come first.
    """
    saver = Checkpointer(backend, user="u")
    for i in range(12):
        _put_in(saver, "", f"1{i:02d}")
    _put_in(saver, "-x", "150")
    _put_in(saver, ":x", "160")
    every_ns = {"configurable": {"thread_id": "t"}}
    got = [t.config["configurable"]["checkpoint_id"] for t in saver.list(every_ns, limit=10)]
    assert got == ["160", "150"] + [f"1{i:02d}" for i in range(11, 3, -1)]
    root_only = Checkpointer(backend, user="v")
    for i in range(12):
        _put_in(root_only, "", f"1{i:02d}")
    listed = list(root_only.list({"configurable": {"thread_id": "t"}}, limit=10))
    assert [t.config["configurable"]["checkpoint_id"] for t in listed] == [f"1{i:02d}" for i in range(11, 1, -1)]
