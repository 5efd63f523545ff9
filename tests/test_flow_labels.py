"""Error labels of put and put_writes, built only when an error is raised, still name what failed.

The write path builds its labels lazily (``_Lazy``, label callables): these
tests raise each kind of error and check the message names the channel,
write or record and its checkpoint, thread and namespace, as before.
"""

from __future__ import annotations

from typing import Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint

from checkpointers._saver_flows import _Lazy
from checkpointers.errors import ItemTooLargeError, StepMismatchError, UnserializableValueError
from checkpointers.savers import MemoryCheckpointer

CONFIG: Any = {"configurable": {"thread_id": "t-label", "checkpoint_ns": "ns1"}}
WHERE = "(thread 't-label', namespace 'ns1')"


def _checkpoint(values: dict[str, Any]) -> Any:
    cp = empty_checkpoint()
    cp["channel_values"] = dict(values)
    cp["channel_versions"] = dict.fromkeys(values, "1")
    return cp


@pytest.mark.parametrize(
    ("value", "error"),
    [(object(), UnserializableValueError), ("a" * 6000, ItemTooLargeError)],
    ids=["unserializable", "too-large"],
)
def test_a_channel_value_that_cannot_be_stored_is_named(value: object, error: type[Exception]) -> None:
    saver = MemoryCheckpointer(max_item_bytes=5000)
    cp = _checkpoint({"x": value})
    with pytest.raises(error) as exc:
        saver.put(CONFIG, cp, {}, {"x": "1"})
    assert f"channel 'x' of checkpoint {cp['id']!r} {WHERE}" in str(exc.value)


def test_a_recomputed_checkpoint_that_differs_names_the_checkpoint() -> None:
    saver = MemoryCheckpointer()
    cp = _checkpoint({"x": 1})
    saver.put(CONFIG, cp, {}, {"x": "1"})
    cp["channel_values"] = {"x": 2}
    with pytest.raises(StepMismatchError) as exc:
        saver.put(CONFIG, cp, {}, {"x": "1"})
    assert f"checkpoint {cp['id']!r} {WHERE}" in str(exc.value)


@pytest.mark.parametrize(
    ("writes", "error", "named"),
    [
        ([("a", object()), ("b", 1)], UnserializableValueError, "write 0 ('a') of task 'task1'"),
        ([("a", "z" * 6000)], ItemTooLargeError, "writes 0..0 of task 'task1'"),
        ([("__error__", object())], UnserializableValueError, "write -1 ('__error__') of task 'task1'"),
    ],
    ids=["regular-unserializable", "regular-too-large", "special-unserializable"],
)
def test_a_write_that_cannot_be_stored_is_named(
    writes: list[tuple[str, Any]], error: type[Exception], named: str
) -> None:
    saver = MemoryCheckpointer(max_item_bytes=5000)
    cp = _checkpoint({"x": 1})
    config = saver.put(CONFIG, cp, {}, {"x": "1"})
    with pytest.raises(error) as exc:
        saver.put_writes(config, writes, "task1")
    assert f"{named} at checkpoint {cp['id']!r} {WHERE}" in str(exc.value)
    assert saver.get_tuple(config).pending_writes == []  # nothing was written


def test_a_lazy_name_is_built_once_and_only_when_used() -> None:
    made: list[int] = []

    def make() -> str:
        made.append(1)
        return "subject"

    lazy = _Lazy(make)
    assert made == []
    assert f"of {lazy}" == "of subject" and lazy() == "subject" and str(lazy) == "subject"
    assert made == [1]
