"""Leases on the item API (issue 16), on every backend.

Acquire / held / expiry / reclaim with a higher token; renew and release of a
taken-over lease; a stale holder's batch commits nothing; concurrent writes
of one holder; writes without a lease on a held scope; the recovery scan and
its isolation; sync/async parity; a hypothesis property over random
interleavings of several owners (injectable clock); and the pause races: a
holder paused between its steps (every backend), and on S3 a holder paused
*inside* the backend's batch, after its pre-read.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from checkpointers import Store
from checkpointers._flows import run
from checkpointers._integrity import Integrity
from checkpointers._names import Partition
from checkpointers.backends.base import Backend, ListQuery, Mode, Put
from checkpointers.backends.memory import MemoryBackend
from checkpointers.errors import (
    CheckpointerError,
    ConcurrencyError,
    InvalidArgumentError,
    LeaseHeldError,
    LeaseLostError,
)
from checkpointers.leases import (
    LEASE_NAME,
    Lease,
    LeaseMemo,
    LeaseSite,
    acquire,
    expired_listed_flow,
    guarded_write_flow,
    listed_site,
)
from tests.lease_helpers import FakeClock, GatedBackend, GatedObjectStore


def _store(backend: Backend, clock: FakeClock, **options: Any) -> Store:
    return Store(backend, clock=clock, **options).for_user(f"u-{uuid.uuid4().hex}")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def leased(backend: Backend, clock: FakeClock) -> Store:
    return _store(backend, clock)


def _keys(store: Store, scope: str) -> dict[str, Any]:
    return {i.key: i.value for i in store.list_items(scope)}


def test_acquire_held_expire_reclaim(leased: Store, clock: FakeClock) -> None:
    a = leased.acquire_lease("runs/r1", "worker-a", ttl=10)
    assert (a.owner, a.scope, a.expires_at) == ("worker-a", "runs/r1", clock() + 10)
    with pytest.raises(LeaseHeldError) as held:
        leased.acquire_lease("runs/r1", "worker-b", ttl=10)
    assert (held.value.owner, held.value.token, held.value.until) == ("worker-a", a.token, a.expires_at)
    assert "worker-a" in str(held.value) and isinstance(held.value, CheckpointerError)
    clock.advance(10.001)
    b = leased.acquire_lease("runs/r1", "worker-b", ttl=10)
    assert b.token > a.token
    for stale in (a.renew, a.release):
        with pytest.raises(LeaseLostError) as lost:
            stale()
        assert (lost.value.current_owner, lost.value.current_token) == ("worker-b", b.token)
    info = leased.current_lease("runs/r1")
    assert info is not None and (info.owner, info.token, info.released) == ("worker-b", b.token, False)


def test_same_owner_again_is_a_new_holder(leased: Store) -> None:
    first = leased.acquire_lease("s", "w", ttl=5)
    second = leased.acquire_lease("s", "w", ttl=5)
    assert second.token > first.token
    with pytest.raises(LeaseLostError):
        leased.set_item("s", "k", 1, lease=first)
    assert leased.set_item("s", "k", 2, lease=second).value == 2


def test_stale_holder_batch_commits_nothing(leased: Store, clock: FakeClock) -> None:
    a = leased.acquire_lease("s", "a", ttl=1)
    with leased.batch("s", lease=a) as b:
        b.create("x", 1).set("y", 2).append_step("1", "one")
    clock.advance(2)
    b_lease = leased.acquire_lease("s", "b", ttl=5)
    before = _keys(leased, "s")
    with pytest.raises(LeaseLostError) as lost:
        with leased.batch("s", lease=a) as b:
            b.set("x", 10).create("z", 3).delete("y").append_step("2", "two")
    assert lost.value.current_token == b_lease.token
    for write in (
        lambda: leased.set_item("s", "x", 11, lease=a),
        lambda: leased.create_item("s", "w", 1, lease=a),
        lambda: leased.append_step("s", "3", "three", lease=a),
        lambda: leased.delete_item("s", "y", lease=a),
    ):
        with pytest.raises(LeaseLostError):
            write()
    assert _keys(leased, "s") == before == {"x": 1, "y": 2, "steps/1": "one"}


def test_renew_release_and_unleased_writes(leased: Store, clock: FakeClock) -> None:
    lease = leased.acquire_lease("s", "a", ttl=2)
    clock.advance(1.5)
    assert lease.renew().expires_at == clock() + 2
    clock.advance(1.5)  # past the first expiry, within the renewed one
    with pytest.raises(LeaseHeldError) as held:
        leased.set_item("s", "k", "unleased")
    assert held.value.owner == "a" and held.value.until == lease.expires_at
    leased.set_item("s", "k", "leased", lease=lease)
    with pytest.raises(LeaseHeldError):
        leased.delete_item("s", "k")
    assert leased.delete_item("s", "absent") is False  # finds nothing, writes nothing: no lease check
    lease.release()
    lease.release()  # idempotent
    assert lease.released and leased.expired_leases() == []
    with pytest.raises(LeaseLostError):
        leased.set_item("s", "k", "after release", lease=lease)
    assert leased.set_item("s", "k", "unleased").value == "unleased"
    nxt = leased.acquire_lease("s", "b", ttl=2)
    assert nxt.token > lease.token


def test_expired_unreleased_lease_still_fences_until_taken_over(leased: Store, clock: FakeClock) -> None:
    lease = leased.acquire_lease("s", "a", ttl=1)
    clock.advance(5)
    assert leased.set_item("s", "k", 1, lease=lease).value == 1  # nobody took it over: still the holder
    assert leased.set_item("s", "k", 2).value == 2  # expired: writes without a lease go through
    assert lease.renew().remaining() == pytest.approx(1)
    with pytest.raises(LeaseHeldError):
        leased.set_item("s", "k", 3)


def test_allow_unleased_writes(backend: Backend, clock: FakeClock) -> None:
    store = _store(backend, clock, unleased="allow")
    lease = store.acquire_lease("s", "a", ttl=10)
    assert store.set_item("s", "k", "unleased").value == "unleased"
    assert store.set_item("s", "k", "leased", lease=lease).value == "leased"
    with pytest.raises(InvalidArgumentError):
        Store(backend, unleased="maybe")  # type: ignore[arg-type]


def test_bad_arguments(leased: Store) -> None:
    for owner, ttl in (("", 1), ("a", 0), ("a", -1), (None, 1), ("a", True), ("a", "1")):
        with pytest.raises(InvalidArgumentError):
            leased.acquire_lease("s", owner, ttl)  # type: ignore[arg-type]
    lease = leased.acquire_lease("s", "a", ttl=5)
    with pytest.raises(InvalidArgumentError):
        leased.set_item("other", "k", 1, lease=lease)
    with pytest.raises(InvalidArgumentError):
        leased.for_user("someone-else").set_item("s", "k", 1, lease=lease)
    with pytest.raises(InvalidArgumentError):
        leased.set_item("s", "k", 1, lease="token")  # type: ignore[arg-type]
    assert leased.list_items("s") == []


def test_the_lease_record_is_not_an_item(leased: Store) -> None:
    leased.acquire_lease("s", "a", ttl=5)
    assert leased.list_items("s") == [] and leased.get_item("s", LEASE_NAME) is None


def test_token_grows_after_the_partition_is_deleted(leased: Store, backend: Backend, clock: FakeClock) -> None:
    first = leased.acquire_lease("s", "a", ttl=5)
    for _ in range(3):
        first.release()
        first = leased.acquire_lease("s", "a", ttl=5)
    backend.drop(leased.partition("s"))
    assert leased.current_lease("s") is None
    with pytest.raises(LeaseLostError):
        leased.set_item("s", "k", 1, lease=first)
    clock.advance(1)  # the floor is the clock: a new holder after the delete needs a later millisecond
    again = leased.acquire_lease("s", "b", ttl=5)
    assert again.token > first.token


def test_concurrent_writes_of_one_holder_do_not_fail(leased: Store) -> None:
    # On S3 this once starved (each fenced write's pre-read met the batch fenced just before it and
    # repeated until its 10 s ran out); a read no longer repeats for a batch it met whole (_s3_batch.py).
    lease = leased.acquire_lease("s", "a", ttl=60)
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        try:
            for i in range(3):
                leased.set_item("s", f"k{n}-{i}", i, lease=lease)
                if n == 0:
                    lease.renew()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(leased.list_items("s")) == 15


def test_recovery_scan_is_per_user_and_bounded(backend: Backend, clock: FakeClock) -> None:
    alice, bob = _store(backend, clock), _store(backend, clock)
    for scope in ("a/1", "a/2", "a/3"):
        alice.acquire_lease(scope, "w1", ttl=1)
    alice.acquire_lease("a/held", "w1", ttl=100)
    alice.acquire_lease("a/released", "w1", ttl=1).release()
    alice.create_item("a/plain", "k", 1)
    bob.acquire_lease("b/1", "w9", ttl=1)
    bob.acquire_lease("a/1", "w9", ttl=100)  # same scope name, bob's own
    clock.advance(2)
    found = alice.expired_leases()
    assert [(i.scope, i.owner, i.released) for i in found] == [(f"a/{n}", "w1", False) for n in (1, 2, 3)]
    assert [i.scope for i in alice.expired_leases(limit=2)] == ["a/1", "a/2"]
    assert alice.expired_leases(limit=0) == [] and len(alice.expired_leases(limit=None)) == 3
    with pytest.raises(InvalidArgumentError):
        alice.expired_leases(limit=-1)
    assert [i.scope for i in bob.expired_leases()] == ["b/1"]
    reclaimed = alice.acquire_lease(found[0].scope, "w2", ttl=5)
    assert reclaimed.token > found[0].token
    assert [i.scope for i in alice.expired_leases()] == ["a/2", "a/3"]


def test_async_parity(backend: Backend, clock: FakeClock) -> None:
    store = _store(backend, clock)

    async def main() -> None:
        async with await store.aacquire_lease("s", "a", ttl=1) as lease:
            async with store.abatch("s", lease=lease) as b:
                b.set("k", 1)
            await store.aset_item("s", "j", 2, lease=lease)
            await lease.arenew(ttl=3)
            assert lease.expires_at == clock() + 3
            with pytest.raises(LeaseHeldError):
                await store.aacquire_lease("s", "b", ttl=1)
        assert (await store.acurrent_lease("s")).released  # type: ignore[union-attr]
        other = await store.aacquire_lease("s", "b", ttl=1)
        clock.advance(2)
        assert [i.scope for i in await store.aexpired_leases()] == ["s"]
        with pytest.raises(LeaseLostError):
            await store.adelete_item("s", "k", lease=lease)
        with pytest.raises(LeaseLostError):
            await lease.arenew()
        assert await store.adelete_item("s", "k", lease=other)

    asyncio.run(main())
    assert _keys(store, "s") == {"j": 2}


def test_context_manager_releases_and_keeps_the_block_error(leased: Store, clock: FakeClock) -> None:
    with leased.acquire_lease("s", "a", ttl=1) as lease:
        pass
    assert lease.released
    with pytest.raises(ZeroDivisionError):
        with leased.acquire_lease("s", "a", ttl=1):
            clock.advance(2)
            leased.acquire_lease("s", "b", ttl=5)
            1 / 0  # noqa: B018 - the block's own error wins over the lost lease on exit
    with pytest.raises(LeaseLostError):
        with leased.acquire_lease("s", "b", ttl=1):
            clock.advance(2)
            leased.acquire_lease("s", "c", ttl=5)


def test_face_hooks_several_leases_in_one_partition(backend: Backend, clock: FakeClock) -> None:
    """What a face uses: its own partition, one lease per run in it, fenced writes, the listed scan."""
    integrity = Integrity(keys=[])
    partition = Partition(f"u-{uuid.uuid4().hex}", "face-test", "checkpoints")
    run1, run2 = (listed_site(integrity, partition, "lease/", r) for r in ("run/1", "run:2"))
    a = run(acquire(run1, backend, "w1", 1, clock), backend)
    run(acquire(run2, backend, "w1", 10, clock), backend)
    with pytest.raises(LeaseHeldError):
        run(acquire(run1, backend, "w2", 1, clock), backend)
    put = integrity.put(partition, "c/1", b"x", etag="e1")
    assert run(guarded_write_flow(run1, a, [put], [], clock=clock), backend).conflict is None
    clock.advance(2)
    assert [i.scope for i in run(expired_listed_flow(integrity, partition, "lease/", 10, clock), backend)] == ["run/1"]
    run(acquire(run1, backend, "w2", 1, clock), backend)
    with pytest.raises(LeaseLostError):
        run(guarded_write_flow(run1, a, [integrity.put(partition, "c/2", b"y", etag="e2")], [], clock=clock), backend)
    assert backend.get(partition, ["c/2"]) == [None]


# -- a holder paused between its steps, and inside S3's batch -----------------------


def _paused_write(store: Store, gated: Any, write: Any) -> tuple[threading.Thread, Any, list[BaseException]]:
    """Start ``write()`` in a thread whose next gated call pauses; return once it is paused."""
    outcome: list[BaseException] = []
    started = threading.Event()
    gate_box: list[Any] = []

    def run() -> None:
        gate_box.append(gated.gate(threading.get_ident()))
        started.set()
        try:
            write()
        except BaseException as exc:  # noqa: BLE001 - checked by the caller
            outcome.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    assert started.wait(10)
    gate = gate_box[0]
    assert gate.reached.wait(30), "the write never reached its pause"
    return thread, gate, outcome


def test_holder_paused_between_steps_is_fenced_out(backend: Backend, clock: FakeClock) -> None:
    gated = GatedBackend(backend)
    store = _store(gated, clock)
    a = store.acquire_lease("s", "a", ttl=2)
    store.set_item("s", "k", "a-1", lease=a)
    thread, gate, outcome = _paused_write(store, gated, lambda: store.set_item("s", "k", "a-2", lease=a))
    clock.advance(3)  # a is paused past its expiry (GC pause, SIGSTOP)
    b = store.acquire_lease("s", "b", ttl=2)
    store.set_item("s", "k", "b-1", lease=b)
    gate.opened.set()
    thread.join()
    assert len(outcome) == 1 and isinstance(outcome[0], LeaseLostError)
    assert store.get_item("s", "k").value == "b-1"  # type: ignore[union-attr]


@pytest.mark.parametrize("backend_name", ["s3", "s3_http"])
def test_s3_holder_paused_inside_its_batch(backend: Backend, clock: FakeClock) -> None:
    """A stale holder's batch paused after the S3 backend's pre-read, while another takes the lease over."""
    gated = GatedObjectStore.install(backend)
    store = _store(backend, clock)
    a = store.acquire_lease("s", "a", ttl=2)
    thread, gate, outcome = _paused_write(store, gated, lambda: store.set_item("s", "k", "a-late", lease=a))
    clock.advance(3)
    b = store.acquire_lease("s", "b", ttl=2)
    gate.opened.set()
    thread.join()
    assert store.get_item("s", "k") is None, "the stale holder's write landed after the takeover"
    assert len(outcome) == 1 and isinstance(outcome[0], LeaseLostError)
    assert store.current_lease("s").token == b.token  # type: ignore[union-attr]


# -- the property: random interleavings of several owners ----------------------------

OWNERS = ("a", "b", "c")
_step = st.one_of(
    st.tuples(st.just("acquire"), st.sampled_from(OWNERS), st.sampled_from([1.0, 4.0])),
    st.tuples(st.just("renew"), st.sampled_from(OWNERS), st.just(0)),
    st.tuples(st.just("release"), st.sampled_from(OWNERS), st.just(0)),
    st.tuples(st.just("advance"), st.just(""), st.sampled_from([0.5, 2.0, 5.0])),
    st.tuples(st.just("write"), st.sampled_from(OWNERS), st.integers(0, 2)),
    st.tuples(st.just("unleased"), st.just(""), st.integers(0, 2)),
)


class _Model:
    """What must happen: the stored lease (owner, token, expiry ms, released) and the items."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.lease: tuple[str, int, float, bool] | None = None
        self.items: dict[str, Any] = {}
        self.tokens: list[int] = []
        self.write_tokens: list[int] = []
        self.released: set[int] = set()

    def held_by_other(self, owner: str) -> bool:
        return self.lease is not None and self.lease[0] != owner and not self.lease[3] and self.clock() < self.lease[2]

    def held(self) -> bool:
        return self.lease is not None and not self.lease[3] and self.clock() < self.lease[2]

    def current(self, lease: Lease | None) -> bool:
        return lease is not None and self.lease is not None and self.lease[1] == lease.token


def _apply(store: Store, model: _Model, leases: dict[str, Lease], step: tuple[str, str, Any], n: int) -> None:
    kind, owner, arg = step
    lease = leases.get(owner)
    if kind == "acquire":
        if model.held_by_other(owner):
            with pytest.raises(LeaseHeldError):
                store.acquire_lease("p", owner, ttl=arg)
            return
        new = leases[owner] = store.acquire_lease("p", owner, ttl=arg)
        assert not model.tokens or new.token > model.tokens[-1], "a token repeated or went back"
        model.tokens.append(new.token)
        model.lease = (owner, new.token, new.expires_at, False)
    elif kind in ("renew", "release") and lease is not None:
        # releasing again is a no-op once this holder released (whatever happened since)
        ok = (kind == "release" and lease.token in model.released) or (
            model.current(lease) and (kind == "release" or not model.lease[3])  # type: ignore[index]
        )
        if not ok:
            with pytest.raises(LeaseLostError):
                lease.renew() if kind == "renew" else lease.release()
            return
        lease.renew() if kind == "renew" else lease.release()
        if model.current(lease):
            model.lease = (owner, lease.token, lease.expires_at, kind == "release")
        if kind == "release":
            model.released.add(lease.token)
    elif kind == "advance":
        model.clock.advance(arg)
    elif kind == "write" and lease is not None:
        value = {"owner": owner, "token": lease.token, "n": n}
        if not (model.current(lease) and not model.lease[3]):  # type: ignore[index]
            with pytest.raises(LeaseLostError):
                with store.batch("p", lease=lease) as b:
                    b.set(f"k{arg}", value).set("last", value)
            return
        with store.batch("p", lease=lease) as b:
            b.set(f"k{arg}", value).set("last", value)
        model.items[f"k{arg}"] = model.items["last"] = value
        model.write_tokens.append(lease.token)
    elif kind == "unleased":
        if model.held():
            with pytest.raises(LeaseHeldError):
                store.set_item("p", f"k{arg}", n)
            return
        store.set_item("p", f"k{arg}", n)
        model.items[f"k{arg}"] = n


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(steps=st.lists(_step, min_size=1, max_size=14))
def test_random_interleavings(backend: Backend, steps: list[tuple[str, str, Any]]) -> None:
    clock = FakeClock()
    store = _store(backend, clock)
    model, leases = _Model(clock), {}
    for n, step in enumerate(steps):
        _apply(store, model, leases, step, n)
    assert _keys(store, "p") == model.items
    # No write of a holder landed after a later holder's first write: fenced writes' tokens never go back.
    assert model.write_tokens == sorted(model.write_tokens)


# -- writes without a lease carry "no live lease" themselves (issue 15) ---------------

#: The backends that check a batch's conditions in one transaction / script. The races below
#: run them with ``inline_conditions`` on (whatever they declare): the path is safe on each.
INLINE = ["memory", "sqlite", "redis", "redis_stock", "redis_cluster", "postgres"]


def _inline(backend: Backend) -> Backend:
    """``backend`` with writes without a lease carrying their condition (one backend write)."""
    backend.inline_conditions = True
    return backend


class _Counting(GatedBackend):
    """A gated backend that also counts ``get``/``write`` calls, with the inner backend's capability."""

    def __init__(self, inner: Backend) -> None:
        super().__init__(inner)
        self.inline_conditions = inner.inline_conditions
        self.calls: dict[str, int] = {}

    def get(self, partition: Partition, names: Any) -> Any:
        self.calls["get"] = self.calls.get("get", 0) + 1
        return super().get(partition, names)

    def write(self, partition: Partition, puts: Any, deletes: Any = ()) -> Any:
        self.calls["write"] = self.calls.get("write", 0) + 1
        return super().write(partition, puts, deletes)


def _peer(backend: Backend, clock: FakeClock, store: Store) -> Store:
    """Another process's store of the same user over ``backend`` (its own memo of lease versions)."""
    assert store.user is not None
    return Store(backend, clock=clock).for_user(store.user)


def _counted(counting: _Counting, write: Any) -> dict[str, int]:
    counting.calls.clear()
    write()
    return dict(counting.calls)


def test_an_unleased_write_is_one_backend_write(backend: Backend, clock: FakeClock) -> None:
    counting = _Counting(backend)
    store = _store(counting, clock)
    one = {"write": 1} if backend.inline_conditions else {"get": 1, "write": 1}
    assert _counted(counting, lambda: store.set_item("s", "k", 1)) == one  # a fresh scope: no read either
    assert _counted(counting, lambda: store.set_item("s", "k", 2)) == one
    cold = _peer(counting, clock, store)  # another process: knows no version yet
    assert cold.set_item("s", "j", 3).value == 3
    assert _counted(counting, lambda: cold.set_item("s", "j", 4)) == one
    # the vacant record (if any) is no lease and no item
    assert store.current_lease("s") is None and store.expired_leases() == []
    assert _keys(store, "s") == {"k": 2, "j": 4} and store.get_item("s", LEASE_NAME) is None
    lease = cold.acquire_lease("s", "a", ttl=5)  # over the vacant record: a conditional write
    assert store.current_lease("s").owner == "a"  # type: ignore[union-attr]
    for writer in (store, cold, _peer(backend, clock, store)):  # warm, warm, cold
        with pytest.raises(LeaseHeldError):
            writer.set_item("s", "k", "unleased")
        with pytest.raises(LeaseHeldError):
            writer.delete_item("s", "j")
    assert _keys(store, "s") == {"k": 2, "j": 4}
    lease.release()
    assert store.set_item("s", "k", 5).value == 5 and store.delete_item("s", "j")
    assert cold.acquire_lease("s", "b", ttl=5).token > lease.token


@pytest.mark.parametrize("backend_name", INLINE)
def test_a_stale_version_after_the_scope_was_deleted(backend: Backend, clock: FakeClock) -> None:
    store = _store(_inline(backend), clock)
    store.set_item("s", "k", 1)
    backend.drop(store.partition("s"))  # another process deleted the scope: the known version is gone
    assert store.set_item("s", "k", 2).value == 2
    with store.batch("s") as b:  # a batch's own conflict keeps its index (puts, then deletes)
        b.set("x", 1).delete("k")
    with pytest.raises(ConcurrencyError):
        store.create_item("s", "x", 2)
    assert _keys(store, "s") == {"x": 1} and store.current_lease("s") is None


@pytest.mark.parametrize("backend_name", INLINE)
def test_deletes_only_create_no_vacant_record(backend: Backend, clock: FakeClock) -> None:
    """A scope written with ``allow`` (no lease record), emptied without a lease, is gone."""
    _inline(backend)
    allow = _store(backend, clock, unleased="allow")
    allow.set_item("s", "k", 1)
    assert _peer(backend, clock, allow).delete_item("s", "k")
    assert backend.partitions(allow.user or "", "items") == []


@pytest.mark.parametrize("backend_name", INLINE)
@pytest.mark.parametrize("warm", [False, True], ids=["first-write", "known-version"])
def test_an_acquire_before_an_unleased_write_lands_refuses_it(
    backend: Backend, clock: FakeClock, warm: bool
) -> None:
    """The write paused right before its one backend write while an acquire lands: refused, nothing written.

    ``first-write``: the scope has no lease record yet (the acquire creates
    it; the documented window of the read-first path); ``known-version``:
    the writer carries the vacant record's version that the acquire replaces.
    """
    gated = _inline(GatedBackend(_inline(backend)))
    store = _store(gated, clock)
    if warm:
        store.set_item("s", "before", 0)
    thread, gate, outcome = _paused_write(store, gated, lambda: store.set_item("s", "k", "late"))
    lease = _peer(backend, clock, store).acquire_lease("s", "a", ttl=30)
    gate.opened.set()
    thread.join()
    assert len(outcome) == 1 and isinstance(outcome[0], LeaseHeldError) and outcome[0].token == lease.token
    assert store.get_item("s", "k") is None


def _unleased_writes(store: Store, scope: str, w: int, start: threading.Barrier, out: dict[str, list[str]]) -> None:
    start.wait()
    for i in range(15):
        key = f"w{w}-{i}"
        try:
            store.set_item(scope, key, i)
            out["landed"].append(key)
        except LeaseHeldError:
            out["refused"].append(key)


@pytest.mark.parametrize("backend_name", INLINE)
def test_no_unleased_write_lands_after_a_racing_acquire(backend: Backend, clock: FakeClock) -> None:
    """Threads writing without a lease race one acquire: every write that landed came before it (seq order)."""
    store = _store(_inline(backend), clock)
    for round_ in range(3):  # each round a fresh scope: the first writes race the first acquire
        scope = f"r{round_}"
        out: dict[str, list[str]] = {"landed": [], "refused": []}
        start = threading.Barrier(4)
        threads = [threading.Thread(target=_unleased_writes, args=(store, scope, w, start, out)) for w in range(3)]
        for t in threads:
            t.start()
        start.wait()
        lease = _peer(backend, clock, store).acquire_lease(scope, "a", ttl=60)
        for t in threads:
            t.join()
        records = {r.name: r for r in backend.list(store.partition(scope), ListQuery())}
        fence = records[LEASE_NAME].seq
        assert store.current_lease(scope).token == lease.token  # type: ignore[union-attr]
        assert set(_keys(store, scope)) == set(out["landed"]) and len(out["landed"]) + len(out["refused"]) == 45
        late = [n for n, r in records.items() if n != LEASE_NAME and r.seq > fence]
        assert late == [], f"unleased writes landed after the acquire: {late}"


def test_lease_memo_is_bounded() -> None:
    memo = LeaseMemo(size=2)
    integrity = Integrity(None)
    sites = [LeaseSite(integrity, Partition("u", "items", f"s{i}"), f"s{i}") for i in range(3)]
    states = [object() for _ in sites]
    for site, state in zip(sites, states, strict=True):
        memo.put(site, state)  # type: ignore[arg-type]
    assert len(memo) == 2 and memo.get(sites[0]) is None and memo.get(sites[2]) is states[2]
    memo.put(sites[2], None)
    assert memo.get(sites[2]) is None and len(memo) == 1


def test_memory_keeps_an_unchanged_reput_as_stored() -> None:
    """An ``IF_MATCH`` re-put of the stored record itself is a check only on memory: same record, same seq."""
    backend = MemoryBackend()
    p = Partition("u", "items", "s")
    put = Put("r", b"v", "d", "e1", {"t": "1"}, Mode.CREATE)
    (stored,) = backend.write(p, [put]).records
    (again,) = backend.write(p, [replace(put, mode=Mode.IF_MATCH, if_match="e1")]).records
    assert again is stored and again.seq == stored.seq
    changed = replace(put, digest="d2", etag="e2", mode=Mode.IF_MATCH, if_match="e1")
    assert backend.write(p, [changed]).records[0].seq > stored.seq  # another digest: written
    (now,) = backend.get(p, ["r"])
    assert now is not None
    retagged = replace(changed, tags={"t": "2"}, if_match="e2")  # same etag and digest, other tags
    (written,) = backend.write(p, [retagged]).records
    assert written.seq > now.seq and backend.get(p, ["r"])[0].tags == {"t": "2"}  # type: ignore[union-attr]
    assert backend.write(p, [replace(put, etag="e3", mode=Mode.IF_MATCH, if_match="e1")]).conflict is not None
    assert backend.write(p, [replace(put, etag="e2", mode=Mode.IF_MATCH, if_match="e2")]).records[0].seq > written.seq
