"""The write script's apply step, checked on the raw keys it leaves.

``lua/write.lua`` builds every index change in lists that start with room
for one or two records and are made only when a batch needs them (old index
members, removed fields, tag members), and returns a kept record's metadata
by scanning from where its parse stopped. These tests send batches that
outgrow every such list and take each lazily made one (an overwrite, a
delete, an append kept as stored), then compare the partition's raw keys
with what the key layout of ``docs/redis.md`` says they must hold.
"""

from __future__ import annotations

import dataclasses
import random

import pytest

from checkpointers._flows import make_put
from checkpointers._names import Partition
from checkpointers.backends.base import Delete, ListQuery, Mode, Record
from checkpointers.backends.redis import _INLINE_MAX, RedisBackend, _ancestors, _lua, _pad, _tag_pairs


@pytest.fixture(params=["redis", "redis_stock"])
def each_redis(request: pytest.FixtureRequest) -> RedisBackend:
    """The backend on each transport in turn: lean (the default), then stock."""
    return request.getfixturevalue(f"{request.param}_backend")  # type: ignore[no-any-return]


def _layout(records: list[Record]) -> tuple[set[bytes], set[bytes], set[bytes]]:
    """The members the names, seq and tag indexes must hold for ``records`` (docs/redis.md)."""
    names, seqs, tags = set(), set(), set()
    for rec in records:
        s = _pad(rec.seq)
        names.add(rec.name.encode())
        seqs.update(f"{a}|{s}|{rec.name}".encode() for a in _ancestors(rec.name))
        for pair in _tag_pairs(rec.tags):
            tags.add(f"s{pair}|{s}|{rec.name}".encode())
            tags.add(f"n{pair}|{rec.name}".encode())
    return names, seqs, tags


def _raw(backend: RedisBackend, partition: Partition) -> tuple[set[bytes], set[bytes], set[bytes], set[bytes]]:
    client = backend._link.sync_client()
    r, n, x, t, _seq = backend.keys_of(partition)
    return (
        set(client.zrange(n, 0, -1)),
        set(client.zrange(x, 0, -1)),
        set(client.zrange(t, 0, -1)),
        set(client.hkeys(r)),
    )


def _check(backend: RedisBackend, partition: Partition) -> list[Record]:
    """Every index member and hash field is exactly the live records' (no stale, none missing)."""
    live = backend.list(partition, ListQuery(prefix=""))
    names, seqs, tags, fields = _raw(backend, partition)
    assert (names, seqs, tags) == _layout(live)
    inline = {rec.name for rec in live if len(rec.value) <= _INLINE_MAX}
    want = {f"m:{rec.name}".encode() for rec in live}
    want |= {f"v:{rec.name}".encode() for rec in live if rec.name not in inline}
    assert fields == want
    return live


def test_batches_past_every_presized_list_leave_exactly_the_layout(each_redis: RedisBackend) -> None:
    b = each_redis
    p = Partition("writescript", "items", "presized")
    big = random.Random(1).randbytes(_INLINE_MAX + 1024)  # incompressible, past the inline cap
    three = {"k1": "a", "k2": "b b", "k3": "c|{}"}
    first = [
        make_put("c/_a", b"one", tags=three),
        make_put("c/_b", b"two", tags={"k1": "x"}),
        make_put("c/_c", big, tags=three),
        make_put("w/_d", b"four"),
        make_put("e", b"no ancestor", tags={"solo": "1"}),
    ]
    res = b.write(p, first)
    assert res.conflict is None and [r.seq for r in res.records] == [1, 2, 3, 4, 5]
    _check(b, p)

    kept = make_put("c/_b", b"two", tags={"k1": "x"}, mode=Mode.APPEND)  # same digest: kept as stored
    second = [
        make_put("c/_a", b"one again", tags={"k1": "changed", "k4": "new"}),  # overwrite: old members go
        kept,
        make_put("c/_c", b"small now", tags=three),  # a large record turned inline: its v: field goes
        make_put("c/_f", b"six", tags=three),
    ]
    res = b.write(p, second, [Delete("w/_d"), Delete("e")])
    assert res.conflict is None
    seqs = [r.seq for r in res.records]
    assert seqs == [6, 2, 7, 8]  # the kept append keeps its seq and takes none
    assert res.records[1].etag == first[1].etag and res.records[1].value == b"two"
    live = _check(b, p)
    assert [r.name for r in live] == ["c/_a", "c/_b", "c/_c", "c/_f"]
    assert b.get(p, ["c/_c"])[0].value == b"small now"  # type: ignore[union-attr]

    # the kept record's metadata as returned matches the stored one's, with or without an inline value
    stored_b = b.get(p, ["c/_b"])[0]
    assert stored_b is not None and (stored_b.etag, stored_b.seq, stored_b.tags) == (first[1].etag, 2, {"k1": "x"})
    res = b.write(p, [make_put("c/_g", big), make_put("c/_h", b"x")])
    assert res.conflict is None
    again = b.write(p, [make_put("c/_g", big, mode=Mode.APPEND), make_put("c/_h", b"x", mode=Mode.APPEND)])
    assert [(r.seq, r.etag, r.value) for r in again.records] == [(r.seq, r.etag, r.value) for r in res.records]
    _check(b, p)

    # a guard re-put under its own etag is kept as stored, beside a new record; then a checked
    # delete of everything empties the partition: no key, member or field is left
    guard = b.get(p, ["c/_f"])[0]
    assert guard is not None
    same = dataclasses.replace(
        make_put("c/_f", b"six", tags=three, mode=Mode.IF_MATCH, if_match=guard.etag), etag=guard.etag
    )
    top = max(r.seq for r in b.list(p, ListQuery(prefix="")))
    res = b.write(p, [same, make_put("c/_i", b"new", tags=three)])
    assert res.conflict is None and [r.seq for r in res.records] == [guard.seq, top + 1]
    live = _check(b, p)
    res = b.write(p, [], [Delete(r.name, if_match=r.etag) for r in live])
    assert res.conflict is None
    assert _raw(b, p) == (set(), set(), set(), set())


METAS = [
    b"7\netag\ndigest\n\n{}",  # an early layout: no last line
    b"7\netag\ndigest\na=b c=d\n{\"a\":\"b\",\"c\":\"d\"}\nz",  # compressed, in its own field
    b"7\netag\ndigest\n\n{}\n=raw\nvalue\n=with newlines",  # inline, raw
    b"12\ne\nd\nk=v\n{\"k\":\"v\"}\n~\x78\x01\n~\n=",  # inline, compressed
    b"3\ne\nd\n\n{\"x\":\"\\n=\"}",  # tags JSON holding an escaped newline
]


@pytest.mark.parametrize("meta", METAS)
def test_meta_only_from_where_the_parse_stopped_is_the_full_scan(redis_backend: RedisBackend, meta: bytes) -> None:
    """``meta_only(meta, pairs_end)`` (one find, as write.lua calls it for a kept record) cuts
    exactly where ``meta_only(meta)`` (five finds, as list.lua calls it) does."""
    probe = _lua("common").source + (
        "local meta = ARGV[1]\n"
        "local _, _, _, _, pairs_end = parse_meta(meta)\n"
        "return {meta_only(meta), meta_only(meta, pairs_end)}\n"
    )
    full, quick = redis_backend._link.sync_client().eval(probe, 0, meta)
    assert quick == full
    head = meta.split(b"\n", 4)
    tags, _, last = head[4].partition(b"\n")
    # as the client splits a field: an inline value's line opens with "=" or "~"
    assert full == (b"\n".join([*head[:4], tags]) if last[:1] in (b"=", b"~") else meta)
