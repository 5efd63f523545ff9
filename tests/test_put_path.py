"""The saver's put path: how much Python a put and a put_writes run, and the shortcuts it takes.

A put and a put_writes on the memory backend are mostly the saver layer's own
Python (the same code runs on every backend), so the tests here count the
calls they make into ``checkpointers`` (Python functions entered, and C
functions called from its code), not time: counts are repeatable under any
load. A bound is today's count; a change that adds a call fails here and
says how many, so a new layer is a decision, not an accident. The shortcuts
themselves (metadata tags built inline, steps whose ``acall`` hands back the
backend's own awaitable) are checked against the general code they skip.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint

import checkpointers
from checkpointers._names import Partition
from checkpointers._saver_flows import _tag_key, metadata_tags, tag_value
from checkpointers.backends.base import Delete, ListQuery
from checkpointers.backends.memory import MemoryBackend
from checkpointers.backends.ops import DropOp, GetOp, ListOp, PartitionsOp, WriteOp, arun
from checkpointers.savers import MemoryCheckpointer

_PACKAGE = checkpointers.__file__.rsplit("/", 1)[0] + "/"
#: Calls into (and C calls from) ``checkpointers`` per put / put_writes on memory, at most.
#: Measured at the commit that set them; lower them when a change saves calls. (+5 each since the
#: review of 2026-12-03: the seal is built by Integrity.seal/_message alone, the memory backend
#: calls check_batch as every backend does, every write goes through write_batch, and records are
#: named by ckpt_name/writes_prefix: no inline copies of those.)
_PUT_CALLS = {"sync": 124, "async": 121}
_PUT_WRITES_CALLS = {"sync": 82, "async": 79}


@contextmanager
def _counting() -> Iterator[list[int]]:
    """Count Python calls into the package and C calls made from its frames while the block runs.

    Dataclasses' generated ``__init__`` methods count too (they are ``<string>`` code).
    """
    count = [0]

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event in ("call", "c_call"):
            where = frame.f_code.co_filename
            if where.startswith(_PACKAGE) or where == "<string>":  # <string>: dataclasses' generated methods
                count[0] += 1

    sys.setprofile(profile)
    try:
        yield count
    finally:
        sys.setprofile(None)


def _thread(saver: MemoryCheckpointer, steps: int) -> list[tuple[Any, ...]]:
    """The arguments of ``steps`` puts of one thread (3 channels, one changing per put), after 3 stored."""
    versions: dict[str, Any] = {}
    values: dict[str, Any] = {}
    config: dict[str, Any] = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    calls: list[tuple[Any, ...]] = []
    for i in range(steps + 3):
        changed = ["a", "b", "c"] if i == 0 else [["a", "b", "c"][i % 3]]
        for ch in changed:
            versions[ch] = saver.get_next_version(versions.get(ch), None)
            values[ch] = f"{ch}:{i}:" + "x" * 1000
        checkpoint = empty_checkpoint()
        checkpoint["id"] = f"1ef0000{i:04d}-0000-6000-8000-000000000000"
        checkpoint["channel_versions"] = dict(versions)
        checkpoint["channel_values"] = dict(values)
        metadata = {"source": "loop", "step": i, "parents": {}}
        calls.append((config, checkpoint, metadata, {c: versions[c] for c in changed}))
        config = {"configurable": {"thread_id": "t", "checkpoint_ns": "", "checkpoint_id": checkpoint["id"]}}
    for args in calls[:3]:
        saver.put(*args)
    return calls[3:]


def _per_call(run: Callable[[int], object], n: int = 5) -> float:
    run(0)  # warm: caches filled, first-call paths taken
    with _counting() as count:
        for i in range(1, n + 1):
            run(i)
    return count[0] / n


@pytest.fixture
def drive() -> Iterator[Callable[[Any], Any]]:
    """Runs an awaitable to its end on one loop kept for the test."""
    loop = asyncio.new_event_loop()
    try:
        yield loop.run_until_complete
    finally:
        loop.close()


@pytest.mark.parametrize("face", ["sync", "async"])
def test_a_put_on_memory_makes_no_more_calls_than_measured(face: str, drive: Callable[[Any], Any]) -> None:
    saver = MemoryCheckpointer()
    calls = _thread(saver, 6)
    if face == "sync":
        per_put = _per_call(lambda i: saver.put(*calls[i]))
    else:
        per_put = _per_call(lambda i: drive(saver.aput(*calls[i])))
    bound = _PUT_CALLS[face]
    assert per_put <= bound, f"a {face} put makes {per_put:g} calls into checkpointers, at most {bound} expected"


@pytest.mark.parametrize("face", ["sync", "async"])
def test_a_put_writes_on_memory_makes_no_more_calls_than_measured(face: str, drive: Callable[[Any], Any]) -> None:
    saver = MemoryCheckpointer()
    (args,) = _thread(saver, 1)
    config = saver.put(*args)

    def writes(i: int) -> list[tuple[str, Any]]:
        return [("a", f"w{i}"), ("b", i)]

    if face == "sync":
        per_call = _per_call(lambda i: saver.put_writes(config, writes(i), f"task-{i}"))
    else:
        per_call = _per_call(lambda i: drive(saver.aput_writes(config, writes(i), f"task-{i}")))
    bound = _PUT_WRITES_CALLS[face]
    assert per_call <= bound, f"a {face} put_writes makes {per_call:g} calls into checkpointers, at most {bound}"


@pytest.mark.parametrize("step_type", [GetOp, WriteOp, ListOp, PartitionsOp, DropOp])
def test_a_steps_acall_hands_back_the_backends_own_awaitable(step_type: Any) -> None:
    """No coroutine of the step's own between the driver and the backend (one frame less per step)."""
    assert not inspect.iscoroutinefunction(step_type.acall)
    backend = MemoryBackend()
    p = Partition("alice", "langgraph", "t")
    steps: dict[Any, Any] = {
        GetOp: GetOp(p, ["x"]),
        WriteOp: WriteOp(p, ()),
        ListOp: ListOp(p, ListQuery()),
        PartitionsOp: PartitionsOp("alice", "langgraph"),
        DropOp: DropOp(p),
    }
    step = steps[step_type]
    awaitable = step.acall(backend)
    method = {GetOp: "aget", WriteOp: "awrite", ListOp: "alist", PartitionsOp: "apartitions", DropOp: "adrop"}
    assert awaitable.cr_code is getattr(MemoryBackend, method[step_type]).__code__
    awaitable.close()


def test_steps_driven_by_arun_give_their_results() -> None:
    backend = MemoryBackend()
    p = Partition("alice", "langgraph", "t")

    def flow() -> Any:
        records = yield GetOp(p, ["x"])
        written = yield WriteOp(p, ())
        listed = yield ListOp(p, ListQuery())
        return records, written.conflict, listed

    assert asyncio.run(arun(flow(), backend)) == ([None], None, [])


def test_write_op_keeps_its_dataclass_behaviour() -> None:
    import dataclasses

    p = Partition("alice", "langgraph", "t")
    op = WriteOp(p, ())
    assert op.deletes == () and op == WriteOp(p, (), ()) and hash(op) == hash(WriteOp(p, ()))
    assert dataclasses.replace(op, deletes=(Delete("d"),)).deletes == (Delete("d"),)
    assert repr(op).startswith("WriteOp(partition=")
    with pytest.raises(dataclasses.FrozenInstanceError):
        op.puts = ()  # type: ignore[misc]


class _Str(str):
    pass


_VALUES: list[Any] = [
    "loop", "", "x" * 300, 'q"\n\u00e9\U0001f600', _Str("sub"), 0, 5, -7, 2**63, -(2**63), 2**200, 2**5000, True,
    False, 1.0, 2.5, math.nan, math.inf, None, {}, {"a": 1}, [], [1], (1,), b"bytes", object(),
]


def _reference_tags(metadata: dict[Any, Any]) -> dict[str, str]:
    """What metadata_tags gives with 16 keys or fewer, from the general helpers alone."""
    out = {}
    for key, value in metadata.items():
        tkey, tval = _tag_key(key), tag_value(value)
        if tkey is not None and tval is not None:
            out[tkey] = tval
    return out


@pytest.mark.parametrize("value", _VALUES, ids=lambda v: type(v).__name__)
def test_metadata_tags_inline_kinds_give_what_tag_value_gives(value: Any) -> None:
    metadata = {"k": value, "step": 3}
    assert metadata_tags(metadata) == _reference_tags(metadata)


@pytest.mark.parametrize("key", ["source", _Str("source"), "a\x00b", "k" * 300, 1, None, ("t",)], ids=repr)
def test_metadata_tags_keys_give_what_tag_key_gives(key: Any) -> None:
    metadata_tags({"source": "x"})  # "source" is a known key now
    metadata = {key: "v"}
    assert metadata_tags(metadata) == _reference_tags(metadata)
