"""The saver's planners, without a backend: where channels go, which reads a call needs, what it keeps.

The flows of :mod:`checkpointers._saver_flows` are thin: they ask these pure
functions what to write or read, yield it, and assemble the answer. Here each
planner gets hand-made inputs, and one flow is stepped by hand (as psycopg
tests its generators without a server) to show what it yields in what order.
"""

from __future__ import annotations

from typing import Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint

from checkpointers._saver_flows import (
    ChannelPlan,
    Channels,
    CheckpointLayout,
    CheckpointRecord,
    ListSelection,
    ParentChannels,
    checkpoint_payload,
    ckpt_name,
    ckpt_prefix,
    split_writes,
    writes_by_owner,
    writes_prefix,
    writes_queries,
)
from checkpointers.backends.base import ListQuery, Mode, Record, WriteResult
from checkpointers.backends.ops import GetOp, WriteOp
from checkpointers.errors import ItemTooLargeError, UnserializableValueError
from checkpointers.flows import digest
from checkpointers.integrity import Integrity
from checkpointers.names import Partition
from checkpointers.savers import default_serde

P = Partition("alice", "langgraph", "t")


def _checkpoint(cid: str, ns: str = "", fmt: int = 3, blobs: dict[str, str] | None = None) -> CheckpointRecord:
    return CheckpointRecord(ckpt_name(ns, cid), ns, cid, None, {}, {"step": 1}, blobs or {}, {}, fmt)


def _record(name: str) -> Record:
    return Record(name, b"", {}, "e", digest(b""), 0)


# -- put: where each channel goes ------------------------------------------------


def test_inherit_all_keeps_the_parents_places_in_order_and_gives_back_the_others() -> None:
    parent = Channels(versions={"a": 1, "b": 1, "c": 1, "d": 1}, blobs={"a": "d" * 64}, inline={"b": b"12", "d": b"3"})
    plan = ChannelPlan(inline_max=100, budget=2)
    left = plan.inherit_all(["d", "a", "b", "c", "new"], {"a": 1, "b": 1, "c": 1, "d": 1, "new": 1}, parent)
    assert left == ["b", "c", "new"]  # b: over the budget d left; c: no value in the parent; new: not in it
    assert plan.blobs == {"a": "d" * 64} and plan.inline == {"d": b"3"} and plan.budget == 1
    assert plan.inherit_all(["a"], {"a": 2}, parent) == ["a"]  # another version


def test_a_small_value_goes_inline_while_the_budget_lasts_then_into_a_blob() -> None:
    plan = ChannelPlan(inline_max=10, budget=15)
    plan.add("a", b"x" * 10)  # fits: inline
    plan.add("b", b"y" * 10)  # 5 bytes of budget left: a blob
    plan.add("c", b"z" * 11)  # over inline_max: a blob
    plan.add("d", b"w" * 5)  # fits the rest of the budget
    assert plan.inline == {"a": b"x" * 10, "d": b"w" * 5} and plan.budget == 0
    assert plan.blobs == {"b": digest(b"y" * 10), "c": digest(b"z" * 11)}
    assert plan.new_blobs == {digest(b"y" * 10): b"y" * 10, digest(b"z" * 11): b"z" * 11}


def test_equal_values_make_one_blob() -> None:
    plan = ChannelPlan(inline_max=0, budget=0)
    plan.add("a", b"same")
    plan.add("b", b"same")
    assert plan.blobs == {"a": digest(b"same"), "b": digest(b"same")} and len(plan.new_blobs) == 1


def test_an_unchanged_channel_keeps_its_parents_place_only_at_the_parents_version() -> None:
    parent = Channels(versions={"a": 1, "b": 1, "c": 1}, blobs={"a": "d" * 64}, inline={"b": b"12345"})
    plan = ChannelPlan(inline_max=100, budget=7)
    assert plan.inherit("a", 1, parent) and plan.blobs == {"a": "d" * 64}
    assert plan.inherit("b", 1, parent) and plan.inline == {"b": b"12345"} and plan.budget == 2
    assert not plan.inherit("a", 2, parent)  # another version: the value must be written
    assert not plan.inherit("c", 1, parent)  # the parent had no value of it
    assert not plan.inherit("new", 1, parent)
    tight = ChannelPlan(inline_max=100, budget=4)
    assert not tight.inherit("b", 1, parent) and tight.inline == {}  # over this record's budget
    assert not plan.new_blobs and not tight.new_blobs


def test_the_checkpoint_record_holds_the_checkpoint_without_its_values() -> None:
    checkpoint: Any = {**empty_checkpoint(), "id": "1", "channel_values": {"a": 1}}
    plan = ChannelPlan(inline_max=100, budget=100)
    plan.add("a", b"one")
    payload = checkpoint_payload("ns", "1", "0", checkpoint, {"step": 2}, plan)
    assert "channel_values" not in payload["checkpoint"] and checkpoint["channel_values"] == {"a": 1}
    assert payload["inline"] == {"a": b"one"} and payload["blobs"] == {}
    assert (payload["v"], payload["ns"], payload["id"], payload["parent"]) == (3, "ns", "1", "0")


# -- put_writes: which writes are special ------------------------------------------


def test_special_writes_are_split_off_and_the_last_of_each_wins() -> None:
    writes = [("a", 1), ("__interrupt__", "first"), ("b", 2), ("__error__", "e"), ("__interrupt__", "second")]
    special, regular = split_writes(writes)
    assert special == {-1: ("__error__", "e"), -3: ("__interrupt__", "second")}
    assert list(special) == [-1, -3]  # the order of their last occurrence
    assert regular == [(0, "a", 1), (2, "b", 2)]  # a regular write's index is its place in the call


# -- reads: which listings a load needs -------------------------------------------


def test_each_checkpoint_not_listed_yet_gets_a_listing_of_its_writes() -> None:
    one, two, old = _checkpoint("1"), _checkpoint("2"), _checkpoint("0", fmt=2)
    queries = writes_queries([one, two, old], listed={two.name: []})
    assert queries == [
        ListQuery(prefix=writes_prefix("", "1")),
        ListQuery(prefix=writes_prefix("", "0")),
        ListQuery(prefix="w/_/_0/"),  # formats 1 and 2 also kept writes under w/
    ]
    assert writes_queries([two], listed={two.name: []}) == []


def test_many_checkpoints_of_one_namespace_share_one_listing_of_its_writes() -> None:
    many = [_checkpoint(f"{i:03}", ns="sub") for i in range(65)]
    assert writes_queries(many, listed={}) == [ListQuery(prefix=ckpt_prefix("sub"), depth=2)]
    assert writes_queries(many, listed={c.name: [] for c in many}) == []  # all listed already
    assert len(writes_queries(many[:64], listed={})) == 64


def test_writes_are_grouped_under_their_checkpoint_in_either_layout() -> None:
    new, old, other = _record("c/_/_1/_task/0"), _record("w/_/_1/_task/-3"), _record("c/_sub/_2/_t/0")
    grouped = writes_by_owner([[new], [old, other]])
    assert grouped == {"c/_/_1": {new.name: new, old.name: old}, "c/_sub/_2": {other.name: other}}


def test_a_listing_keeps_what_a_read_of_everything_would() -> None:
    c = _checkpoint("5", ns="a")
    assert ListSelection(None, None, None, {}).keeps(c)
    assert ListSelection("a", "5", "6", {"step": 1}).keeps(c)
    assert not ListSelection("b", None, None, {}).keeps(c)
    assert not ListSelection(None, "4", None, {}).keeps(c)
    assert not ListSelection(None, None, "5", {}).keeps(c)  # before is exclusive
    assert not ListSelection(None, None, None, {"step": 2}).keeps(c)
    assert not ListSelection(None, None, None, {"missing": None}).keeps(c)


# -- the parent-channel cache -----------------------------------------------------


def test_the_cache_knows_only_the_last_checkpoint_per_namespace_and_forgets_a_thread() -> None:
    cache, other = ParentChannels(size=2), Partition("alice", "langgraph", "u")
    first, second = Channels({"a": 1}, {}, {}), Channels({"a": 2}, {}, {})
    cache.written(P, "", "1", first)
    assert cache.of(P, "", "1") is first and cache.of(P, "sub", "1") is None
    cache.written(P, "", "2", second)
    assert cache.of(P, "", "1") is None and cache.of(P, "", "2") is second
    cache.written(other, "", "1", first)
    cache.written(P, "sub", "1", first)  # over the size: the least recent entry (P, "") goes
    assert cache.of(P, "", "2") is None and cache.of(other, "", "1") is first
    cache.forget(other)
    assert cache.of(other, "", "1") is None and cache.of(P, "sub", "1") is first
    cache.clear()
    assert cache.of(P, "sub", "1") is None


# -- the layout's encoding and one flow, stepped by hand -----------------------------


def _layout(max_item_bytes: int = 1 << 20) -> CheckpointLayout:
    return CheckpointLayout(default_serde(), max_item_bytes, Integrity(None))


def test_the_layout_refuses_what_is_over_the_cap_or_cannot_be_serialized() -> None:
    with pytest.raises(ItemTooLargeError):
        _layout(64)._dump("channel 'x'", "v" * 100)
    with pytest.raises(UnserializableValueError, match="channel 'x'"):
        _layout()._dump("channel 'x'", object())
    assert _layout()._loads("x", _layout()._dump("x", {"k": [1, 2]})) == {"k": [1, 2]}


def test_a_put_without_a_known_parent_reads_it_then_writes_blobs_before_the_record() -> None:
    layout = _layout()
    checkpoint: Any = {**empty_checkpoint(), "id": "2"}
    checkpoint["channel_values"] = {"big": "x" * 5000, "small": "s", "kept": "k"}
    checkpoint["channel_versions"] = {"big": 2, "small": 2, "kept": 1}
    flow = layout.put_flow(P, "", "1", checkpoint, {"step": 2}, {"big": 2, "small": 2})
    read = next(flow)  # "kept" is unchanged and the parent is not cached: read its record
    assert read == GetOp(P, [ckpt_name("", "1")])
    batch = flow.send([None])  # no parent record: "kept" is written again
    assert isinstance(batch, WriteOp) and batch.deletes == ()
    names = [put.name for put in batch.puts]
    assert names[-1] == ckpt_name("", "2") and [n[:2] for n in names[:-1]] == ["b/"]  # one blob, first
    assert [put.mode for put in batch.puts] == [Mode.APPEND, Mode.APPEND] and batch.puts[0].staged
    with pytest.raises(StopIteration):
        flow.send(WriteResult(records=[]))
    cached = layout.parents.of(P, "", "2")
    assert cached is not None and set(cached.inline) == {"small", "kept"} and set(cached.blobs) == {"big"}
    # the next put finds its parent in the cache: no read, straight to the write
    child: Any = {**checkpoint, "id": "3", "channel_versions": {**checkpoint["channel_versions"], "small": 3}}
    step = next(layout.put_flow(P, "", "2", child, {"step": 3}, {"small": 3}))
    assert isinstance(step, WriteOp) and [put.name for put in step.puts] == [ckpt_name("", "3")]
