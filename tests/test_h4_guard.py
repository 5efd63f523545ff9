"""Guards in the Redis write script: an ``IF_MATCH`` put whose etag is its ``if_match``.

Every write made without a lease carries one (the lease record re-put
unchanged: "nobody holds it"). ``redis.py`` sends the leading guards of a
batch as two script arguments each (name, and etag, digest and tag pairs in
one string) instead of the nine of a put, after the deletes; ``write.lua``
checks them first, with one comparison when the guard holds. These tests pin
that the compact form is what is sent and that it answers exactly as the
nine-argument put did: kept as stored, refused (with the batch's own
conflict index) when the record moved or is absent, written when the stored
record carries the guard's etag but other content, damage reported.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import pytest

from checkpointers._flows import make_put
from checkpointers._names import Partition
from checkpointers.backends import redis as redis_module
from checkpointers.backends.base import Delete, Mode, Put, Record
from checkpointers.backends.redis import RedisBackend
from checkpointers.errors import CorruptItemError


@pytest.fixture(params=["redis", "redis_stock"])
def each_redis(request: pytest.FixtureRequest) -> RedisBackend:
    """The backend on each transport in turn: lean (the default), then stock."""
    return request.getfixturevalue(f"{request.param}_backend")  # type: ignore[no-any-return]


def _guard_of(rec: Record) -> Put:
    """``rec`` re-put unchanged on condition that it is still the stored one (as leases.py builds it)."""
    return Put(rec.name, rec.value, rec.digest, rec.etag, dict(rec.tags), Mode.IF_MATCH, rec.etag)


def _stored(b: RedisBackend, p: Partition, name: str) -> Record:
    rec = b.get(p, [name])[0]
    assert rec is not None
    return rec


def _setup(b: RedisBackend, name: str) -> tuple[Partition, Record]:
    p = Partition("h4guard", "items", name)
    res = b.write(p, [make_put("lease", b'{"token":0}', tags={"kind": "lease"})])
    assert res.conflict is None
    return p, res.records[0]


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """(guards, argument count) of every write script call's arguments built."""
    calls: list[tuple[int, int]] = []
    build = redis_module._write_args

    def spy(ttl_ms: int, puts: Sequence[Put], deletes: Sequence[Delete], ahead: bool, guards: int = 0) -> list[Any]:
        args = build(ttl_ms, puts, deletes, ahead, guards)
        calls.append((guards, len(args)))
        return args

    monkeypatch.setattr(redis_module, "_write_args", spy)
    return calls


def test_a_leading_guard_goes_as_two_arguments_and_is_kept_as_stored(
    each_redis: RedisBackend, sent: list[tuple[int, int]]
) -> None:
    b = each_redis
    p, lease = _setup(b, "kept")
    sent.clear()
    res = b.write(p, [_guard_of(lease), make_put("c/_1", b"one", tags={"step": "1"})])
    assert res.conflict is None
    assert sent == [(1, 3 + 9 + 2)]  # not 3 + 2 * 9
    kept, put = res.records
    assert (kept.name, kept.etag, kept.seq) == ("lease", lease.etag, lease.seq)
    assert (kept.value, kept.tags) == (lease.value, lease.tags)
    assert put.name == "c/_1" and put.seq == lease.seq + 1  # the guard took no seq
    assert _stored(b, p, "lease") == lease  # nothing rewritten


def test_two_guards_then_puts_in_batch_order(each_redis: RedisBackend, sent: list[tuple[int, int]]) -> None:
    b = each_redis
    p, lease = _setup(b, "two")
    other = b.write(p, [make_put("other", b"x")]).records[0]
    sent.clear()
    puts = [_guard_of(lease), _guard_of(other), make_put("c/_1", b"a"), make_put("c/_2", b"b")]
    res = b.write(p, puts)
    assert res.conflict is None and sent == [(2, 3 + 2 * 9 + 2 * 2)]
    assert [r.name for r in res.records] == ["lease", "other", "c/_1", "c/_2"]
    assert [r.seq for r in res.records] == [lease.seq, other.seq, other.seq + 1, other.seq + 2]


def test_a_guard_after_a_put_or_alone_goes_as_a_put(each_redis: RedisBackend, sent: list[tuple[int, int]]) -> None:
    b = each_redis
    p, lease = _setup(b, "late")
    sent.clear()
    res = b.write(p, [make_put("c/_1", b"a"), _guard_of(lease)])
    assert res.conflict is None and sent == [(0, 3 + 2 * 9)]
    assert [r.name for r in res.records] == ["c/_1", "lease"] and res.records[1].seq == lease.seq
    sent.clear()
    res = b.write(p, [_guard_of(lease)])
    assert res.conflict is None and sent == [(0, 3 + 9)] and res.records[0].seq == lease.seq


def test_a_moved_guard_refuses_the_batch_with_its_own_index(each_redis: RedisBackend) -> None:
    b = each_redis
    p, lease = _setup(b, "moved")
    moved = b.write(p, [make_put("lease", b'{"token":1}', tags={"kind": "lease"})]).records[0]
    before = b.get(p, ["lease", "c/_1"])
    res = b.write(p, [_guard_of(lease), make_put("c/_1", b"one")], [Delete("gone")])
    assert res.records == [] and res.conflict is not None
    assert (res.conflict.index, res.conflict.name) == (0, "lease")
    assert res.conflict.existing is not None and res.conflict.existing.etag == moved.etag
    assert b.get(p, ["lease", "c/_1"]) == before  # nothing applied


def test_an_absent_guard_record_refuses_the_batch(each_redis: RedisBackend) -> None:
    b = each_redis
    p, lease = _setup(b, "absent")
    ghost = dataclasses.replace(_guard_of(lease), name="nobody")
    res = b.write(p, [ghost, make_put("c/_1", b"one")])
    assert res.conflict is not None
    assert (res.conflict.index, res.conflict.name, res.conflict.existing) == (0, "nobody", None)
    assert b.get(p, ["c/_1"]) == [None]


def test_conflicts_behind_a_guard_keep_their_batch_index(each_redis: RedisBackend) -> None:
    b = each_redis
    p, lease = _setup(b, "index")
    b.write(p, [make_put("c/_1", b"one"), make_put("c/_3", b"three")])
    res = b.write(p, [_guard_of(lease), make_put("c/_2", b"two"), make_put("c/_1", b"again", mode=Mode.CREATE)])
    assert res.conflict is not None and (res.conflict.index, res.conflict.name) == (2, "c/_1")
    res = b.write(p, [_guard_of(lease), make_put("c/_2", b"two")], [Delete("c/_1"), Delete("c/_3", if_match="nope")])
    assert res.conflict is not None and (res.conflict.index, res.conflict.name) == (3, "c/_3")
    assert b.get(p, ["c/_2"]) == [None]


def test_a_guard_whose_etag_holds_other_content_is_written_as_before(
    each_redis: RedisBackend, sent: list[tuple[int, int]]
) -> None:
    """The nine-argument put wrote it (same etag, its own digest): the script says so and the
    client re-sends the batch in that form."""
    b = each_redis
    p, lease = _setup(b, "content")
    other = make_put("lease", b'{"token":9}', tags={"kind": "other"})
    odd = Put("lease", other.value, other.digest, lease.etag, dict(other.tags), Mode.IF_MATCH, lease.etag)
    sent.clear()
    res = b.write(p, [odd, make_put("c/_1", b"one")])
    assert res.conflict is None and sent == [(1, 3 + 9 + 2), (0, 3 + 2 * 9)]
    now = _stored(b, p, "lease")
    assert (now.value, now.digest, now.tags, now.etag) == (other.value, other.digest, {"kind": "other"}, lease.etag)
    assert now.seq > lease.seq and res.records[0].seq == now.seq


def test_a_damaged_guard_record_is_reported_not_refused(each_redis: RedisBackend) -> None:
    b = each_redis
    p, lease = _setup(b, "damaged")
    client = b._link.sync_client()
    r = b.keys_of(p)[0]
    client.hset(r, "m:lease", b"not-a-seq\n" + lease.etag.encode() + b"\nd\n\n{}\n=x")
    with pytest.raises(CorruptItemError) as caught:
        b.write(p, [_guard_of(lease), make_put("c/_1", b"one")])
    assert "lease" in str(caught.value)
    assert b.get(p, ["c/_1"]) == [None]


async def test_async_face_sends_the_same_guard(redis_backend: RedisBackend, sent: list[tuple[int, int]]) -> None:
    b = redis_backend
    p, lease = _setup(b, "async")
    sent.clear()
    res = await b.awrite(p, [_guard_of(lease), make_put("c/_1", b"one")])
    assert res.conflict is None and sent == [(1, 3 + 9 + 2)]
    assert [r.seq for r in res.records] == [lease.seq, lease.seq + 1]
    moved = (await b.awrite(p, [make_put("lease", b"{}")])).records[0]
    res = await b.awrite(p, [_guard_of(lease), make_put("c/_2", b"two")])
    assert res.conflict is not None and res.conflict.index == 0
    assert res.conflict.existing is not None and res.conflict.existing.etag == moved.etag


@pytest.mark.parametrize("field", ["etag", "digest"])
def test_a_newline_in_a_guard_or_a_put_is_refused_before_anything_is_sent(
    each_redis: RedisBackend, field: str, sent: list[tuple[int, int]]
) -> None:
    """The script splits metadata at newlines: neither form may carry one (the compact guard's string
    is ``\\n<etag>\\n<digest>\\n<pairs>\\n``, so a newline in it would shift what it is compared with)."""
    p, lease = _setup(each_redis, f"newline-{field}")
    bad_guard = dataclasses.replace(_guard_of(lease), **{field: getattr(lease, field) + "\nx"})
    if field == "etag":
        bad_guard = dataclasses.replace(bad_guard, if_match=bad_guard.etag)  # still guard-shaped
    assert redis_module._guards([bad_guard, make_put("c/_x", b"x")]) == 1
    sent.clear()  # the set-up's own write
    with pytest.raises(ValueError, match="newline"):
        each_redis.write(p, [bad_guard, make_put("c/_x", b"x")])
    assert sent == []  # refused while building the arguments: no script call (not after a re-send)
    bad_put = dataclasses.replace(make_put("c/_y", b"y"), **{field: "a\nb"})
    with pytest.raises(ValueError, match="newline"):
        each_redis.write(p, [bad_put])
    assert each_redis.get(p, ["c/_x", "c/_y"]) == [None, None]
    assert _stored(each_redis, p, "lease") == lease
