"""The lean sync transport reads a round trip's replies straight from the hiredis reader.

``_redis_transport._sync_replies`` replaces one ``client.parse_response`` per
reply (which also goes through the connection's ``read_response``) with one
loop over the connection's hiredis reader, as the async face already does.
These tests pin that the lean sync path no longer calls ``parse_response``,
that what it returns is what ``parse_response`` returned (response callbacks,
error replies in place, ``NOSCRIPT`` then ``EVAL``, a key of the wrong type
reported as damage), and that a connection without a hiredis reader still
gets ``parse_response`` per reply.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis

from checkpointers._flows import make_put
from checkpointers._names import Partition
from checkpointers.backends import _redis_transport
from checkpointers.backends.base import ListQuery
from checkpointers.backends.redis import RedisBackend
from checkpointers.errors import CorruptItemError


@pytest.fixture
def parse_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The command names ``redis.Redis.parse_response`` is called for (it still runs)."""
    calls: list[str] = []
    real = redis.Redis.parse_response

    def spy(self: Any, connection: Any, command_name: Any, **options: Any) -> Any:
        calls.append(str(command_name))
        return real(self, connection, command_name, **options)

    monkeypatch.setattr(redis.Redis, "parse_response", spy)
    return calls


def _exercise(b: RedisBackend, name: str) -> tuple[Any, ...]:
    """Writes, reads, a listing, a script-cache loss and a wrong-type key: what each returned."""
    p = Partition("h4replies", "items", name)
    first = b.write(p, [make_put("c/_a", b"one", tags={"k": "v"})])
    second = b.write(p, [make_put("c/_b", b"two" * 500)])
    got = b.get(p, ["c/_a", "c/_b", "c/_none"])
    listed = b.list(p, ListQuery(prefix="c/"))
    b._link.sync_client().script_flush()  # NOSCRIPT, then EVAL (and the other scripts reloaded)
    third = b.write(p, [make_put("c/_c", b"three")])
    parts = b.partitions(p.user, p.space)
    b._link.sync_client().set(b.keys_of(p)[1], "not a zset")  # the names index: WRONGTYPE in place
    with pytest.raises(CorruptItemError):
        b.write(p, [make_put("c/_d", b"four")])
    return (
        [(r.name, r.seq, r.value) for r in first.records + second.records + third.records],
        [None if r is None else (r.name, r.value, r.tags) for r in got],
        [(r.name, r.seq) for r in listed],
        parts,
    )


def test_the_lean_sync_path_reads_without_parse_response(redis_backend: RedisBackend, parse_calls: list[str]) -> None:
    assert redis_backend._link.sync_transport().kind == "lean"
    outcome = _exercise(redis_backend, "direct")
    # only the test's own commands: every reply the backend read came from the hiredis reader
    assert set(parse_calls) == {"SCRIPT FLUSH", "SET"}
    assert outcome[0] == [("c/_a", 1, b"one"), ("c/_b", 2, b"two" * 500), ("c/_c", 3, b"three")]
    assert outcome[1] == [("c/_a", b"one", {"k": "v"}), ("c/_b", b"two" * 500, {}), None]
    assert outcome[2] == [("c/_a", 1), ("c/_b", 2)]


def test_without_a_hiredis_reader_every_reply_goes_through_parse_response(
    redis_backend: RedisBackend, parse_calls: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    direct = _exercise(redis_backend, "same")
    monkeypatch.setattr(_redis_transport, "_HiredisReader", type("NotTheReader", (), {}))
    per_reply = _exercise(redis_backend, "fallback")
    assert "EVALSHA" in parse_calls and "HMGET" in parse_calls
    assert per_reply[:3] == direct[:3]  # the same records, seqs and values either way


def test_the_lean_sync_path_applies_the_clients_response_callbacks(redis_backend: RedisBackend) -> None:
    """What ``client.parse_response`` would give: redis-py's callbacks applied (PEXPIRE and PERSIST
    return bools, not the server's integers), error replies in place."""
    transport = redis_backend._link.sync_transport()
    assert transport.kind == "lean"
    client = redis_backend._link.sync_client()
    key = f"h4replies-callbacks-{id(transport)}"
    try:
        replies = transport.execute([("SET", key, "v"), ("PEXPIRE", key, 60_000), ("PERSIST", key), ("HGET", key, "f")])
        expected = [client.set(key, "v"), client.pexpire(key, 60_000), client.persist(key)]
        assert replies[:3] == expected and [type(r) for r in replies[:3]] == [type(e) for e in expected]
        assert type(replies[1]) is bool and type(replies[2]) is bool  # the callbacks ran
        assert isinstance(replies[3], redis.ResponseError)  # WRONGTYPE, in place
    finally:
        client.delete(key)
