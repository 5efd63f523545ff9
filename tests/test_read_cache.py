"""The saver's memo of verified records (:class:`~checkpointers._saver_flows.VerifiedRecords`).

A record read again byte for byte at the same place, name, digest and tags
skips its re-hash; anything else is checked as before: a value, a digest or
tags changed under the same name fail their check even after a clean read,
a record another saver deleted is not returned, the memo stays within its
bounds, and two reads never share a mutable object.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.base.id import uuid6

from checkpointers import Checkpointer
from checkpointers._flows import new_etag
from checkpointers._integrity import Integrity
from checkpointers._names import Partition
from checkpointers._saver_flows import SPACE, VerifiedRecords, ckpt_name
from checkpointers.backends import MemoryBackend
from checkpointers.backends.base import Put, Record
from checkpointers.errors import CorruptItemError
from checkpointers.savers import SqliteCheckpointer

CFG: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}


def _put(saver: Checkpointer, values: dict[str, Any]) -> dict[str, Any]:
    checkpoint: Any = empty_checkpoint()
    checkpoint["id"] = str(uuid6())
    checkpoint["channel_values"] = dict(values)
    checkpoint["channel_versions"] = {k: saver.get_next_version(None, None) for k in values}
    config = saver.put(CFG, checkpoint, {"source": "loop", "step": 1}, dict(checkpoint["channel_versions"]))
    saver.put_writes(config, [("a", {"pending": [1, 2]})], "task-1")
    return config


class CountingIntegrity(Integrity):
    """An Integrity that counts the records it checks."""

    def __init__(self) -> None:
        super().__init__([])
        self.checked: list[str] = []

    def check(self, p: Partition, record: Record, label: str | None = None) -> Record:
        self.checked.append(record.name)
        return super().check(p, record, label)


def _counting(saver: Checkpointer) -> CountingIntegrity:
    counting = CountingIntegrity()
    saver.layout = dataclasses.replace(saver.layout, integrity=counting)
    return counting


def _record(p: Partition, name: str, value: bytes, tags: dict[str, str] | None = None) -> Record:
    tags = tags or {}
    sha = hashlib.sha256(value).hexdigest()
    return Record(name, value, tags, new_etag(), Integrity([]).seal(p, name, tags, sha), 1)


P = Partition("u", SPACE, "t")


def test_a_second_identical_read_skips_the_re_hash_and_returns_fresh_objects() -> None:
    saver = Checkpointer(MemoryBackend())
    _put(saver, {"a": {"big": "x" * 100}, "b": [1, 2, 3]})
    counting = _counting(saver)
    first = saver.get_tuple(CFG)
    assert first is not None and len(counting.checked) == 2  # the checkpoint record and its writes
    second = saver.get_tuple(CFG)
    assert second is not None and len(counting.checked) == 2  # nothing re-hashed
    assert second.checkpoint == first.checkpoint and second.pending_writes == first.pending_writes
    assert second.checkpoint["channel_values"]["a"] is not first.checkpoint["channel_values"]["a"]
    assert second.checkpoint["channel_versions"] is not first.checkpoint["channel_versions"]
    assert second.metadata is not first.metadata
    assert second.pending_writes[0][2] is not first.pending_writes[0][2]


def _flip_last_byte(rec: Record) -> tuple[bytes, dict[str, str]]:
    forged = bytearray(rec.value)
    forged[-1] ^= 1
    return bytes(forged), dict(rec.tags)


def _other_step_tag(rec: Record) -> tuple[bytes, dict[str, str]]:
    return rec.value, {**rec.tags, "m.step": "2"}


@pytest.mark.parametrize(
    ("forge", "error"),
    [(_flip_last_byte, "content does not match its sha256 digest"), (_other_step_tag, "seal does not match")],
    ids=["value", "tags"],
)
def test_a_record_changed_under_the_same_name_and_digest_fails_after_a_clean_read(
    forge: Callable[[Record], tuple[bytes, dict[str, str]]], error: str
) -> None:
    """A value or tags rewritten in place, the stored digest kept: the memo of the clean read does not vouch for it."""
    backend = MemoryBackend()
    saver = Checkpointer(backend)
    config = _put(saver, {"a": "v"})
    assert saver.get_tuple(CFG) is not None
    p = saver._partition(CFG, "t")
    name = ckpt_name("", config["configurable"]["checkpoint_id"])
    (rec,) = backend.get(p, [name])
    assert rec is not None
    value, tags = forge(rec)
    assert backend.write(p, [Put(name, value, rec.digest, new_etag(), tags)]).conflict is None
    with pytest.raises(CorruptItemError, match=error):
        saver.get_tuple(CFG)


def test_a_record_another_saver_deleted_is_not_returned(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    with SqliteCheckpointer(path) as reader, SqliteCheckpointer(path) as other:
        _put(reader, {"a": "v"})
        assert reader.get_tuple(CFG) is not None
        assert len(list(reader.list(CFG))) == 1
        other.delete_thread("t")
        assert reader.get_tuple(CFG) is None
        assert list(reader.list(CFG)) == []


def test_the_memo_is_keyed_by_place_and_settings() -> None:
    memo = VerifiedRecords()
    seal = Integrity([])
    rec = _record(P, "c/x", b"value")
    memo.check(seal, P, rec, lambda: "x")
    # The same bytes read from another partition: its seal does not hold there.
    with pytest.raises(CorruptItemError, match="moved-label"):
        memo.check(seal, Partition("u", SPACE, "other"), rec, lambda: "moved-label")
    # The same record under settings that refuse unkeyed seals: checked again, refused.
    keyed = Integrity(["k" * 32])
    with pytest.raises(CorruptItemError, match="keyed-label"):
        memo.check(keyed, P, rec, lambda: "keyed-label")
    seal.accept_unsealed = False
    memo.check(seal, P, rec, lambda: "x")  # no key: an unkeyed seal still holds


def test_the_memo_stays_within_its_bounds_and_skips_mutable_values() -> None:
    memo = VerifiedRecords(size=3, max_bytes=800)
    seal = Integrity([])
    for i in range(5):
        memo.check(seal, P, _record(P, f"c/{i}", b"v" * 10), lambda: "x")
    assert len(memo._seen) == 3 and memo._bytes == 30
    assert [k[3] for k in memo._seen] == ["c/2", "c/3", "c/4"]  # oldest out first
    memo.check(seal, P, _record(P, "c/big", b"v" * 101), lambda: "x")  # over max_bytes / 8: not kept
    assert all(k[3] != "c/big" for k in memo._seen)
    rec = _record(P, "c/m", b"v" * 10)
    memo.check(seal, P, dataclasses.replace(rec, value=bytearray(rec.value)), lambda: "x")
    assert all(k[3] != "c/m" for k in memo._seen)
    memo.clear()
    assert not memo._seen and memo._bytes == 0


def test_a_damaged_record_is_never_remembered() -> None:
    memo = VerifiedRecords()
    seal = Integrity([])
    rec = _record(P, "c/x", b"value")
    bad = dataclasses.replace(rec, value=b"other")
    for _ in range(2):
        with pytest.raises(CorruptItemError, match="sha256"):
            memo.check(seal, P, bad, lambda: "x")
    assert not memo._seen
