"""The saver's read path with less Python per record: what the shortcuts must keep.

* The memory backend's name-order listing checks only depth and tags on
  what ``_Part.walk`` yields (the walk bounds prefix and start/stop itself):
  it must select exactly what ``ListQuery.matches`` over every record selects.
* A memory read of a partition without an expiry does not read the clock.
* A checkpoint record's inline values are checked for their type as before
  (a malformed ``inline`` is a CorruptItemError, never an AttributeError).
"""

from __future__ import annotations

import itertools
import random

import ormsgpack
import pytest

from checkpointers import Checkpointer
from checkpointers._flows import new_etag
from checkpointers._integrity import Integrity
from checkpointers._names import Partition
from checkpointers._saver_flows import SPACE, ckpt_name
from checkpointers.backends import MemoryBackend
from checkpointers.backends.base import ListQuery
from checkpointers.errors import CorruptItemError

_NAMES = [
    "a", "a/", "a/b", "a/b/c", "a/b/c/d", "a-b", "a-b/c", "a0", "a/\U0010ffff", "ab/c",
    "b", "b/a", "b/a/x", "b/b", "c/_/1", "c/_/1/t/0", "c/_/2", "c/_/2/t/0", "c/_/2/t/1", "c/x/1",
]  # fmt: skip


def _filled() -> tuple[MemoryBackend, Partition]:
    backend = MemoryBackend()
    p = Partition("u", "s", "t")
    rng = random.Random(7)
    puts = [
        Integrity(keys=[]).put(p, n, n.encode(), etag=new_etag(), tags={"k": rng.choice("xy")} if i % 3 else {})
        for i, n in enumerate(_NAMES)
    ]
    assert backend.write(p, puts).conflict is None
    return backend, p


def test_a_name_order_listing_selects_exactly_what_matches_selects() -> None:
    """Removing the depth or tag check of ``MemoryBackend.list``'s name-order filter fails this."""
    backend, p = _filled()
    every = backend.list(p, ListQuery())
    assert len(every) == len(_NAMES)
    prefixes = ["", "a", "a/", "a/b", "a/\U0010ffff", "b/", "c/_/", "c/", "z"]
    bounds = [None, "a/b", "b", "c/_/2", "c/_/2/t/0"]
    for prefix, depth, tags, start, stop, desc in itertools.product(
        prefixes, [None, 0, 1, 2], [{}, {"k": "x"}], bounds, bounds, [False, True]
    ):
        q = ListQuery(prefix=prefix, depth=depth, tags=tags, start=start, stop=stop, descending=desc)
        want = sorted((r.name for r in every if q.matches(r)), reverse=desc)
        assert [r.name for r in backend.list(p, q)] == want, q
        # with a limit: the first ones of the same order
        limited = ListQuery(prefix=prefix, depth=depth, tags=tags, start=start, stop=stop, descending=desc, limit=2)
        assert [r.name for r in backend.list(p, limited)] == want[:2], limited


def test_a_seq_order_listing_still_applies_every_filter() -> None:
    backend, p = _filled()
    every = backend.list(p, ListQuery(order="seq"))
    q = ListQuery(prefix="a/", order="seq", depth=1, descending=True)
    assert [r.name for r in backend.list(p, q)] == [r.name for r in reversed(every) if q.matches(r)]
    assert [r.name for r in backend.list(p, q)] == ["a/b/c"]


def test_a_read_without_an_expiry_does_not_read_the_clock_and_one_with_an_expiry_does() -> None:
    """Reading the clock on every get/list of a partition without an expiry fails this."""
    now = [1000.0]
    reads: list[float] = []

    def clock() -> float:
        reads.append(now[0])
        return now[0]

    backend = MemoryBackend(clock=clock)
    p = Partition("u", "s", "t")
    backend.write(p, [Integrity(keys=[]).put(p, "a", b"1", etag=new_etag())])
    reads.clear()
    assert backend.get(p, ["a"])[0] is not None
    assert [r.name for r in backend.list(p, ListQuery())] == ["a"]
    assert reads == []
    backend.set_retention(ttl=10.0, clock=clock)
    backend.write(p, [Integrity(keys=[]).put(p, "b", b"2", etag=new_etag())])  # stores an expiry
    reads.clear()
    assert backend.get(p, ["a"])[0] is not None
    assert reads  # an expiry to check: the clock is read
    now[0] = 2000.0  # past it: gone for every read
    assert backend.get(p, ["a"]) == [None]
    assert backend.list(p, ListQuery()) == []


def _with_inline(inline: object) -> tuple[Checkpointer, dict[str, object]]:
    """A saver whose only checkpoint record carries ``inline`` (sealed: only the layout is wrong)."""
    saver = Checkpointer(MemoryBackend())
    p = saver._partition(None, "t")
    payload = {
        "v": 2, "ns": "", "id": "1", "parent": None, "metadata": {}, "blobs": {}, "inline": inline,
        "checkpoint": {"v": 1, "id": "1", "ts": "", "channel_versions": {}, "versions_seen": {}},
    }  # fmt: skip
    data = b"\x07msgpack" + ormsgpack.packb(payload)
    put = saver.layout.integrity.put(p, ckpt_name("", "1"), data, etag=new_etag())
    assert p.space == SPACE
    saver.backend.write(p, [put])
    return saver, {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}


@pytest.mark.parametrize("inline", [["x"], "abc", 3, {"ch": "text"}])
def test_a_malformed_inline_section_is_corrupt(inline: object) -> None:
    """A non-dict ``inline`` raised a bare AttributeError (or TypeError) before; now CorruptItemError."""
    saver, config = _with_inline(inline)
    with pytest.raises(CorruptItemError):
        saver.get_tuple(config)
    with pytest.raises(CorruptItemError):
        list(saver.list(config))


def test_inline_values_come_back_as_stored() -> None:
    saver, config = _with_inline({"ch": b"\x07msgpack" + ormsgpack.packb({"a": [1, 2]})})
    got = saver.get_tuple(config)
    assert got is not None
    assert got.checkpoint["channel_values"] == {"ch": {"a": [1, 2]}}
    again = saver.get_tuple(config)
    assert again is not None
    assert again.checkpoint["channel_values"]["ch"] is not got.checkpoint["channel_values"]["ch"]
