"""Reads after the one-frame decoding path (``CheckpointLayout._payload``): errors name the record, no sharing."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.base.id import uuid6

from checkpointers import Checkpointer
from checkpointers._flows import new_etag
from checkpointers._integrity import Integrity
from checkpointers._saver_flows import ckpt_name, writes_prefix
from checkpointers.backends import MemoryBackend
from checkpointers.backends.base import ListQuery, Put
from checkpointers.errors import CorruptItemError

CFG: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
#: A sealed value whose msgpack body does not decode (0xc1 is never used by msgpack).
UNDECODABLE = b"\x07msgpack\xc1"


def _put(saver: Checkpointer, step: int) -> dict[str, Any]:
    checkpoint: Any = empty_checkpoint()
    checkpoint["id"] = str(uuid6(clock_seq=step))
    checkpoint["channel_values"] = {"a": {"n": step}}
    checkpoint["channel_versions"] = {"a": saver.get_next_version(None, None)}
    config = saver.put(CFG, checkpoint, {"source": "loop", "step": step}, dict(checkpoint["channel_versions"]))
    saver.put_writes(config, [("a", {"pending": [step]}), ("b", step)], "task-1")
    return config


def _overwrite(backend: MemoryBackend, saver: Checkpointer, name: str, value: bytes) -> None:
    """Store ``value`` at ``name`` with a valid seal for its place: only the decoding can fail."""
    p = saver._partition(CFG, "t")
    (rec,) = backend.get(p, [name])
    assert rec is not None
    seal = Integrity([]).seal(p, name, dict(rec.tags), hashlib.sha256(value).hexdigest())
    assert backend.write(p, [Put(name, value, seal, new_etag(), dict(rec.tags))]).conflict is None


def test_an_undecodable_writes_record_is_corrupt_and_named_with_its_thread() -> None:
    backend = MemoryBackend()
    saver = Checkpointer(backend)
    config = _put(saver, 1)
    assert saver.get_tuple(CFG) is not None  # a clean read first: its check is remembered
    p = saver._partition(CFG, "t")
    (write,) = backend.list(p, ListQuery(prefix=writes_prefix("", config["configurable"]["checkpoint_id"])))
    _overwrite(backend, saver, write.name, UNDECODABLE)
    for read in (lambda: saver.get_tuple(CFG), lambda: list(saver.list(CFG, limit=10))):
        with pytest.raises(CorruptItemError, match=r"write '.*' of thread 't'.*cannot be decoded"):
            read()


def test_an_undecodable_checkpoint_record_is_corrupt_and_named() -> None:
    backend = MemoryBackend()
    saver = Checkpointer(backend)
    config = _put(saver, 1)
    _overwrite(backend, saver, ckpt_name("", config["configurable"]["checkpoint_id"]), UNDECODABLE)
    reads = (lambda: saver.get_tuple(CFG), lambda: list(saver.list(CFG, limit=10)), lambda: saver.get_tuple(config))
    for read in reads:
        with pytest.raises(CorruptItemError, match=r"checkpoint record '.*' of thread 't'.*cannot be decoded"):
            read()


def test_listed_checkpoints_are_new_objects_per_call() -> None:
    """A caller changing what it got (the checkpoint completed in place included) changes no later read."""
    saver = Checkpointer(MemoryBackend())
    for step in range(3):
        _put(saver, step)
    first = list(saver.list(CFG, limit=10))
    for t in first:
        t.checkpoint["channel_values"]["a"]["n"] = -1
        t.checkpoint["channel_versions"].clear()
        t.pending_writes.clear()
    second = list(saver.list(CFG, limit=10))
    assert [t.checkpoint["channel_values"]["a"]["n"] for t in second] == [2, 1, 0]
    assert all(t.checkpoint["channel_versions"] and len(t.pending_writes) == 2 for t in second)
    got = saver.get_tuple(CFG)
    assert got is not None and got.checkpoint["channel_values"]["a"] == {"n": 2}
