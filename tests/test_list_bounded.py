"""``list(config, limit=N)`` without ``checkpoint_ns``, and ``list(None, limit=N)``: exact and bounded.

LangGraph's documentation lists a thread's history with a config holding
only ``thread_id``: every namespace's checkpoints, newest (highest id) first
across namespaces. These tests hold that listing, on every backend, to

* **exactness**: the same checkpoints in the same order as a brute-force
  listing (every put, filtered and sorted in the test), for many limits,
  with ``before``, with filters pushed down as tags, not pushable, and
  matching ``~overflow`` records only; the same tuples as our own unlimited
  listing; the same sets (and per-namespace orders) as LangGraph's
  ``InMemorySaver`` given the same puts;
* **boundedness**: with a counting wrapper around the backend, the number of
  listings and of records they return is the same at 30 and at 300
  checkpoints (sync and async, one and three namespaces, ``before``, a
  filter, ``checkpoint_id`` without namespace).

The walk's cursor arithmetic (``SaverFlows._list_next``) is also checked
alone, without a backend, and against a brute force on the memory backend
over random namespaces (hypothesis).
"""

from __future__ import annotations

import asyncio
import copy
import random
import uuid
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from langgraph.checkpoint.base import CheckpointTuple, empty_checkpoint
from langgraph.checkpoint.base.id import uuid6
from langgraph.checkpoint.memory import InMemorySaver

from checkpointers._names import Partition
from checkpointers._names import encode_component as enc
from checkpointers._saver_flows import _INLINE_MAX, SaverFlows
from checkpointers.backends import Backend, ListQuery, MemoryBackend
from checkpointers.backends.base import Delete, Put, Record, WriteResult
from checkpointers.savers import Checkpointer

#: S3 over HTTP runs only under --deep: the listings are the same as in-process
#: moto's, and these checks take 15-40 s each over HTTP.
DEEP_BACKENDS = {"s3_http"}


# -- a counting backend ---------------------------------------------------------


class CountingBackend(Backend):
    """Forwards every operation to ``inner``; counts listings and the records they return.

    ``many`` is the base class's (one operation after another, or gathered),
    so every listing of a :class:`~checkpointers._flows.Parallel` step goes
    through :meth:`list` / :meth:`alist` and is counted, on Redis too.
    """

    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self.kind = inner.kind
        self.lists = 0
        self.records = 0

    def counts(self) -> tuple[int, int]:
        return self.lists, self.records

    def reset(self) -> None:
        self.lists = self.records = 0

    def _seen(self, out: list[Record]) -> list[Record]:
        self.lists += 1
        self.records += len(out)
        return out

    def get(self, partition: Partition, names: Sequence[str]) -> list[Record | None]:
        return self.inner.get(partition, names)

    def write(self, partition: Partition, puts: Sequence[Put], deletes: Sequence[Delete] = ()) -> WriteResult:
        return self.inner.write(partition, puts, deletes)

    def list(self, partition: Partition, query: ListQuery) -> list[Record]:
        return self._seen(self.inner.list(partition, query))

    def partitions(self, user: str, space: str) -> list[str]:
        return self.inner.partitions(user, space)

    def drop(self, partition: Partition) -> int:
        return self.inner.drop(partition)

    async def aget(self, partition: Partition, names: Sequence[str]) -> list[Record | None]:
        return await self.inner.aget(partition, names)

    async def awrite(
        self, partition: Partition, puts: Sequence[Put], deletes: Sequence[Delete] = ()
    ) -> WriteResult:
        return await self.inner.awrite(partition, puts, deletes)

    async def alist(self, partition: Partition, query: ListQuery) -> list[Record]:
        return self._seen(await self.inner.alist(partition, query))

    async def apartitions(self, user: str, space: str) -> list[str]:
        return await self.inner.apartitions(user, space)

    async def adrop(self, partition: Partition) -> int:
        return await self.inner.adrop(partition)

    def close(self) -> None:  # the fixture closes the inner backend
        pass


# -- puts, mirrored into InMemorySaver --------------------------------------------

#: Namespaces of the exactness tests: the root, subgraph-like ones, encodings
#: that are prefixes of one another (``_a``, ``_a-b``, ``_a%3Ab``), a nested
#: one, a '/' and a hashed (long) one.
NAMESPACES = [
    "",
    f"child:{uuid.UUID(int=1)}",
    f"child:{uuid.UUID(int=2)}",
    "a",
    "a-b",
    "a:b",
    "a:b|c:d",
    "a/b",
    "n" * 200,
]
#: Extra metadata keys that push a checkpoint past the 16 tags (an ``~overflow`` record).
OVERFLOW_KEYS = [f"extra_{j:02d}" for j in range(20)]


class History:
    """Checkpoints put into a saver (and into LangGraph's InMemorySaver), as the test knows them."""

    def __init__(self, saver: Checkpointer, *, mirror: bool = True) -> None:
        self.saver = saver
        self.mirror = InMemorySaver() if mirror else None
        self.puts: list[dict[str, Any]] = []  # thread, ns, cid, metadata
        self.last: dict[tuple[str, str], str] = {}
        self.counter = 0

    def put(self, thread: str, ns: str, *, big: bool = False, writes: bool = False, overflow: bool = False) -> str:
        i = self.counter
        self.counter += 1
        cp = empty_checkpoint()
        cp["id"] = str(uuid6(clock_seq=i))
        cp["channel_values"] = {"n": i, **({"big": f"{i}:" + "x" * (_INLINE_MAX + 1)} if big else {})}
        cp["channel_versions"] = {ch: i + 1 for ch in cp["channel_values"]}
        meta: dict[str, Any] = {"source": "loop", "step": i, "parity": i % 2, "deep": {"k": i % 3}}
        if overflow:
            meta.update({k: j for j, k in enumerate(OVERFLOW_KEYS)})
        conf: dict[str, Any] = {"thread_id": thread, "checkpoint_ns": ns}
        if (thread, ns) in self.last:
            conf["checkpoint_id"] = self.last[(thread, ns)]
        versions = dict(cp["channel_versions"])
        targets = [self.saver] + ([self.mirror] if self.mirror is not None else [])
        for target in targets:
            out = target.put({"configurable": dict(conf)}, copy.deepcopy(cp), dict(meta), dict(versions))
            if writes:
                target.put_writes(out, [("n", -i), ("log", f"w{i}")], f"task-{i}")
        self.last[(thread, ns)] = cp["id"]
        self.puts.append({"thread": thread, "ns": ns, "cid": cp["id"], "metadata": meta})
        return cp["id"]

    def expected(
        self, thread: str | None, flt: dict[str, Any] | None, before: str | None, limit: int | None
    ) -> list[tuple[str, str, str]]:
        """The brute force: (thread, ns, id) of every put that passes, highest id first."""
        out = [
            (p["thread"], p["ns"], p["cid"])
            for p in self.puts
            if (thread is None or p["thread"] == thread)
            and (before is None or p["cid"] < before)
            and all(k in p["metadata"] and p["metadata"][k] == v for k, v in (flt or {}).items())
        ]
        out.sort(key=lambda t: t[2], reverse=True)
        return out[:limit]


def ids(tuples: Sequence[CheckpointTuple]) -> list[tuple[str, str, str]]:
    return [
        (t.config["configurable"]["thread_id"], t.config["configurable"]["checkpoint_ns"],
         t.config["configurable"]["checkpoint_id"])
        for t in tuples
    ]  # fmt: skip


def before_cfg(before: str | None) -> dict[str, Any] | None:
    return None if before is None else {"configurable": {"checkpoint_id": before}}


def user() -> str:
    return f"u-{uuid.uuid4().hex}"


def interleaved(saver: Checkpointer, threads: Sequence[str], n: int, seed: int = 7) -> History:
    """``n`` checkpoints over ``threads`` x :data:`NAMESPACES`, in a random (seeded) interleaving."""
    rng = random.Random(seed)
    h = History(saver)
    for i in range(n):
        h.put(
            rng.choice(threads),
            rng.choice(NAMESPACES),
            big=i % 5 == 0,
            writes=i % 3 == 0,
            overflow=i % 7 == 0,
        )
    return h


#: (filter, whether ``before`` is set): no filter; pushed down as tags; not
#: pushable (a nested value); a key only ``~overflow`` records carry.
VARIANTS: list[tuple[dict[str, Any] | None, bool]] = [
    (None, False),
    (None, True),
    ({"parity": 0}, False),
    ({"parity": 1, "source": "loop"}, True),
    ({"deep": {"k": 1}}, False),
    ({"deep": {"k": 2}}, True),
    ({"extra_19": 19}, False),
    ({"extra_19": 19, "parity": 0}, True),
]
LIMITS = [1, 2, 3, 5, 8, 13, 40, 1000]
#: Fewer on S3 (moto takes 10-20 ms a request); the memory backend's
#: hypothesis test tries every limit and filter.
S3_LIMITS = [1, 8, 1000]
S3_VARIANTS = [VARIANTS[0], VARIANTS[3], VARIANTS[4], VARIANTS[7]]


def limits_for(backend: Backend) -> list[int]:
    return S3_LIMITS if backend.kind == "s3" else LIMITS


def variants_for(backend: Backend) -> list[tuple[dict[str, Any] | None, bool]]:
    return S3_VARIANTS if backend.kind == "s3" else VARIANTS


# -- exactness ------------------------------------------------------------------


def test_list_without_namespace_is_exact(backend: Backend) -> None:
    saver = Checkpointer(backend).for_user(user())
    h = interleaved(saver, ["t1", "t2"], 60)
    before = sorted(p["cid"] for p in h.puts)[40]
    for flt, with_before in variants_for(backend):
        b = before if with_before else None
        for thread in ("t1", None):
            config = {"configurable": {"thread_id": thread}} if thread else None
            reference = list(saver.list(config, filter=flt, before=before_cfg(b)))
            assert ids(reference) == h.expected(thread, flt, b, None), (flt, b, thread)
            by_id = {ids([t])[0]: t for t in reference}
            for k in limits_for(backend):
                got = list(saver.list(config, filter=flt, before=before_cfg(b), limit=k))
                assert ids(got) == h.expected(thread, flt, b, k), (flt, b, thread, k)
                for t in got:  # the same tuples as the unlimited listing: writes, values, parents
                    ref = by_id[ids([t])[0]]
                    assert (t.checkpoint, t.metadata, t.parent_config, t.pending_writes) == (
                        ref.checkpoint, ref.metadata, ref.parent_config, ref.pending_writes
                    )  # fmt: skip


def test_list_without_namespace_is_exact_async(backend: Backend) -> None:
    saver = Checkpointer(backend).for_user(user())
    h = interleaved(saver, ["t1", "t2"], 45, seed=11)
    before = sorted(p["cid"] for p in h.puts)[30]
    variants = variants_for(backend)

    async def collect(config: Any, **kw: Any) -> list[CheckpointTuple]:
        return [t async for t in saver.alist(config, **kw)]

    async def main() -> None:
        for flt, with_before in variants[::2] + variants[1::4]:
            b = before if with_before else None
            for thread in ("t2", None):
                config = {"configurable": {"thread_id": thread}} if thread else None
                for k in (1, 4, 9, 1000):
                    got = await collect(config, filter=flt, before=before_cfg(b), limit=k)
                    assert ids(got) == h.expected(thread, flt, b, k), (flt, b, thread, k)

    asyncio.run(main())


def test_list_agrees_with_inmemorysaver(backend: Backend) -> None:
    """Same checkpoints (as sets, and in order within each namespace) and tuples as LangGraph's saver.

    ``InMemorySaver`` lists namespace by namespace (its ``limit`` counts across
    them in that order), so globally only sets compare; within one namespace,
    and with ``checkpoint_ns`` given, orders and limits compare too.
    """
    saver = Checkpointer(backend).for_user(user())
    h = interleaved(saver, ["t1"], 40, seed=3)
    assert h.mirror is not None
    before = sorted(p["cid"] for p in h.puts)[25]
    config = {"configurable": {"thread_id": "t1"}}
    for flt, with_before in variants_for(backend):
        kw: dict[str, Any] = {"filter": flt, "before": before_cfg(before if with_before else None)}
        ours = list(saver.list(config, **kw))
        theirs = list(h.mirror.list(config, **kw))
        assert sorted(ids(ours)) == sorted(ids(theirs))
        mine = {ids([t])[0]: t for t in ours}
        for t in theirs:
            o = mine[ids([t])[0]]
            assert o.checkpoint["channel_values"] == t.checkpoint["channel_values"]
            assert (o.metadata, o.pending_writes) == (t.metadata, t.pending_writes)
            assert (o.parent_config or {}).get("configurable", {}).get("checkpoint_id") == (
                t.parent_config or {}
            ).get("configurable", {}).get("checkpoint_id")
        for n, ns in enumerate(NAMESPACES):
            assert [i for i in ids(ours) if i[1] == ns] == [i for i in ids(theirs) if i[1] == ns]
            if backend.kind == "s3" and n % 3:
                continue
            with_ns = {"configurable": {"thread_id": "t1", "checkpoint_ns": ns}}
            for k in (1, 3):
                assert ids(saver.list(with_ns, limit=k, **kw)) == ids(h.mirror.list(with_ns, limit=k, **kw))
        # with a limit, ours is the global top k: the newest k of InMemorySaver's unlimited set
        for k in (1, 3, 10):
            top = sorted(ids(theirs), key=lambda i: i[2], reverse=True)[:k]
            assert ids(saver.list(config, limit=k, **kw)) == top


def test_checkpoint_id_without_namespace(backend: Backend) -> None:
    """A config with ``checkpoint_id`` but no namespace: that id in every namespace (one, in practice)."""
    saver = Checkpointer(backend).for_user(user())
    h = interleaved(saver, ["t1", "t2"], 30, seed=5)
    for p in h.puts[:: 8 if backend.kind == "s3" else 3]:
        config = {"configurable": {"thread_id": p["thread"], "checkpoint_id": p["cid"]}}
        assert ids(saver.list(config)) == [(p["thread"], p["ns"], p["cid"])]
        assert ids(saver.list(config, limit=1, filter={"step": p["metadata"]["step"]})) == ids(saver.list(config))
        assert ids(saver.list(config, filter={"step": -1})) == []
        assert ids(saver.list(config, before=before_cfg(p["cid"]))) == []
        other = "t2" if p["thread"] == "t1" else "t1"
        assert ids(saver.list({"configurable": {"thread_id": other, "checkpoint_id": p["cid"]}})) == []


@given(
    namespaces=st.lists(st.text(alphabet="ab:-/%_|.~", max_size=4), min_size=1, max_size=5, unique=True),
    order=st.lists(st.integers(0, 4), min_size=1, max_size=40),
    limit=st.integers(1, 12),
    cut=st.floats(0, 1),
    use_before=st.booleans(),
    flt=st.sampled_from([None, {"parity": 0}, {"deep": {"k": 1}}, {"extra_19": 19}]),
)
def test_random_namespaces_match_brute_force(
    namespaces: list[str], order: list[int], limit: int, cut: float, use_before: bool, flt: dict[str, Any] | None
) -> None:
    """Any namespaces (encodings that prefix one another, '%', '/', '.', '~'), any interleaving."""
    saver = Checkpointer(MemoryBackend()).for_user("hyp")
    h = History(saver, mirror=False)
    for j, i in enumerate(order):
        h.put("t", namespaces[i % len(namespaces)], writes=j % 2 == 0, overflow=j % 3 == 0)
    ranked = sorted(p["cid"] for p in h.puts)
    before = ranked[int(cut * (len(ranked) - 1))] if use_before else None
    for config in ({"configurable": {"thread_id": "t"}}, None):
        got = list(saver.list(config, filter=flt, before=before_cfg(before), limit=limit))
        assert ids(got) == h.expected("t", flt, before, limit)


# -- the cursor arithmetic alone ------------------------------------------------------


def test_next_stop_jumps_past_one_namespace_only() -> None:
    walk = ListQuery(prefix="c/", descending=True, depth=1, children=True)
    older, cid, newer = (str(uuid6(clock_seq=i)) for i in range(3))  # in time order
    for ns, others in [("a", ["a-b", "a:b", "a%", "", "a/b"]), ("a-b", ["a", "a:b", "a-", "a-b-c"]), ("", ["a", "-"])]:
        last = f"c/{enc(ns)}/{enc(cid)}"
        # a full listing whose last id is at the floor: jump to the namespace's head
        stop, limit = SaverFlows._list_next(walk, 10, 10, False, 10, (last, cid), cid, None) or ("", 0)
        assert stop == f"c/{enc(ns)}/" and limit == 10
        for other in others:  # another namespace's names are on one side of the whole block
            low, high = f"c/{enc(other)}/", f"c/{enc(other)}0"  # its names lie in [low, high)
            assert high <= stop or low >= last + "0"
        # every name of ns is >= the stop: only its own records are skipped
        assert all(f"c/{enc(ns)}/{enc(c)}" >= stop for c in ("0", cid, "zz"))
    last = f"c/{enc('a')}/{enc(cid)}"
    # above the floor: read on from the last name
    assert SaverFlows._list_next(walk, 10, 10, False, 10, (last, cid), None, None) == (last, 10)
    assert SaverFlows._list_next(walk, 10, 10, False, 10, (last, newer), cid, None) == (last, 10)
    # a sifted walk reading on inside the namespace doubles; a jump resets it
    assert SaverFlows._list_next(walk, 40, 10, True, 40, (last, newer), cid, None) == (last, 80)
    assert SaverFlows._list_next(walk, 40, 10, True, 40, (last, cid), cid, None) == ("c/_a/", 10)
    # before: jump to <head><before> when that is lower than the last name, never up
    assert SaverFlows._list_next(walk, 10, 10, False, 10, (last, cid), None, older) == (f"c/_a/{enc(older)}", 10)
    assert SaverFlows._list_next(walk, 10, 10, False, 10, (last, cid), None, newer) == (last, 10)
    # a short listing ends the walk; so does the head of a one-namespace walk
    assert SaverFlows._list_next(walk, 10, 10, False, 9, (last, cid), None, None) is None
    one = ListQuery(prefix="c/_a/", descending=True, depth=0, children=True)
    assert SaverFlows._list_next(one, 10, 10, False, 10, (last, cid), cid, None) is None


def test_floor_and_merge() -> None:
    assert SaverFlows._list_floor(["3", "1", "2"], 2) == "2"
    assert SaverFlows._list_floor(["3", "1"], 3) is None
    assert SaverFlows._list_floor(["3"], None) is None

    def stored(cid: str) -> Any:
        return type("S", (), {"cid": cid})()

    found = {(1, "c/_a/_2"): stored("2"), (0, "c/_b/_2"): stored("2"), (0, "c/_a/_2"): stored("2"),
             (0, "c/_a/_3"): stored("3"), (1, "c/_b/_1"): stored("1")}  # fmt: skip
    # highest id first; equal ids in thread order, then in descending name order
    order = [(i, s.cid) for i, s in SaverFlows._list_newest(found, None)]
    assert order == [(0, "3"), (0, "2"), (0, "2"), (1, "2"), (1, "1")]
    assert [found[k] for k in [(0, "c/_b/_2"), (0, "c/_a/_2")]] == [s for _, s in SaverFlows._list_newest(found, 3)][1:]


def test_query_below_a_stop_has_one_upper_bound() -> None:
    """With a stop, the walk's prefix becomes ``start``: the same records, one ``name <`` for SQLite."""
    walk = ListQuery(prefix="c/", descending=True, depth=1, tags={"m.step": "1"}, children=True)
    q = SaverFlows._list_query(walk, "c/_/", 10)
    assert (q.prefix, q.start, q.stop, q.depth, q.limit, q.tags, q.children) == ("", "c/", "c/_/", 2, 10, walk.tags, True)
    first = SaverFlows._list_query(walk, None, 10)
    assert (first.prefix, first.start, first.stop, first.depth) == ("c/", None, None, 1)
    for name in ("c/_a/_1", "c/_/_1/_t/0", "b/x", "c/_%2F/_1", "c0"):
        want = name.startswith("c/") and name < "c/_/" and name.count("/") == 2
        rec = Record(name, b"", {"m.step": "1"}, "", "", 0)
        assert q.matches(rec) == want, name


# -- boundedness ---------------------------------------------------------------------


def _fill(saver: Checkpointer, thread: str, n: int, namespaces: Sequence[str] = ("",)) -> list[str]:
    h = History(saver, mirror=False)
    return [h.put(thread, namespaces[i % len(namespaces)], writes=i % 3 == 0) for i in range(n)]


def _costs(backend: Backend, history: int, namespaces: Sequence[str]) -> dict[str, tuple[int, int]]:
    """Listings and records read by each limited list call, on a fresh user with one thread of ``history``."""
    who = user()
    cids = _fill(Checkpointer(backend).for_user(who), "t", history, namespaces)
    counting = CountingBackend(backend)
    saver = Checkpointer(counting).for_user(who)
    thread = {"configurable": {"thread_id": "t"}}
    ranked = sorted(cids, reverse=True)
    before = before_cfg(ranked[12])
    calls: dict[str, Any] = {
        "thread": lambda: saver.list(thread, limit=10),
        "all threads": lambda: saver.list(None, limit=10),
        "thread, before": lambda: saver.list(thread, limit=10, before=before),
        "thread, filter": lambda: saver.list(thread, limit=10, filter={"source": "loop"}),
        "thread, checkpoint_ns": lambda: saver.list({"configurable": {"thread_id": "t", "checkpoint_ns": ""}}, limit=5),
        "thread, checkpoint_id": lambda: saver.list({"configurable": {"thread_id": "t", "checkpoint_id": ranked[3]}}),
    }
    out: dict[str, tuple[int, int]] = {}
    for label, call in calls.items():
        counting.reset()
        got = list(call())
        assert got, label
        out[label] = counting.counts()

    async def alist_costs() -> None:
        for label, kw in [("async thread", {"config": thread}), ("async all threads", {"config": None})]:
            counting.reset()
            got = [t async for t in saver.alist(kw["config"], limit=10)]
            assert len(got) == 10
            out[label] = counting.counts()

    asyncio.run(alist_costs())
    return out


@pytest.mark.parametrize("namespaces", [("",), ("", f"child:{uuid.UUID(int=9)}", "a")], ids=["one_ns", "three_ns"])
def test_list_limit_reads_do_not_grow_with_history(backend: Backend, namespaces: tuple[str, ...]) -> None:
    """list(limit=10) without checkpoint_ns: the same listings and records at 30 and at 300 checkpoints."""
    small = _costs(backend, 30 if len(namespaces) == 1 else 75, namespaces)
    large = _costs(backend, 300, namespaces)
    assert large == small
    limit, writes_per_checkpoint = 10, 1
    for label, (lists, records) in large.items():
        # at most ~2 * limit checkpoints a namespace, each with its writes record
        assert records <= 2 * limit * (1 + writes_per_checkpoint) * len(namespaces) + limit, (label, records)
        assert lists <= 3 * len(namespaces) + 2, (label, lists)
    one = large["thread"]
    if len(namespaces) == 1:  # the newest ten and their writes, then "nothing below the root namespace"
        assert one[0] == 2 and one[1] < 2 * limit
