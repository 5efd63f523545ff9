"""Retention: one meaning of ``ttl`` on every backend (see :class:`checkpointers.backends.base.Retention`).

The clock-driven tests run on every backend that keeps the expiry with the
partition and reads it against the backend's clock (memory, SQLite,
PostgreSQL, S3): the clock is injected with ``set_retention`` on the fresh
``backend`` fixture. Redis expires keys natively on the server's own time,
which no injected clock moves: it gets the same properties checked in real
time with a short ttl (``test_real_time_*``, every backend).
"""

from __future__ import annotations

import hashlib
import math
import threading
import time
import uuid

import pytest

from checkpointers._names import Partition
from checkpointers.backends import Backend, open_backend
from checkpointers.backends.base import (
    AUTO_SWEEP_LIMIT,
    ListQuery,
    Mode,
    Put,
    Retention,
    SweepPacer,
)
from checkpointers.backends.ops import GetOp, ListOp
from checkpointers.errors import InvalidArgumentError
from tests.conftest import BACKEND_NAMES

TTL = 100.0
#: S3 over HTTP (moto's server) runs the same code as in-process S3, much slower: its cases run under --deep.
DEEP_BACKENDS = {"s3_http"}


class Clock:
    """A settable clock starting at the real time (expiries stay plausible absolute times)."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def _put(name: str, value: bytes, tags: dict[str, str] | None = None) -> Put:
    digest = hashlib.sha256(value).hexdigest()
    return Put(name, value, digest=digest, etag=digest[:16], tags=tags or {}, mode=Mode.UPSERT)


def _part(user: str = "", name: str = "t1") -> Partition:
    return Partition(user or f"u-{uuid.uuid4().hex[:8]}", "items", name)


def _fill(backend: Backend, part: Partition, *names: str) -> None:
    result = backend.write(part, [_put(n, n.encode(), {"kind": "k"}) for n in names])
    assert result.conflict is None


#: The backends whose expiry follows their own clock (Redis: the server's; see the module docstring).
CLOCKED = [
    pytest.param(name, marks=pytest.mark.deep) if name in DEEP_BACKENDS else name
    for name in BACKEND_NAMES
    if not name.startswith("redis")
]


@pytest.fixture(params=CLOCKED)
def stored(request: pytest.FixtureRequest) -> Backend:
    """A fresh backend of every clocked kind."""
    return request.getfixturevalue(f"{request.param}_backend")  # type: ignore[no-any-return]


@pytest.fixture
def clocked(stored: Backend) -> tuple[Backend, Clock]:
    """The fresh backend with ttl=100 s on a settable clock."""
    clock = Clock()
    stored.set_retention(ttl=TTL, clock=clock)
    return stored, clock


def _reads(backend: Backend, part: Partition) -> dict[str, object]:
    """What every read path returns for ``part``."""
    many = backend.many([GetOp(part, ["a", "b"]), ListOp(part, ListQuery(prefix="a")), ListOp(part, ListQuery())])
    return {
        "get": backend.get(part, ["a", "b"]),
        "list": [r.name for r in backend.list(part, ListQuery())],
        "list_seq": [r.name for r in backend.list(part, ListQuery(order="seq", descending=True, limit=1))],
        "list_tag": [r.name for r in backend.list(part, ListQuery(tags={"kind": "k"}))],
        "list_children": [r.name for r in backend.list(part, ListQuery(depth=0, children=True))],
        "partitions": backend.partitions(part.user, part.space),
        "many": [[None if r is None else r.name for r in res] for res in many],
    }


EMPTY = {
    "get": [None, None],
    "list": [],
    "list_seq": [],
    "list_tag": [],
    "list_children": [],
    "partitions": [],
    "many": [[None, None], [], []],
}


def test_an_expired_partition_is_invisible_to_every_read_before_collection(clocked: tuple[Backend, Clock]) -> None:
    backend, clock = clocked
    part = _part()
    _fill(backend, part, "a", "b", "a/w")
    clock.advance(TTL - 1)
    assert _reads(backend, part)["list"] == ["a", "a/w", "b"]
    clock.advance(1)  # exactly ttl after the last write
    assert _reads(backend, part) == EMPTY
    assert [e.key for e in backend.expired()] == [part.key]  # not collected yet
    assert backend.users("items") == []


def test_a_write_after_expiry_starts_empty(clocked: tuple[Backend, Clock]) -> None:
    backend, clock = clocked
    part = _part()
    _fill(backend, part, "a", "b")
    clock.advance(TTL + 5)
    _fill(backend, part, "c")
    assert [r.name for r in backend.list(part, ListQuery())] == ["c"]
    assert backend.get(part, ["a", "b"]) == [None, None]
    assert backend.expired() == []
    clock.advance(TTL - 1)  # the rewrite set a new expiry
    assert [r.name for r in backend.list(part, ListQuery())] == ["c"]


def test_each_write_pushes_the_expiry_back_and_reads_do_not(clocked: tuple[Backend, Clock]) -> None:
    backend, clock = clocked
    part = _part()
    _fill(backend, part, "a")
    clock.advance(60)
    _fill(backend, part, "b")
    clock.advance(60)  # 120 s after the first write, 60 after the last
    assert backend.get(part, ["a", "b"])[0] is not None
    clock.advance(40)  # reads did not refresh
    assert backend.get(part, ["a"]) == [None]


def test_refresh_on_read_extends_only_past_half_the_ttl(stored: Backend) -> None:
    backend, clock = stored, Clock()
    backend.set_retention(ttl=TTL, refresh_on_read=True, clock=clock)
    part = _part()
    _fill(backend, part, "a")
    first = backend.expiry(part)
    assert first == pytest.approx(clock.now + TTL)
    clock.advance(30)
    backend.get(part, ["a"])  # 70 s left: no refresh
    assert backend.expiry(part) == first
    clock.advance(30)
    assert backend.list(part, ListQuery())  # 40 s left: refreshed to now + ttl
    assert backend.expiry(part) == pytest.approx(clock.now + TTL)
    clock.advance(60)
    backend.many([GetOp(part, ["a"]), ListOp(part, ListQuery(prefix="a"))])  # batched reads refresh too
    assert backend.expiry(part) == pytest.approx(clock.now + TTL)
    clock.advance(90)  # 210 s after the write: alive through the reads
    assert [r.name for r in backend.list(part, ListQuery())] == ["a"]


def test_sweep_removes_exactly_the_expired_partitions_bounded(clocked: tuple[Backend, Clock]) -> None:
    backend, clock = clocked
    alice, bob = f"alice-{uuid.uuid4().hex[:6]}", f"bob-{uuid.uuid4().hex[:6]}"
    old = [_part(alice, "t1"), _part(alice, "t2"), _part(bob, "t1")]
    for p in old:
        _fill(backend, p, "a")
    clock.advance(TTL / 2)
    fresh = [_part(alice, "t3"), _part(bob, "t2")]
    for p in fresh:
        _fill(backend, p, "a")
    clock.advance(TTL / 2)
    assert sorted(e.key for e in backend.expired()) == sorted(p.key for p in old)
    listed = backend.expired(limit=1)
    assert len(listed) == 1 and (listed[0].user, listed[0].space) in {(alice, "items"), (bob, "items")}
    assert backend.sweep(limit=2) == 2
    assert backend.sweep(limit=2) == 1
    assert backend.sweep() == 0
    assert backend.expired() == []
    for p in fresh:
        assert [r.name for r in backend.list(p, ListQuery())] == ["a"]
    assert backend.partitions(alice, "items") == ["t3"]
    assert backend.partitions(bob, "items") == ["t2"]
    assert backend.users("items") == sorted([alice, bob])
    clock.advance(-TTL)  # even back in time, what was swept stays gone
    assert all(backend.get(p, ["a"]) == [None] for p in old)


def test_users_and_sweep_keep_users_and_spaces_apart(clocked: tuple[Backend, Clock]) -> None:
    backend, clock = clocked
    alice, bob = f"alice-{uuid.uuid4().hex[:6]}", f"bob-{uuid.uuid4().hex[:6]}"
    a, b = _part(alice, "same"), _part(bob, "same")
    other_space = Partition(bob, "langgraph", "same")
    _fill(backend, a, "a")
    clock.advance(TTL / 2)
    _fill(backend, b, "b")
    _fill(backend, other_space, "c")
    assert set(backend.users()) >= {alice, bob}
    assert backend.users("langgraph") == [bob]
    clock.advance(TTL / 2)  # alice's expired, bob's not
    assert backend.users("items") == [bob]
    assert backend.sweep() == 1
    assert [r.name for r in backend.list(b, ListQuery())] == ["b"]
    assert [r.name for r in backend.list(other_space, ListQuery())] == ["c"]


def test_a_write_racing_a_sweep_is_never_lost(clocked: tuple[Backend, Clock]) -> None:
    """Expired partitions rewritten while sweeps run: each rewrite survives (the sweep re-checks inside its step)."""
    backend, clock = clocked
    user = f"u-{uuid.uuid4().hex[:6]}"
    parts = [_part(user, f"t{i}") for i in range(20)]
    for p in parts:
        _fill(backend, p, "old")
    clock.advance(TTL + 1)  # all expired; the clock stands still from here
    stop = threading.Event()
    errors: list[BaseException] = []

    def sweeper() -> None:
        try:
            while not stop.is_set():
                backend.sweep(limit=3)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    thread = threading.Thread(target=sweeper)
    thread.start()
    try:
        for p in parts:
            _fill(backend, p, "new")
    finally:
        stop.set()
        thread.join()
    assert errors == []
    backend.sweep()
    for p in parts:
        assert [r.name for r in backend.list(p, ListQuery())] == ["new"]


def test_writes_sweep_a_bounded_batch_at_a_bounded_rate(clocked: tuple[Backend, Clock]) -> None:
    backend, clock = clocked
    user = f"u-{uuid.uuid4().hex[:6]}"
    backend.set_retention(ttl=TTL, clock=clock)  # a fresh pacer: the next write sweeps
    _fill(backend, _part(user, "old"), "a")
    clock.advance(TTL)
    _fill(backend, _part(user, "w1"), "a")  # sweeps "old"
    assert backend.expired() == []
    _fill(backend, _part(user, "old2"), "a")
    clock.advance(TTL)
    _fill(backend, _part(user, "w2"), "a")  # first write in the new slot: sweeps w1 and old2
    _fill(backend, _part(user, "old3"), "a")
    clock.advance(TTL / 10 - 1)
    _fill(backend, _part(user, "w3"), "a")  # inside the slot: no sweep
    assert backend.expired() == []  # nothing expired yet: old3 is 9 s old
    clock.advance(TTL)
    _fill(backend, _part(user, "w4"), "a")  # a new slot: sweeps w2, old3 and w3
    assert backend.partitions(user, "items") == ["w4"]
    assert backend.expired() == []


def test_the_pacer_is_due_once_per_tenth_of_the_ttl_capped_at_a_minute() -> None:
    clock = Clock()
    pacer = SweepPacer(Retention(ttl=100, clock=clock))
    assert [pacer.due(), pacer.due()] == [True, False]
    clock.advance(9.9)
    assert not pacer.due()
    clock.advance(0.1)
    assert pacer.due()
    assert SweepPacer(Retention(ttl=86400.0)).interval == 60.0
    assert not SweepPacer(Retention()).due()
    assert AUTO_SWEEP_LIMIT == 64


@pytest.mark.parametrize("ttl", [0, -1, math.nan, math.inf, "10", True])
def test_an_invalid_ttl_is_refused_naming_it(ttl: object) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        Retention(ttl=ttl)  # type: ignore[arg-type]
    assert info.value.argument == "ttl"


def test_urls_carry_ttl_and_refresh_on_read(tmp_path: object) -> None:
    with open_backend("memory://?ttl=30&refresh_on_read=true") as backend:
        assert (backend.retention.ttl, backend.retention.refresh_on_read) == (30.0, True)
    with open_backend(f"sqlite:///{tmp_path}/x.db?ttl=0.5") as backend:
        assert (backend.retention.ttl, backend.retention.refresh_on_read) == (0.5, False)
    with pytest.raises(InvalidArgumentError, match="ttl"):
        open_backend("memory://?ttl=soon")
    with pytest.raises(InvalidArgumentError, match="ttl"):
        open_backend("memory://?ttl=0")


def test_a_store_without_ttl_keeps_everything(backend: Backend) -> None:
    part = _part()
    _fill(backend, part, "a")
    assert backend.retention.ttl is None
    assert backend.expiry(part) is None
    assert backend.sweep() == 0
    assert backend.get(part, ["a"])[0] is not None


def test_real_time_short_ttl(backend: Backend) -> None:
    """The real clock, ttl 3 s: visible, then gone on every read path, then swept; a rewrite starts empty.

    The ttl leaves room for a loaded machine (CI once took over 0.8 s to write and read moto's S3); the
    wait runs from the stored expiry, so the test sleeps only what is left of it.
    """
    backend.set_retention(ttl=3.0)
    part = _part()
    started = time.time()
    _fill(backend, part, "a", "b", "a/w")
    assert _reads(backend, part)["list"] == ["a", "a/w", "b"]
    expiry = backend.expiry(part)
    assert expiry is not None and started + 3.0 <= expiry <= time.time() + 3.0
    time.sleep(max(0.0, expiry - time.time()) + 0.2)
    assert _reads(backend, part) == EMPTY
    backend.sweep()
    assert backend.expired() == []
    backend.set_retention(ttl=30)
    _fill(backend, part, "c")
    assert [r.name for r in backend.list(part, ListQuery())] == ["c"]
    assert backend.users("items") == [part.user]


@pytest.fixture(params=[name for name in BACKEND_NAMES if name.startswith("redis")])
def redis_kind(request: pytest.FixtureRequest) -> Backend:
    """A fresh Redis backend of every transport and topology (the clocked tests cannot cover them)."""
    return request.getfixturevalue(f"{request.param}_backend")  # type: ignore[no-any-return]


def test_real_time_refresh_on_read(redis_kind: Backend) -> None:
    """Redis's refresh on read in real time (the other backends: the clocked test above)."""
    backend = redis_kind
    backend.set_retention(ttl=1.0, refresh_on_read=True)
    part = _part()
    _fill(backend, part, "a")
    for i in range(3):  # 1.8 s in all, reads past half the ttl keep it alive (a batched read too)
        time.sleep(0.6)
        if i == 1:
            assert backend.many([GetOp(part, ["a"]), ListOp(part, ListQuery())])[0][0] is not None
        else:
            assert backend.get(part, ["a"])[0] is not None
    time.sleep(1.3)
    assert backend.get(part, ["a"]) == [None]


def test_the_async_faces_agree(clocked: tuple[Backend, Clock]) -> None:
    """awrite/aget/alist/apartitions hide an expired partition; aexpired, asweep, ausers, aexpiry see it."""
    import asyncio

    backend, clock = clocked
    part = _part()

    async def main() -> None:
        assert (await backend.awrite(part, [_put("a", b"a")])).conflict is None
        assert await backend.aexpiry(part) == pytest.approx(clock.now + TTL)
        assert await backend.ausers("items") == [part.user]
        clock.advance(TTL)
        assert await backend.aget(part, ["a"]) == [None]
        assert await backend.alist(part, ListQuery()) == []
        assert await backend.apartitions(part.user, "items") == []
        assert [e.key for e in await backend.aexpired()] == [part.key]
        assert await backend.asweep() == 1
        assert await backend.aexpired() == [] and await backend.ausers("items") == []

    asyncio.run(main())
