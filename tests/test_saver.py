"""What the LangGraph runtime needs from a checkpointer beyond the conformance suite.

One test per need listed in DESIGN.md ("LangGraph face"), run on every
backend, plus corruption, size caps, content addressing and per-user
isolation with hostile ids.
"""

from __future__ import annotations

import asyncio
import copy
import uuid
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.base import Checkpoint, writes_sort_key
from langgraph.checkpoint.conformance.test_utils import generate_checkpoint
from langgraph.checkpoint.serde.types import INTERRUPT

from checkpointers import _saver_flows
from checkpointers._flows import digest, new_etag
from checkpointers._names import ANONYMOUS_USER, Partition
from checkpointers.backends import Backend, Delete, ListQuery, Mode, Put
from checkpointers.errors import CorruptItemError, IsolationError, ItemTooLargeError, StepMismatchError
from checkpointers.savers import (
    Checkpointer,
    MemoryCheckpointer,
    RedisCheckpointer,
    S3Checkpointer,
    SqliteCheckpointer,
    WriteMismatch,
)

# -- helpers ------------------------------------------------------------------

#: A string length whose serialization is over the inline limit (stored as a blob).
OVER_INLINE = _saver_flows._INLINE_MAX + 1


def cfg(thread: Any, ns: str = "", cid: str | None = None, **extra: Any) -> dict[str, Any]:
    conf: dict[str, Any] = {"thread_id": thread, "checkpoint_ns": ns, **extra}
    if cid is not None:
        conf["checkpoint_id"] = cid
    return {"configurable": conf}


def ckpt(**values: Any) -> Checkpoint:
    return generate_checkpoint(channel_values=values, channel_versions={k: "1" for k in values})


def put(saver: Checkpointer, config: dict[str, Any], metadata: dict[str, Any] | None = None, **values: Any) -> dict[str, Any]:
    """Put a checkpoint whose channels are all new; the parent is config's checkpoint_id."""
    cp = ckpt(**values)
    return saver.put(config, cp, metadata or {"source": "loop", "step": 0}, dict(cp["channel_versions"]))


def _big(i: int) -> str:
    """A distinct value over the inline limit, so it is stored as a blob."""
    return f"{i}:" + "x" * OVER_INLINE


def chain(saver: Checkpointer, thread: Any, n: int, ns: str = "", big: bool = False, **meta: Any) -> list[dict[str, Any]]:
    """``n`` checkpoints, each the child of the previous one (``big``: values are blobs)."""
    out: list[dict[str, Any]] = []
    parent: str | None = None
    for i in range(n):
        x = _big(i) if big else i
        out.append(put(saver, cfg(thread, ns, parent), {"source": "loop", "step": i, **meta}, x=x))
        parent = out[-1]["configurable"]["checkpoint_id"]
    return out


def records(backend: Backend, user: str, thread: str, prefix: str = "", depth: int | None = None) -> list[Any]:
    """A thread's records; ``"c/", depth=1``: checkpoints, ``"c/", depth=3``: writes."""
    return backend.list(Partition(user, "langgraph", thread), ListQuery(prefix=prefix, depth=depth))


def new_user() -> str:
    return f"u-{uuid.uuid4().hex}"


@pytest.fixture
def user() -> str:
    return new_user()


@pytest.fixture
def saver(backend: Backend, user: str) -> Checkpointer:
    return Checkpointer(backend).for_user(user)


# -- the runtime's needs --------------------------------------------------------


def test_put_returns_the_callers_ids(saver: Checkpointer) -> None:
    thread, ns = "t/1:x*?[%..", "parent:1|child:2"
    first = put(saver, cfg(thread, ns), x=1)
    assert first == {"configurable": {"thread_id": thread, "checkpoint_ns": ns, "checkpoint_id": first["configurable"]["checkpoint_id"]}}
    second = put(saver, cfg(thread, ns, first["configurable"]["checkpoint_id"], user_id=saver.user), x=2)
    assert second["configurable"]["user_id"] == saver.user
    assert second["configurable"]["thread_id"] == thread

    tup = saver.get_tuple(second)
    assert tup is not None
    assert tup.config == second
    assert tup.parent_config == {
        "configurable": {"thread_id": thread, "checkpoint_ns": ns, "checkpoint_id": first["configurable"]["checkpoint_id"], "user_id": saver.user}
    }
    assert tup.checkpoint["channel_values"] == {"x": 2}


def test_put_writes_may_precede_their_checkpoint(saver: Checkpointer) -> None:
    cp = ckpt(x=1)
    target = cfg("t", "", cp["id"])
    saver.put_writes(target, [("a", 1), ("b", 2)], "task-1", "~path")
    assert saver.get_tuple(target) is None
    saver.put(cfg("t"), cp, {"source": "loop", "step": 0}, {"x": "1"})
    tup = saver.get_tuple(cfg("t"))
    assert tup is not None and tup.pending_writes == [("task-1", "a", 1), ("task-1", "b", 2)]


def test_pending_writes_come_back_in_writes_sort_key_order(saver: Checkpointer) -> None:
    stored = put(saver, cfg("t"), x=1)
    # task ids sort the other way round from their paths: the path must win
    calls = [("~b", "task-a", [("c", "b0"), ("c", "b1")]), ("~a", "task-z", [("c", "a0")]), ("", "task-m", [("c", "input")])]
    for path, task, writes in calls:
        saver.put_writes(stored, writes, task, path)
    tup = saver.get_tuple(stored)
    assert tup is not None
    expected = sorted(
        ((path, task, i, value) for path, task, writes in calls for i, (_, value) in enumerate(writes)),
        key=lambda w: writes_sort_key(w[0], w[1], w[2]),
    )
    assert [w[2] for w in tup.pending_writes] == [value for *_, value in expected]
    assert [w[2] for w in tup.pending_writes] == ["input", "a0", "b0", "b1"]


def test_write_reputs_identical_ok_different_kept_and_reported_special_upserts(
    saver: Checkpointer, backend: Backend, user: str
) -> None:
    seen: list[WriteMismatch] = []
    saver.on_write_mismatch = seen.append
    stored = put(saver, cfg("t"), x=1)
    saver.put_writes(stored, [("ch", "v")], "task")
    saver.put_writes(stored, [("ch", "v")], "task")  # the runtime re-saves: a no-op
    assert seen == [] and saver.write_mismatches == 0
    saver.put_writes(stored, [("ch", "other")], "task")  # update_state / resume: the first write is kept
    assert [(m.kind, m.idx, m.stored_channel, m.new_channel) for m in seen] == [("edit", 0, "ch", "ch")]
    assert seen[0].stored_digest != seen[0].new_digest and saver.write_mismatches == 1
    saver.put_writes(stored, [(INTERRUPT, "first")], "task")
    saver.put_writes(stored, [(INTERRUPT, "second")], "task")
    tup = saver.get_tuple(stored)
    assert tup is not None
    assert sorted(tup.pending_writes) == sorted([("task", "ch", "v"), ("task", INTERRUPT, "second")])
    assert len(records(backend, user, "t", "c/", depth=3)) == 2


def test_strict_writes_raise_on_a_recomputation_that_differs(saver: Checkpointer) -> None:
    strict = copy.copy(saver)
    strict.strict_writes = True
    stored = put(strict, cfg("t"), x=1)
    strict.put_writes(stored, [("a", 1)], "task", "~path")
    strict.put_writes(stored, [("a", 1)], "task", "~path")  # identical: a no-op
    with pytest.raises(StepMismatchError) as info:
        strict.put_writes(stored, [("a", 2), ("b", 3)], "task", "~path")  # idx 0 differs: idx 1 not written either
    assert info.value.stored_digest != info.value.new_digest
    tup = strict.get_tuple(stored)
    assert tup is not None and tup.pending_writes == [("task", "a", 1)]
    strict.put_writes(stored, [("a", 5)], "task")  # no task path: an edit, kept-first even when strict
    assert strict.get_tuple(stored).pending_writes == [("task", "a", 1)]  # type: ignore[union-attr]


def test_put_writes_keeps_stored_writes_and_adds_new_ones(saver: Checkpointer) -> None:
    stored = put(saver, cfg("t"), x=1)
    saver.put_writes(stored, [("a", 1)], "task")
    saver.put_writes(stored, [("a", 2), ("b", 3)], "task")  # idx 0 is stored: kept; idx 1 is new: written
    tup = saver.get_tuple(stored)
    assert tup is not None and tup.pending_writes == [("task", "a", 1), ("task", "b", 3)]
    assert saver.write_mismatches == 1


def test_checkpoint_record_is_append_only(saver: Checkpointer) -> None:
    cp = ckpt(x=1)
    meta = {"source": "loop", "step": 0}
    saver.put(cfg("t"), cp, meta, {"x": "1"})
    saver.put(cfg("t"), cp, meta, {"x": "1"})  # identical: no-op
    with pytest.raises(StepMismatchError):
        saver.put(cfg("t"), cp, {"source": "loop", "step": 1}, {"x": "1"})
    tup = saver.get_tuple(cfg("t"))
    assert tup is not None and tup.metadata["step"] == 0


def test_namespaces_with_colon_and_pipe(saver: Checkpointer) -> None:
    spaces = ["", "a:1", "a:1|b:2", "a:1|b:2|c:3"]
    latest = {}
    for ns in spaces:
        latest[ns] = chain(saver, "t", 2, ns)[-1]["configurable"]["checkpoint_id"]
    for ns in spaces:
        tup = saver.get_tuple(cfg("t", ns))
        assert tup is not None
        assert tup.config["configurable"]["checkpoint_ns"] == ns
        assert tup.checkpoint["id"] == latest[ns]
        assert [t.config["configurable"]["checkpoint_ns"] for t in saver.list(cfg("t", ns))] == [ns, ns]
    everything = list(saver.list({"configurable": {"thread_id": "t"}}))
    ids = [t.checkpoint["id"] for t in everything]
    assert len(ids) == 8 and ids == sorted(ids, reverse=True)
    assert {t.config["configurable"]["checkpoint_ns"] for t in everything} == set(spaces)


def test_get_next_version_is_monotonic_str_and_unique_across_forks(saver: Checkpointer) -> None:
    versions = [saver.get_next_version(None, None)]
    for _ in range(20):
        versions.append(saver.get_next_version(versions[-1], None))
    assert all(isinstance(v, str) for v in versions)
    assert versions == sorted(versions) and len(set(versions)) == len(versions)
    forks = {saver.get_next_version(versions[3], None) for _ in range(50)}
    assert len(forks) == 50 and all(versions[3] < f < versions[5] for f in forks)
    assert saver.get_next_version(7, None) > saver.get_next_version(6, None)


def test_metadata_many_keys_nested_and_filters_match_brute_force(saver: Checkpointer) -> None:
    thread = "t"
    parent = None
    for i in range(6):
        # even checkpoints carry 20 more scalar keys than fit in the 16 tags, odd ones few
        meta: dict[str, Any] = {f"k{j:02}": (i + j) % 3 for j in range(20)} if i % 2 == 0 else {}
        meta.update(
            source="loop" if i % 2 else "input",
            step=i,
            run_id=f"run-{i % 2}",
            nested={"a": {"b": i % 2}},
            zz_late=f"v{i % 3}",  # sorts after the 15 tagged keys: never a tag
            flag=bool(i % 2),
            ratio=float(i % 2),
        )
        stored = put(saver, cfg(thread, "", parent), meta, x=i)
        parent = stored["configurable"]["checkpoint_id"]
    everything = list(saver.list(cfg(thread)))
    assert len(everything) == 6
    assert sorted(len(t.metadata) for t in everything) == [7, 7, 7, 27, 27, 27]
    assert everything[0].metadata["nested"] == {"a": {"b": 1}}

    filters: list[dict[str, Any]] = [
        {"source": "input"},
        {"run_id": "run-1", "step": 3},
        {"zz_late": "v1"},
        {"k19": 2},
        {"nested": {"a": {"b": 0}}},
        {"source": "loop", "zz_late": "v0"},
        {"flag": True},
        {"flag": 1},
        {"ratio": 1},
        {"step": "1"},
        {"missing": None},
        {"source": "nope"},
    ]
    for n, flt in enumerate(filters):
        expected = [
            t.checkpoint["id"] for t in everything if all(k in t.metadata and t.metadata[k] == v for k, v in flt.items())
        ]
        got = [t.checkpoint["id"] for t in saver.list(cfg(thread), filter=flt)]
        assert got == expected, flt
        got_limited = [t.checkpoint["id"] for t in saver.list(cfg(thread), filter=flt, limit=1)]
        assert got_limited == expected[:1], flt
        if n < 4:  # the every-namespace path reads and filters in Python
            got_all_ns = [t.checkpoint["id"] for t in saver.list({"configurable": {"thread_id": thread}}, filter=flt)]
            assert got_all_ns == expected, flt


def test_list_before_limit_and_every_thread(saver: Checkpointer) -> None:
    ids = [c["configurable"]["checkpoint_id"] for c in chain(saver, "t1", 4)]
    other = chain(saver, "t2", 2)
    got = [t.checkpoint["id"] for t in saver.list(cfg("t1"), before=cfg("t1", "", ids[2]), limit=1)]
    assert got == [ids[1]]
    every = list(saver.list(None))
    assert len(every) == 6
    assert {t.config["configurable"]["thread_id"] for t in every} == {"t1", "t2"}
    assert [t.checkpoint["id"] for t in every] == sorted((t.checkpoint["id"] for t in every), reverse=True)
    assert list(saver.list(None, limit=0)) == []
    assert saver.get_tuple(cfg("t2")) is not None and len(other) == 2


def test_bound_views_manage_only_their_own_threads(backend: Backend) -> None:
    root = Checkpointer(backend)
    alice, bob = root.for_user(new_user()), root.for_user(new_user())
    for s in (alice, bob):
        chain(s, "t", 3, run_id="shared-run")
        chain(s, "keep", 2, run_id="other-run")

    alice.prune(["t"])
    assert len(list(alice.list(cfg("t")))) == 1
    assert len(list(bob.list(cfg("t")))) == 3

    alice.copy_thread("keep", "copy")
    assert len(list(alice.list(cfg("copy")))) == 2
    assert list(bob.list(cfg("copy"))) == []

    alice.delete_for_runs(["shared-run"])
    assert list(alice.list(cfg("t"))) == []
    assert len(list(bob.list(cfg("t")))) == 3
    assert len(list(alice.list(cfg("keep")))) == 2

    assert {t.config["configurable"]["thread_id"] for t in alice.list(None)} == {"keep", "copy"}
    assert {t.config["configurable"]["thread_id"] for t in bob.list(None)} == {"t", "keep"}

    alice.delete_thread("keep")
    alice.prune(["copy"], strategy="delete")
    assert list(alice.list(None)) == []
    assert len(list(bob.list(None))) == 5

    # a bound view is authoritative: a config naming another user is refused before any I/O
    with pytest.raises(IsolationError, match="bound to user"):
        list(alice.list(cfg("t", user_id=bob.user)))
    assert list(alice.list(cfg("t", user_id=alice.user))) == []  # naming the view's own user is fine


async def test_async_twins_manage_threads_too(saver: Checkpointer) -> None:
    chain(saver, "t", 3, run_id="r1")
    await saver.aprune(["t"])
    assert len([t async for t in saver.alist(cfg("t"))]) == 1
    await saver.acopy_thread("t", "t2")
    assert (await saver.aget_tuple(cfg("t2"))) is not None
    await saver.adelete_for_runs(["r1"])
    assert [t async for t in saver.alist(None)] == []
    cp = ckpt(x=5)
    stored = await saver.aput(cfg("t3"), cp, {"source": "loop", "step": 0}, {"x": "1"})
    await saver.aput_writes(stored, [("c", 1)], "task", "~p")
    tup = await saver.aget_tuple(stored)
    assert tup is not None and tup.checkpoint["channel_values"] == {"x": 5} and tup.pending_writes == [("task", "c", 1)]
    await saver.adelete_thread("t3")
    assert await saver.aget_tuple(stored) is None
    with pytest.raises(ValueError, match="strategy"):
        await saver.aprune(["t"], strategy="bogus")


def test_require_user_fails_closed_before_io(backend: Backend) -> None:
    strict = Checkpointer(backend, require_user=True)
    cp = ckpt(x=1)
    attempts = [
        lambda: strict.put(cfg("t"), cp, {}, {"x": "1"}),
        lambda: strict.put_writes(cfg("t", "", cp["id"]), [("a", 1)], "task"),
        lambda: strict.get_tuple(cfg("t")),
        lambda: list(strict.list(cfg("t"))),
        lambda: list(strict.list(None)),
        lambda: strict.delete_thread("t"),
        lambda: strict.copy_thread("t", "u"),
        lambda: strict.prune(["t"]),
        lambda: strict.delete_for_runs(["r"]),
    ]
    for attempt in attempts:
        with pytest.raises(IsolationError):
            attempt()
    assert backend.partitions(ANONYMOUS_USER, "langgraph") == []
    # a user from the config or a binding is enough
    u = new_user()
    strict.put(cfg("t", user_id=u), cp, {}, {"x": "1"})
    tup = strict.for_user(u).get_tuple(cfg("t"))
    assert tup is not None and tup.checkpoint["channel_values"] == {"x": 1}
    assert backend.partitions(ANONYMOUS_USER, "langgraph") == []


def test_anonymous_user_is_a_user_of_its_own(backend: Backend) -> None:
    anon, named = Checkpointer(backend), Checkpointer(backend).for_user(new_user())
    put(anon, cfg("t"), x="anon")
    assert named.get_tuple(cfg("t")) is None
    tup = anon.get_tuple(cfg("t"))
    assert tup is not None and tup.checkpoint["channel_values"] == {"x": "anon"}
    anon.delete_thread("t")


@pytest.mark.timeout(60)
async def test_sync_methods_inside_a_running_loop_do_not_deadlock(saver: Checkpointer) -> None:
    stored = put(saver, cfg("t"), x=1)
    saver.put_writes(stored, [("c", 1)], "task")
    assert saver.get_tuple(stored) is not None
    assert len(list(saver.list(cfg("t")))) == 1
    saver.copy_thread("t", "t2")
    saver.prune(["t2"])
    saver.delete_thread("t2")
    # and the async twins interleave with other tasks on the same loop
    results = await asyncio.gather(*(saver.aget_tuple(stored) for _ in range(5)), asyncio.sleep(0))
    assert all(r is not None for r in results[:5])


def test_over_cap_value_raises_and_stores_nothing(backend: Backend, user: str) -> None:
    small = Checkpointer(backend, max_item_bytes=10_000).for_user(user)
    cp = ckpt(ok="x", big="y" * 20_000)
    with pytest.raises(ItemTooLargeError) as info:
        small.put(cfg("t"), cp, {"source": "loop"}, dict(cp["channel_versions"]))
    assert "big" in str(info.value) and info.value.limit == 10_000
    assert records(backend, user, "t") == []
    stored = put(small, cfg("t"), x=1)
    before = records(backend, user, "t")
    with pytest.raises(ItemTooLargeError):
        small.put_writes(stored, [("fine", 1), ("huge", "z" * 20_000)], "task")
    assert [r.name for r in records(backend, user, "t")] == [r.name for r in before]
    with pytest.raises(ItemTooLargeError):  # metadata counts towards the checkpoint record
        put(small, cfg("t"), {"source": "loop", "note": "n" * 20_000}, x=2)
    assert len(records(backend, user, "t")) == len(before)


def test_writes_of_one_call_are_packed_under_the_cap(backend: Backend, user: str) -> None:
    small = Checkpointer(backend, max_item_bytes=10_000).for_user(user)
    stored = put(small, cfg("t"), x=1)
    values = [str(i) * 4_000 for i in range(3)]  # fit alone, not all three in one record
    small.put_writes(stored, [("a", values[0]), ("b", values[1]), ("c", values[2]), (INTERRUPT, "i")], "task")
    small.put_writes(stored, [("d", 1), ("e", 2)], "other")
    tails = sorted(r.name.split("/", 3)[3] for r in records(backend, user, "t", "c/", depth=3))
    assert tails == ["_other/0", "_task/-3", "_task/0", "_task/2"]  # 0..1 packed, 2 alone (cap), the special write
    tup = small.get_tuple(cfg("t"))
    assert tup is not None
    assert sorted(tup.pending_writes) == sorted(
        [("task", "a", values[0]), ("task", "b", values[1]), ("task", "c", values[2]), ("task", INTERRUPT, "i"),
         ("other", "d", 1), ("other", "e", 2)]
    )
    small.put_writes(stored, [("a", values[0]), ("b", values[1]), ("c", values[2])], "task")  # a re-save: no-op
    assert small.write_mismatches == 0
    small.put_writes(stored, [("a", values[0]), ("b", values[1]), ("c", "changed")], "task")  # kept, reported
    assert small.write_mismatches == 1
    assert len(records(backend, user, "t", "c/", depth=3)) == 4
    assert ("task", "c", values[2]) in small.get_tuple(cfg("t")).pending_writes  # type: ignore[union-attr]


def test_unserializable_value_gives_a_clear_error_and_stores_nothing(saver: Checkpointer, backend: Backend, user: str) -> None:
    cp = ckpt(fine=1, bad=lambda: None)
    with pytest.raises(TypeError, match="'bad'.*cannot serialize.*nothing was written"):
        saver.put(cfg("t"), cp, {}, dict(cp["channel_versions"]))
    assert records(backend, user, "t") == []
    stored = put(saver, cfg("t"), x=1)
    with pytest.raises(TypeError, match="cannot serialize"):
        saver.put_writes(stored, [("a", 1), ("b", object())], "task")
    assert records(backend, user, "t", "c/", depth=3) == []


def test_equal_values_are_stored_once(saver: Checkpointer, backend: Backend, user: str) -> None:
    value = "v" * 50_000
    one, two = "1" * OVER_INLINE, "2" * OVER_INLINE  # over the inline limit: blobs too
    first = ckpt(big=value, other=one)
    saver.put(cfg("t"), first, {}, {"big": "1", "other": "1"})
    second = generate_checkpoint(channel_values={"big": value, "other": two}, channel_versions={"big": "2", "other": "2"})
    stored = saver.put(cfg("t", "", first["id"]), second, {}, {"big": "2", "other": "2"})
    blobs = records(backend, user, "t", "b/")
    assert len(blobs) == 3  # one 50 KB value, two small ones
    assert sum(len(b.value) > 50_000 for b in blobs) == 1
    tup = saver.get_tuple(stored)
    assert tup is not None and tup.checkpoint["channel_values"] == {"big": value, "other": two}
    saver.copy_thread("t", "t2")
    assert len(records(backend, user, "t2", "b/")) == 3


def test_unchanged_channels_come_from_the_parent_also_in_a_new_process(backend: Backend, user: str) -> None:
    writer = Checkpointer(backend).for_user(user)
    first = ckpt(a="kept", b=1)
    stored = writer.put(cfg("t"), first, {}, {"a": "1", "b": "1"})
    fresh = Checkpointer(backend).for_user(user)  # no cache: reads the parent record
    second = generate_checkpoint(channel_values={"b": 2}, channel_versions={"a": "1", "b": "2"})
    fresh.put(cfg("t", "", stored["configurable"]["checkpoint_id"]), second, {}, {"b": "2"})
    tup = fresh.get_tuple(cfg("t"))
    assert tup is not None and tup.checkpoint["channel_values"] == {"a": "kept", "b": 2}


def test_small_values_live_inside_the_checkpoint_record(saver: Checkpointer, backend: Backend, user: str) -> None:
    big = "b" * OVER_INLINE
    first = put(saver, cfg("t"), x=1, s="small", big=big)
    assert len(records(backend, user, "t", "b/")) == 1  # only the large value has a blob
    second = generate_checkpoint(channel_values={"x": 2}, channel_versions={"x": "2", "s": "1", "big": "1"})
    stored = saver.put(first, second, {}, {"x": "2"})  # s and big unchanged: inherited
    for fresh in (saver, Checkpointer(backend).for_user(user)):  # cached and read from the store
        tup = fresh.get_tuple(stored)
        assert tup is not None and tup.checkpoint["channel_values"] == {"x": 2, "s": "small", "big": big}
    assert len(records(backend, user, "t", "b/")) == 1


def test_format_1_records_still_read(saver: Checkpointer, backend: Backend, user: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A record written before inline values (format 1: every value in a blob) reads as before."""
    monkeypatch.setattr(_saver_flows, "_INLINE_MAX", 0)
    stored = put(saver, cfg("t"), x=1, s="small")
    (rec,) = records(backend, user, "t", "c/")
    kind, raw = _saver_flows._unframe(rec.value)
    payload = saver.serde.loads_typed((kind, raw))
    assert payload.pop("inline") == {} and len(payload["blobs"]) == 2
    payload["v"] = 1
    data = _saver_flows._frame(saver.serde.dumps_typed(payload))
    backend.write(Partition(user, "langgraph", "t"), [Put(rec.name, data, digest(data), new_etag(), dict(rec.tags), Mode.UPSERT)])
    tup = Checkpointer(backend).for_user(user).get_tuple(stored)
    assert tup is not None and tup.checkpoint["channel_values"] == {"x": 1, "s": "small"}


def test_format_2_writes_under_w_still_read_and_removed(saver: Checkpointer, backend: Backend, user: str) -> None:
    """Records of format 1 and 2 had their writes under ``w/<ns>/<cid>/``; they read, copy and prune as before."""
    part = Partition(user, "langgraph", "t")
    first = put(saver, cfg("t"), x=1)
    saver.put_writes(first, [("a", "old")], "task")
    second = put(saver, first, x=2)
    saver.put_writes(second, [("b", "old")], "task")
    for rec in records(backend, user, "t", "c/", depth=1):  # both checkpoints become format 2 ...
        kind, raw = _saver_flows._unframe(rec.value)
        payload = saver.serde.loads_typed((kind, raw))
        payload["v"] = 2
        data = _saver_flows._frame(saver.serde.dumps_typed(payload))
        backend.write(part, [Put(rec.name, data, digest(data), new_etag(), dict(rec.tags), Mode.UPSERT)])
    for rec in records(backend, user, "t", "c/", depth=3):  # ... with their writes where 0.2 put them
        old = "w/" + rec.name[len("c/") :]
        # as 0.1 wrote them: a bare content digest, no seal (a moved sealed record would fail its seal)
        backend.write(part, [Put(old, rec.value, digest(rec.value), new_etag(), {}, Mode.APPEND)], [Delete(rec.name)])
    saver.put_writes(second, [("c", "new")], "other")  # written after the upgrade: the new layout
    fresh = Checkpointer(backend).for_user(user)
    tup = fresh.get_tuple(cfg("t"))
    assert tup is not None and sorted(tup.pending_writes) == [("other", "c", "new"), ("task", "b", "old")]
    listed = list(fresh.list(cfg("t")))
    assert [sorted(t.pending_writes) for t in listed] == [[("other", "c", "new"), ("task", "b", "old")], [("task", "a", "old")]]
    fresh.copy_thread("t", "t2")
    assert sorted(fresh.get_tuple(cfg("t2")).pending_writes) == sorted(tup.pending_writes)  # type: ignore[union-attr]
    fresh.prune(["t"])  # keeps the latest checkpoint and its writes in both layouts
    assert [r.name.split("/")[-2:] for r in records(backend, user, "t", "w/")] == [["_task", "0"]]
    assert sorted(fresh.get_tuple(cfg("t")).pending_writes) == sorted(tup.pending_writes)  # type: ignore[union-attr]
    fresh.prune(["t2"], strategy="delete")
    assert records(backend, user, "t2") == []


def test_prune_and_delete_for_runs_remove_unreferenced_blobs(saver: Checkpointer, backend: Backend, user: str) -> None:
    chain(saver, "t", 4, run_id="r", big=True)  # x = 0, 1, 2, 3: four blobs
    assert len(records(backend, user, "t", "b/")) == 4
    saver.prune(["t"])
    tup = saver.get_tuple(cfg("t"))
    assert tup is not None and tup.checkpoint["channel_values"] == {"x": _big(3)}
    assert len(records(backend, user, "t", "b/")) == 1
    chain(saver, "u", 2, run_id="r1", big=True)
    stored = put(saver, cfg("u", "", saver.get_tuple(cfg("u")).checkpoint["id"]), {"run_id": "r2"}, x=_big(99))  # type: ignore[union-attr]
    saver.put_writes(stored, [("c", 1)], "task")
    saver.delete_for_runs(["r2"])
    assert len(records(backend, user, "u", "b/")) == 2
    assert records(backend, user, "u", "c/", depth=3) == []


def _tamper(
    backend: Backend, user: str, thread: str, prefix: str, value: bytes | None = None, depth: int | None = None
) -> None:
    """Rewrite one record through the backend API: new bytes, old digest (or new bytes, true digest)."""
    (rec,) = [r for r in records(backend, user, thread, prefix, depth)][:1]
    data = value if value is not None else rec.value[:-1] + bytes([rec.value[-1] ^ 1])
    sha = rec.digest if value is None else digest(data)
    backend.write(Partition(user, "langgraph", thread), [Put(rec.name, data, sha, new_etag(), dict(rec.tags), Mode.UPSERT)])


@pytest.mark.parametrize(("prefix", "depth"), [("c/", 1), ("b/", None), ("c/", 3)], ids=["checkpoint", "blob", "writes"])
def test_altered_bytes_raise_corrupt_item_error(
    saver: Checkpointer, backend: Backend, user: str, prefix: str, depth: int | None
) -> None:
    stored = put(saver, cfg("t"), x="p" * OVER_INLINE)  # a blob (not inline)
    saver.put_writes(stored, [("c", "write")], "task")
    _tamper(backend, user, "t", prefix, depth=depth)
    with pytest.raises(CorruptItemError):
        saver.get_tuple(cfg("t"))
    with pytest.raises(CorruptItemError):
        list(saver.list(cfg("t")))


def test_undecodable_record_raises_corrupt_item_error(saver: Checkpointer, backend: Backend, user: str) -> None:
    put(saver, cfg("t"), x=1)
    _tamper(backend, user, "t", "c/", value=b"\x06pickle" + b"\x80\x04K\x01.")  # never unpickled
    with pytest.raises(CorruptItemError, match="'pickle' is never decoded"):
        saver.get_tuple(cfg("t"))


# -- isolation with hostile ids -------------------------------------------------------

USERS = ["alice", "alice2", "a*[a]?", "", "\x00ü/ß:é", "x" * 1000]
THREADS = ["t", "/:*?[%", "..", "\x00", "ü∂", "", "a/../b"]


def test_users_never_see_each_other_with_hostile_ids(backend: Backend) -> None:
    root = Checkpointer(backend)
    views = {u: root.for_user(u) for u in USERS}
    for u, s in views.items():
        for t in THREADS:
            stored = put(s, cfg(t, "ns:1|x"), {"source": "loop", "run_id": "same-run"}, owner=u)
            s.put_writes(stored, [("w", u)], "task")
    for u, s in views.items():
        for t in THREADS:
            tup = s.get_tuple(cfg(t, "ns:1|x"))
            assert tup is not None and tup.checkpoint["channel_values"] == {"owner": u}, (u, t)
            assert tup.pending_writes == [("task", "w", u)]
        listed = list(s.list(None))
        assert sorted(x.config["configurable"]["thread_id"] for x in listed) == sorted(THREADS)
        assert {x.checkpoint["channel_values"]["owner"] for x in listed} == {u}
    # one user's management calls leave everyone else complete
    victim, actor = "alice", "alice2"
    a = views[actor]
    a.prune(THREADS[:4])
    a.copy_thread(THREADS[4], "copied")
    assert a.get_tuple(cfg("copied", "ns:1|x")) is not None
    a.delete_for_runs(["same-run"])
    assert list(a.list(None)) == []
    for t in THREADS:
        a.delete_thread(t)
    for u, s in views.items():
        if u == actor:
            continue
        assert len(list(s.list(None))) == len(THREADS), u
    assert views[victim].get_tuple(cfg("copied")) is None


# -- runtime smoke test and constructors ------------------------------------------------


def test_compiled_graph_runs_on_the_checkpointer(saver: Checkpointer) -> None:
    from typing import TypedDict

    from langgraph.graph import END, START, StateGraph

    class State(TypedDict):
        n: int
        log: list[str]

    builder = StateGraph(State)
    builder.add_node("double", lambda s: {"n": s["n"] * 2, "log": [*s["log"], "double"]})
    builder.add_node("inc", lambda s: {"n": s["n"] + 1, "log": [*s["log"], "inc"]})
    builder.add_edge(START, "double")
    builder.add_edge("double", "inc")
    builder.add_edge("inc", END)
    graph = builder.compile(checkpointer=saver)
    config = {"configurable": {"thread_id": "g/1"}}
    assert graph.invoke({"n": 3, "log": []}, config) == {"n": 7, "log": ["double", "inc"]}
    assert graph.get_state(config).values == {"n": 7, "log": ["double", "inc"]}
    assert len(list(graph.get_state_history(config))) == 4
    result = asyncio.run(graph.ainvoke({"n": 1, "log": []}, {"configurable": {"thread_id": "g/2"}}))
    assert result == {"n": 3, "log": ["double", "inc"]}


def test_constructors_and_context_managers(tmp_path: Path) -> None:
    with MemoryCheckpointer() as mem:
        put(mem, cfg("t"), x=1)
        assert mem.get_tuple(cfg("t")) is not None
    url_saver = Checkpointer.from_url("memory://", user="alice")
    assert url_saver.user == "alice"
    path = tmp_path / "lg.db"
    with SqliteCheckpointer.from_conn_string(path) as saver:
        put(saver.for_user("alice"), cfg("t"), x=1)

    async def reopen() -> Any:
        async with SqliteCheckpointer.from_conn_string(str(path)) as again:
            return await again.for_user("alice").aget_tuple(cfg("t"))

    tup = asyncio.run(reopen())
    assert tup is not None and tup.checkpoint["channel_values"] == {"x": 1}
    with Checkpointer.from_url(f"sqlite:///{path}", user="bob") as bob:
        assert bob.get_tuple(cfg("t")) is None


def test_redis_checkpointer_opens_its_backend(redis_url: str) -> None:
    prefix = f"t{uuid.uuid4().hex[:12]}"
    with RedisCheckpointer(redis_url, prefix=prefix, user="alice", max_item_bytes=50_000) as saver:
        assert saver.max_item_bytes == 50_000 and saver.user == "alice"
        put(saver, cfg("t"), x=1)
        tup = saver.get_tuple(cfg("t"))
        assert tup is not None and tup.checkpoint["channel_values"] == {"x": 1}
        saver.delete_thread("t")
        assert saver.get_tuple(cfg("t")) is None


def test_s3_checkpointer_opens_its_backend(s3_http_client: Any) -> None:
    from tests.plugins.s3_plugin import BUCKET

    with S3Checkpointer(BUCKET, f"t-{uuid.uuid4().hex}", client=s3_http_client, user="alice") as saver:
        put(saver, cfg("t"), x=1)
        tup = saver.get_tuple(cfg("t"))
        assert tup is not None and tup.checkpoint["channel_values"] == {"x": 1}
        saver.delete_thread("t")
        assert saver.get_tuple(cfg("t")) is None


async def test_acting_for_names_the_user_of_calls_without_one(backend: Backend) -> None:
    root = Checkpointer(backend, require_user=True)
    alice, bob = new_user(), new_user()
    put(root, cfg("t", user_id=alice), x="alice's")
    with pytest.raises(IsolationError):
        root.get_tuple(cfg("t"))
    with root.acting_for(alice) as acting:
        tup = acting.get_tuple(cfg("t"))  # a config with no user_id, as get_state(subgraphs=True) builds
        assert tup is not None and tup.checkpoint["channel_values"] == {"x": "alice's"}
        with pytest.raises(IsolationError):  # inside the block, as for a bound view: no other user
            root.get_tuple(cfg("t", user_id=bob))
        assert root.for_user(bob).get_tuple(cfg("t")) is None  # a view's own binding wins
        assert (await asyncio.create_task(root.aget_tuple(cfg("t")))) is not None  # tasks inherit it
    with pytest.raises(IsolationError):
        root.get_tuple(cfg("t"))
    with root.acting_for(bob):
        assert root.get_tuple(cfg("t")) is None
        assert list(root.list(None)) == []
