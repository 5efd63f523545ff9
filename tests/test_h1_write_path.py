"""The write path's inlined shortcuts give exactly what the general code gives.

``Integrity.put`` builds its seal inline (not through ``seal``/``_message``),
``CheckpointLayout._dump`` packs with LangGraph's encoder directly,
``_regular_puts`` serializes one record without ``_packed``, ``ckpt_prefix``
remembers its namespaces, and a put's one pass over its channels still places
the changed values first: each is checked here against the general code or
rule it stands for, so a shortcut that drifts fails.
"""

from __future__ import annotations

from typing import Any

import pytest

from checkpointers._integrity import Integrity
from checkpointers._names import Partition
from checkpointers._names import encode_component as enc
from checkpointers._saver_flows import ckpt_prefix
from checkpointers.backends.base import Mode

P = Partition("alice", "langgraph", "t\u00e9/1")
KEY = "k" * 32


@pytest.mark.parametrize("keys", [[], [KEY], [KEY, "o" * 32]], ids=["unkeyed", "keyed", "rotated"])
@pytest.mark.parametrize("tags", [None, {}, {"m.step": "1", "m.source": '"loop"', "z": "\u00e9"}], ids=repr)
def test_a_put_is_sealed_as_seal_seals_it(keys: list[str], tags: dict[str, str] | None) -> None:
    integrity = Integrity(keys)
    put = integrity.put(P, "c/_/_1", b"value", etag="e", tags=tags, mode=Mode.APPEND)
    sha = put.digest.split(".")[0]
    assert put.digest == integrity.seal(P, "c/_/_1", tags or {}, sha)
    assert put.tags == (tags or {}) and put.mode is Mode.APPEND and put.etag == "e"
    integrity.check(P, _record(put))  # passes
    with pytest.raises(Exception, match="seal"):
        integrity.check(Partition("bob", "langgraph", "t\u00e9/1"), _record(put))


def test_a_put_given_its_sha_seals_that_sha() -> None:
    integrity = Integrity([])
    put = integrity.put(P, "b/x", b"blob", etag="e", staged=True, sha="a" * 64)
    assert put.digest == integrity.seal(P, "b/x", {}, "a" * 64) and put.staged


def _record(put: Any) -> Any:
    from checkpointers._integrity import _as_record

    return _as_record(put)


@pytest.mark.parametrize("ns", ["", "a:1|b:2", "x" * 300, "\u00e9/."])
def test_ckpt_prefix_remembered_is_the_encoded_one(ns: str) -> None:
    assert ckpt_prefix(ns) == f"c/{enc(ns)}/" == ckpt_prefix(ns)


_DUMPED: list[Any] = [
    {}, {"a": 1, "b": [1, 2.5, None, True]}, [], ["x", {"y": b"\x00"}], "", "text \u00e9\U0001f600",
    {"set": {1, 2}}, [("t", 1)], {"nested": {"deep": [[{}]]}},
]


@pytest.mark.parametrize("value", _DUMPED, ids=repr)
def test_dump_packs_as_the_serializers_dumps_typed_frames(value: Any) -> None:
    from checkpointers._saver_flows import _MSGPACK_FRAME, _frame
    from checkpointers.savers import MemoryCheckpointer

    layout = MemoryCheckpointer().layout
    assert layout._pack is not None  # the default serializer takes the shortcut
    typed = layout.serde.dumps_typed(value)
    expected = _MSGPACK_FRAME + typed[1] if typed[0] == "msgpack" else _frame(typed)
    assert layout._dump("v", value) == expected


def test_dump_refuses_what_the_serializer_refuses_naming_the_value() -> None:
    from checkpointers.errors import ItemTooLargeError, UnserializableValueError
    from checkpointers.savers import MemoryCheckpointer

    layout = MemoryCheckpointer().layout
    for refused in ({"k": object()}, {"n": 2**70}, [object()]):
        with pytest.raises(UnserializableValueError, match="the value"):
            layout._dump("the value", refused)
    small = MemoryCheckpointer(max_item_bytes=64).layout
    with pytest.raises(ItemTooLargeError):
        small._dump("big", "x" * 100)


def test_a_serializer_of_its_own_is_always_called() -> None:
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    from checkpointers._saver_flows import _packer

    class Mine(JsonPlusSerializer):
        def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
            return "mine", b"!"

    assert _packer(Mine(pickle_fallback=False)) is None
    assert _packer(JsonPlusSerializer(pickle_fallback=True)) is None  # may pickle what msgpack refuses
    assert _packer(JsonPlusSerializer(pickle_fallback=False)) is not None


def test_a_put_places_its_changed_values_first_then_keeps_the_parents_places() -> None:
    """Changed values take the record's inline budget before unchanged ones, whatever the channel order."""
    from langgraph.checkpoint.base import empty_checkpoint

    from checkpointers._saver_flows import _INLINE_BUDGET, _INLINE_MAX
    from checkpointers.savers import MemoryCheckpointer

    saver = MemoryCheckpointer()
    size = _INLINE_MAX - 64  # serialized, just under the inline cap: four fill the budget
    assert 4 * (size + 64) <= _INLINE_BUDGET < 5 * size
    names = ["u1", "u2", "u3", "u4", "c"]  # the changed channel comes last in the checkpoint's order
    config: dict[str, Any] = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    versions: dict[str, Any] = {}
    values = {n: n * (size // len(n)) for n in names}
    for step, changed in enumerate([names, ["c"]]):
        for n in changed:
            versions[n] = saver.get_next_version(versions.get(n), None)
        values["c"] = f"{step}" * size
        checkpoint: Any = {**empty_checkpoint(), "id": f"1ef0000{step}", "channel_versions": dict(versions),
                           "channel_values": dict(values)}
        config = saver.put(config, checkpoint, {"step": step}, {n: versions[n] for n in changed})
    p = saver._partition(config, "t")
    placed = saver.layout.parents.of(p, "", "1ef00001")
    assert placed is not None
    assert "c" in placed.inline and "u4" in placed.blobs  # c first; u4 no longer fits inline
    assert set(placed.inline) == {"c", "u1", "u2", "u3"}
    got = saver.get_tuple(config)
    assert got is not None and got.checkpoint["channel_values"] == values


def test_regular_writes_are_one_record_when_they_fit_and_split_when_they_do_not() -> None:
    from checkpointers._saver_flows import _unframe
    from checkpointers.savers import MemoryCheckpointer

    layout = MemoryCheckpointer().layout
    writes = [(0, "a", "x" * 10), (1, "b", 2)]
    puts, chunks = layout._regular_puts(P, "c/_/_1/_t/", writes, "t", "p", "task t")
    assert chunks == [writes] and [put.name for put in puts] == ["c/_/_1/_t/0"]
    payload = layout.serde.loads_typed(_unframe(puts[0].value))
    assert payload == {"task_id": "t", "task_path": "p", "w": [[0, "a", "x" * 10], [1, "b", 2]]}
    small = MemoryCheckpointer(max_item_bytes=400).layout
    big = [(0, "a", "x" * 200), (1, "b", "y" * 200), (2, "c", 3)]
    puts, chunks = small._regular_puts(P, "c/_/_1/_t/", big, "t", "", "task t")
    assert chunks == [[big[0]], big[1:]] and [put.name for put in puts] == ["c/_/_1/_t/0", "c/_/_1/_t/1"]
    assert all(len(put.value) <= 400 for put in puts)
    assert small._regular_puts(P, "c/_/_1/_t/", [], "t", "", "task t") == ([], [])


def test_etags_are_fresh_and_a_forked_child_draws_its_own_prefix() -> None:
    import os

    from checkpointers._flows import new_etag

    first, second = new_etag(), new_etag()
    assert first != second and first[:24] == second[:24] and len(first) == len(second) == 32
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its first etag and leave at once
        os.write(write, new_etag().encode())
        os._exit(0)
    os.close(write)
    child = os.read(read, 64).decode()
    os.close(read)
    os.waitpid(pid, 0)
    assert child[:24] != first[:24]
