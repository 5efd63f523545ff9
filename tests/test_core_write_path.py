"""The lean write path: the memory backend's write loop, batch checks, and the unleased-write helpers.

The memory backend keeps a partition's dict, sorted names and expiry itself in
``write`` (no per-put helper calls); these pin the branches that loop and its
expiry bookkeeping take, next to the conformance suite's general checks.
"""

from __future__ import annotations

import pytest

from checkpointers._flows import make_put
from checkpointers._integrity import Integrity
from checkpointers._names import Partition
from checkpointers.backends.base import Backend, Delete, ListQuery, Mode, Put, check_batch
from checkpointers.backends.memory import MemoryBackend
from checkpointers.leases import VACANT_OWNER, LeaseMemo, LeaseSite, LeaseState, _vacant_put

P = Partition("alice", "langgraph", "t1")


class _Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def test_a_write_after_the_ttl_was_dropped_clears_the_partitions_expiry() -> None:
    b = MemoryBackend(ttl=10)
    b.write(P, [make_put("a", b"1")])
    assert b.expiry(P) is not None
    b.set_retention(None)
    b.write(P, [make_put("b", b"2")])
    assert b.expiry(P) is None
    assert [r.name for r in b.list(P, ListQuery())] == ["a", "b"]


def test_a_write_to_an_expired_partition_after_the_ttl_was_dropped_starts_it_afresh() -> None:
    clock = _Clock()
    b = MemoryBackend(ttl=10, clock=clock)
    b.write(P, [make_put("a", b"1")])
    clock.now += 11
    b.set_retention(None, clock=clock)
    b.write(P, [make_put("b", b"2")])  # the old data never comes back; no expiry is stored any more
    assert [r.name for r in b.list(P, ListQuery())] == ["b"]
    assert b.expiry(P) is None


def test_a_rewrite_moves_the_record_last_in_seq_order_and_keeps_one_name() -> None:
    b = MemoryBackend()
    b.write(P, [make_put("a", b"1"), make_put("b", b"1")])
    b.write(P, [make_put("a", b"2")])
    assert [r.name for r in b.list(P, ListQuery(order="seq"))] == ["b", "a"]
    assert [r.name for r in b.list(P, ListQuery())] == ["a", "b"]
    assert b.get(P, ["a"])[0].value == b"2"  # type: ignore[union-attr]


def test_a_write_deleting_the_last_record_removes_the_partition() -> None:
    b = MemoryBackend(ttl=10)
    b.write(P, [make_put("a", b"1")])
    b.write(P, [], [Delete("a")])
    assert b.partitions("alice", "langgraph") == []
    assert b.expiry(P) is None


def test_an_unchanged_reput_keeps_the_stored_record_and_its_seq() -> None:
    b = MemoryBackend()
    (rec,) = b.write(P, [make_put("lease", b"v")]).records
    guard = Put(rec.name, rec.value, rec.digest, rec.etag, dict(rec.tags), Mode.IF_MATCH, rec.etag)
    out = b.write(P, [guard, make_put("c", b"x")]).records
    assert out[0] is b.get(P, ["lease"])[0]
    assert out[0].seq == rec.seq
    assert out[1].seq > rec.seq


@pytest.mark.parametrize(
    ("names", "deletes"),
    [(["a", "a"], []), (["a", "b", "a"], []), (["a"], ["a"]), ([], ["d", "d"]), (["a", "b"], ["b"])],
)
def test_check_batch_refuses_a_name_twice(names: list[str], deletes: list[str]) -> None:
    with pytest.raises(ValueError, match="twice"):
        check_batch([make_put(n, b"") for n in names], [Delete(d) for d in deletes])


@pytest.mark.parametrize(
    ("names", "deletes"), [(["a", "b"], []), (["a"], ["b"]), ([], ["c", "d"]), (["a", "b", "c"], [])]
)
def test_check_batch_accepts_distinct_names(names: list[str], deletes: list[str]) -> None:
    check_batch([make_put(n, b"") for n in names], [Delete(d) for d in deletes])


def _state(etag: str) -> LeaseState:
    site = LeaseSite(Integrity(keys=[]), P, "t1")
    put = _vacant_put(site)
    record = MemoryBackend().write(P, [Put(put.name, put.value, put.digest, etag, put.tags, Mode.CREATE)]).records[0]
    return LeaseState(VACANT_OWNER, 0, 0, True, record)


def test_a_lease_versions_guard_is_built_once_and_is_its_unchanged_reput() -> None:
    state = _state("e1")
    guard = state.guard()
    assert state.guard() is guard
    r = state.record
    assert guard == Put(r.name, r.value, r.digest, r.etag, dict(r.tags), Mode.IF_MATCH, r.etag)
    assert _state("e2").guard().if_match == "e2"
    assert state == LeaseState(state.owner, state.token, state.expires_ms, state.released, state.record)


class _ReadFirst(MemoryBackend):
    inline_conditions = False


@pytest.mark.parametrize(("backend", "has_memo"), [(MemoryBackend(), True), (_ReadFirst(), False)])
def test_lease_memo_for_backend_follows_inline_conditions(backend: Backend, has_memo: bool) -> None:
    memo = LeaseMemo.for_backend(backend)
    assert (memo is not None) is has_memo
    if memo is not None:
        assert len(memo) == 0
