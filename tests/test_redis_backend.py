"""Redis-specific checks; the shared bodies run on Redis through the ``backend`` fixture.

Here: key isolation of glob-like user ids on the raw server, round-trip
counts that do not grow with history, the Redis Cluster (one slot per
partition), a SIGKILL + AOF restart under a write loop, ``ttl`` retention,
the driver error mapping, and a differential check against the reference
memory backend.
"""

from __future__ import annotations

import asyncio
import inspect
import random
import threading
import time
import uuid
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import redis.asyncio
import redis.exceptions as rex
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import checkpointers.backends._redis_transport as transport_module
from checkpointers._flows import GetOp, ListOp, Parallel, PartitionsOp, WriteOp, arun, make_put, run
from checkpointers._names import Partition, encode_component
from checkpointers.backends.base import Delete, ListQuery, Mode, Put, WriteResult
from checkpointers.backends.memory import MemoryBackend
from checkpointers.backends.redis import (
    _INLINE_MAX,
    DRIVER_ERRORS,
    RedisBackend,
    _Call,
    is_transient,
    translate_errors,
)
from checkpointers.errors import BackendUnavailableError, CorruptItemError
from tests.plugins.redis_plugin import RedisServer, free_port, have_binaries

GLOB_USERS = ["alice", "alice2", "a*", "a?ice", "[a]lice"]
#: The lean async transport reads replies with hiredis (``redis[hiredis]``, which
#: the extra installs); without it the async client runs on stock.
try:
    import hiredis  # noqa: F401

    HAVE_HIREDIS = True
except ImportError:  # pragma: no cover - depends on the environment
    HAVE_HIREDIS = False
needs_hiredis = pytest.mark.skipif(not HAVE_HIREDIS, reason="hiredis is not installed (the lean async path needs it)")


@pytest.fixture(params=["redis", "redis_stock"])
def each_redis(request: pytest.FixtureRequest) -> RedisBackend:
    """The backend on each transport in turn: lean (the default), then stock."""
    return request.getfixturevalue(f"{request.param}_backend")  # type: ignore[no-any-return]


def raw_client(backend: RedisBackend) -> redis.Redis:
    return backend._link.sync_client()  # the backend's own connection pool


def all_keys(backend: RedisBackend, pattern: str) -> set[str]:
    return {k.decode() for k in raw_client(backend).scan_iter(match=pattern, count=1000)}


def fill(backend: RedisBackend, p: Partition, n: int, batch: int = 200) -> None:
    for start in range(0, n, batch):
        puts = [
            make_put(f"c/_{i:06d}", f"value {i}".encode(), tags={"kind": "even" if i % 2 == 0 else "odd"})
            for i in range(start, min(n, start + batch))
        ]
        assert backend.write(p, puts).conflict is None


# -- 1. isolation on the raw server ---------------------------------------


def test_glob_like_users_never_share_keys(each_redis: RedisBackend) -> None:
    b = each_redis
    parts = {u: [Partition(u, "items", "s1"), Partition(u, "items", "s1/x")] for u in GLOB_USERS}
    for user, ps in parts.items():
        for p in ps:
            b.write(p, [make_put("i/_k", user.encode(), tags={"owner": user})])
    everything = all_keys(b, f"{b.prefix}:*")
    for user, ps in parts.items():
        enc = encode_component(user)
        user_key = ps[0].user_key
        own = set().union(*(set(b.keys_of(p)) & everything for p in ps)) | {
            f"{b.prefix}:{{{user_key}}}:parts"
        }
        # every key of this user names the user's encoded component right after "{"
        assert all(k.split("{", 1)[1].startswith(enc + "/") for k in own)
        # a maintenance SCAN with this user's pattern sees exactly this user's keys
        assert all_keys(b, f"{b.prefix}:{{{user_key}*") == own
        for p in ps:
            assert all_keys(b, b.match_pattern(p)) == set(b.keys_of(p)) & everything
            (rec,) = b.get(p, ["i/_k"])
            assert rec is not None and rec.value == user.encode()
        assert b.partitions(user, "items") == ["s1", "s1/x"]
    # nothing left over: the users' keys partition the whole key space
    union = set().union(*(all_keys(b, f"{b.prefix}:{{{ps[0].user_key}*") for ps in parts.values()))
    assert union == everything


# -- 2. round trips ---------------------------------------------------------


@pytest.mark.parametrize("history", [10, 2000])
def test_round_trips_do_not_grow_with_history(each_redis: RedisBackend, history: int) -> None:
    b = each_redis
    p = Partition("rt", "langgraph", f"thread-{history}")
    fill(b, p, history)
    b.list(p, ListQuery(limit=1))  # the first use of a script loads it (NOSCRIPT -> EVAL)
    newest = f"c/_{history - 1:06d}"

    def trips(call):  # noqa: ANN001, ANN202
        before = b.round_trips
        result = call()
        return b.round_trips - before, result

    n, result = trips(lambda: b.write(p, [make_put("c/_new", b"n"), make_put("w/_new/0", b"w")]))
    assert (n, result.conflict) == (1, None)
    n, got = trips(lambda: b.get(p, ["c/_new", newest, "c/_absent"]))
    assert n == 1 and got[0].value == b"n" and got[2] is None
    # latest, three ways: seq order in a prefix, seq order overall, name order
    n, latest = trips(lambda: b.list(p, ListQuery(prefix="c/", order="seq", descending=True, limit=1)))
    assert n == 1 and [r.name for r in latest] == ["c/_new"]
    n, latest = trips(lambda: b.list(p, ListQuery(order="seq", descending=True, limit=1)))
    assert n == 1 and [r.name for r in latest] == ["w/_new/0"]
    n, latest = trips(lambda: b.list(p, ListQuery(prefix="c/_0", descending=True, limit=1)))
    assert n == 1 and [r.name for r in latest] == [newest]
    n, tagged = trips(lambda: b.list(p, ListQuery(tags={"kind": "odd"}, order="seq", descending=True, limit=2)))
    odd = [i for i in range(history) if i % 2][-2:][::-1]
    assert n == 1 and [r.name for r in tagged] == [f"c/_{i:06d}" for i in odd]


def _checkpoint(i: int, counter: int) -> dict:  # type: ignore[type-arg]
    from langgraph.checkpoint.base import empty_checkpoint
    from langgraph.checkpoint.base.id import uuid6

    c = empty_checkpoint()
    c["id"] = str(uuid6(clock_seq=i))
    c["channel_versions"] = {"counter": counter, "log": i + 1}
    c["channel_values"] = {"counter": counter, "log": f"entry {i}"}
    return c


@pytest.mark.parametrize("history", [10, 2000])
def test_latest_get_tuple_and_list_one_round_trip_each(each_redis: RedisBackend, history: int) -> None:
    """get_tuple: one script lists the newest checkpoint with its writes (its children;
    small channel values are inline, so no blob read); list(limit=10): one (it was two
    before the namespace walk's probe joined its first step). The same whatever the history."""
    from checkpointers.savers import Checkpointer

    b = each_redis
    saver = Checkpointer(b, user="rt")
    config: dict = {"configurable": {"thread_id": f"t-{history}", "checkpoint_ns": ""}}  # type: ignore[type-arg]
    for i in range(history):
        new = {"log": i + 1} if i % 7 else {"log": i + 1, "counter": i // 7}
        config = saver.put(config, _checkpoint(i, i // 7), {"source": "loop", "step": i}, new)
        if i % 3 == 0 or i == history - 1:
            saver.put_writes(config, [("log", f"w{i}"), ("counter", i)], f"task-{i}")
    latest_id = config["configurable"]["checkpoint_id"]
    thread = {"configurable": {"thread_id": f"t-{history}"}}
    saver.get_tuple(thread)  # the first use of a script loads it (NOSCRIPT -> EVAL)

    before = b.round_trips
    got = saver.get_tuple(thread)
    assert b.round_trips - before == 1
    assert got is not None and got.config["configurable"]["checkpoint_id"] == latest_id
    assert got.checkpoint["channel_values"] == {"counter": (history - 1) // 7, "log": f"entry {history - 1}"}
    assert got.pending_writes == [(f"task-{history - 1}", "log", f"w{history - 1}"),
                                  (f"task-{history - 1}", "counter", history - 1)]  # fmt: skip

    before = b.round_trips
    got = asyncio.run(saver.aget_tuple(thread))
    assert b.round_trips - before == 1 and got is not None
    assert got.config["configurable"]["checkpoint_id"] == latest_id

    before = b.round_trips
    listed = list(saver.list(thread, limit=10))
    assert b.round_trips - before == 1  # the walk's probe below the root rides in its first step
    assert len(listed) == 10 and listed[0].config["configurable"]["checkpoint_id"] == latest_id
    with_writes = [t for t in listed if t.pending_writes]
    assert with_writes and all(len(t.pending_writes) == 2 for t in with_writes)


def test_many_sends_independent_operations_in_one_pipeline(each_redis: RedisBackend) -> None:
    b, mem = each_redis, MemoryBackend()
    p, q = Partition("many", "items", "a"), Partition("many", "items", "b")
    for backend in (b, mem):
        backend.write(p, [make_put("x/1", b"1", tags={"t": "v"}), make_put("x/2", b"2")])
        backend.write(q, [make_put("y", b"y")])

    def ops() -> tuple:  # type: ignore[type-arg]
        return (
            GetOp(p, ["x/1", "x/3"]),
            ListOp(p, ListQuery(prefix="x/", order="seq", descending=True)),
            WriteOp(q, (make_put("z", b"z"),)),
            WriteOp(q, (make_put("y", b"other", mode=Mode.CREATE),)),  # refused
            GetOp(q, []),
        )

    def flow():  # noqa: ANN202
        return (yield Parallel(ops()))

    before = b.round_trips
    got = run(flow(), b)
    assert b.round_trips - before == 1
    want = run(flow(), mem)
    shape = lambda res: (  # noqa: E731
        [None if r is None else (r.name, r.value) for r in res[0]],
        [(r.name, r.value, dict(r.tags)) for r in res[1]],
        [r.name for r in res[2].records],
        (res[3].conflict.index, res[3].conflict.existing.value),
        res[4],
    )
    assert shape(got) == shape(want)
    assert [r.name for r in b.list(q, ListQuery())] == ["y", "z"]

    # async, and a write that fills a new partition: the registry HSET that must
    # follow the script rides in the same pipeline
    e = Partition("many", "items", "fresh")
    before = b.round_trips
    got = asyncio.run(arun(_parallel_flow(e, p), b))
    assert b.round_trips - before == 1
    assert [r.name for r in got[0].records] == ["k"] and [r.name for r in got[1]] == ["x/1", "x/2"]
    assert b.partitions("many", "items") == ["a", "b", "fresh"]

    # one this backend saw filled, emptied meanwhile by another client: the
    # script reports it was empty, and the HSET is a second step
    other = RedisBackend.from_url(b._url, prefix=b.prefix)  # type: ignore[arg-type]
    try:
        assert other.drop(e) == 1
        assert b.partitions("many", "items") == ["a", "b"]
        before = b.round_trips
        assert b.write(e, [make_put("k2", b"v")]).conflict is None
        assert b.round_trips - before == 2
        assert other.partitions("many", "items") == ["a", "b", "fresh"]
    finally:
        other.close()


def _parallel_flow(e: Partition, p: Partition):  # noqa: ANN202
    return (yield Parallel((WriteOp(e, (make_put("k", b"v"),)), ListOp(p, ListQuery()))))


def test_lost_script_cache_costs_one_more_round_trip(each_redis: RedisBackend) -> None:
    b = each_redis
    p = Partition("rt", "items", "s")
    b.write(p, [make_put("a", b"1")])
    raw_client(b).script_flush()
    before = b.round_trips
    assert b.write(p, [make_put("b", b"2")]).conflict is None
    assert b.round_trips - before == 2  # EVALSHA -> NOSCRIPT, then EVAL
    before = b.round_trips
    b.write(p, [make_put("c", b"3")])
    assert b.round_trips - before == 1  # cached again
    before = b.round_trips
    assert [r.name for r in b.list(p, ListQuery(limit=2))] == ["a", "b"]
    assert b.round_trips - before == 1  # the other scripts were reloaded with the first


@needs_hiredis
def test_connections_are_kept_checked_and_handed_back(redis_url: str) -> None:
    """Round trips reuse the backend's idle connections (sync and async); one the
    server closed meanwhile is reconnected without a retry; close() gives them back.
    Clients passed in get every connection back after each call instead."""
    prefix = f"conn{uuid.uuid4().hex[:8]}"
    b = RedisBackend.from_url(redis_url, prefix=prefix)
    p = Partition("conn", "items", "s")
    try:
        b.write(p, [make_put("a", b"1")])
        lean = b._link.sync_transport()
        assert isinstance(lean, transport_module.LeanTransport)
        pool = b._link.sync_client().connection_pool
        (conn,) = lean.idle
        assert lean.pool is pool and conn in pool._in_use_connections
        for _ in range(3):
            assert b.get(p, ["a"])[0] is not None
        assert lean.idle == [conn]  # the same connection every time
        killer = redis.Redis.from_url(redis_url)
        killer.client_kill_filter(_id=conn_id(conn))  # as a server timeout would
        killer.close()
        assert b.get(p, ["a"])[0] is not None and b.retries == 0
        b.close()
        assert lean.idle == [] and not pool._in_use_connections

        async def async_calls() -> None:
            for _ in range(3):
                assert (await b.aget(p, ["a"]))[0] is not None
            alean = await b._link.async_transport()
            assert isinstance(alean, transport_module.LeanTransport)
            assert len(alean.idle) == 1 and alean.idle[0] in alean.pool._in_use_connections
            await b.aclose()

        asyncio.run(async_calls())
    finally:
        b.close()

    client = redis.Redis.from_url(redis_url)
    aclient = redis.asyncio.Redis.from_url(redis_url)
    theirs = RedisBackend(client, aclient=aclient, prefix=prefix)
    try:
        assert theirs.get(p, ["a"])[0] is not None
        assert theirs._link.sync_transport().idle == []  # type: ignore[attr-defined]
        assert not client.connection_pool._in_use_connections

        async def async_theirs() -> None:
            assert (await theirs.aget(p, ["a"]))[0] is not None
            assert not aclient.connection_pool._in_use_connections
            await aclient.aclose()

        asyncio.run(async_theirs())
    finally:
        theirs.close()
        client.close()


def conn_id(conn: object) -> int:
    """The server's id of a redis-py connection."""
    conn.send_command("CLIENT", "ID")  # type: ignore[attr-defined]
    return int(conn.read_response())  # type: ignore[attr-defined]


def test_one_buffer_packs_like_redis_py(redis_url: str) -> None:
    """The whole call goes out as one buffer, byte for byte what redis-py packs."""
    from checkpointers.backends._redis_transport import _pack

    client = redis.Redis.from_url(redis_url)
    conn = client.connection_pool.get_connection()
    try:
        big = b"v" * 20_000  # redis-py sends this one as a separate chunk
        for wire in ([("HSET", "k", "f", b"x")],
                     [("HSET", "k", "f", big), ("EVALSHA", "ab" * 20, 2, "k1", "k2", 7, "s", b"\x00\xff")],
                     [("HSET", "k", "f", bytearray(b"ba"))]):  # fmt: skip
            assert _pack(conn, wire) == [b"".join(conn.pack_commands(wire))]
    finally:
        client.connection_pool.release(conn)
        client.close()


async def _async_workout(b: RedisBackend, p: Partition) -> list[object]:
    """One of each kind of async round trip; the results as plain values."""
    out: list[object] = []
    written = await b.awrite(p, [make_put("a", b"1", tags={"k": "v"}), make_put("b/c", b"2" * 70_000)])
    out.append([(r.name, r.value, dict(r.tags), r.seq) for r in written.records])
    refused = await b.awrite(p, [make_put("a", b"other", mode=Mode.CREATE)])
    assert refused.conflict is not None and refused.conflict.existing is not None
    out.append((refused.conflict.index, refused.conflict.existing.value))
    out.append([None if r is None else (r.name, r.value) for r in await b.aget(p, ["a", "zz", "b/c"])])
    await b._aexecute(_Call([("SCRIPT", "FLUSH")]))  # the next script call gets NOSCRIPT
    out.append([(r.name, r.seq) for r in await b.alist(p, ListQuery(prefix="b/", order="seq"))])
    out.append(await b.apartitions(p.user, p.space))  # HGETALL: a reply with a callback
    out.append(await b.adrop(p))
    return out


@needs_hiredis
def test_async_replies_read_from_hiredis_like_redis_py(redis_backend: RedisBackend, monkeypatch) -> None:  # noqa: ANN001
    """The lean async transport reads replies itself (never through redis-py's
    parse_response) and gets what redis-py's own path gets; without hiredis
    the client gets the stock transport when it connects, with the same results."""

    def not_called(*args: object, **kwargs: object) -> None:
        raise AssertionError("parse_response was called")

    async def workout(expected: type) -> list[object]:
        out = await _async_workout(b, Partition("lean", "items", "s"))
        assert type(await b._link.async_transport()) is expected
        return out

    b = redis_backend
    with monkeypatch.context() as m:
        m.setattr(redis.asyncio.Redis, "parse_response", not_called)
        lean = asyncio.run(workout(transport_module.LeanTransport))
    with monkeypatch.context() as m:
        m.setattr(transport_module, "_NOT_ENOUGH_DATA", None)  # as without hiredis
        fallback = asyncio.run(workout(transport_module.StockTransport))
    assert lean == fallback
    assert lean[-2:] == [["s"], 2] and lean[1] == (0, b"1")


def test_lean_falls_back_to_stock_where_redis_py_internals_moved(redis_url: str, monkeypatch) -> None:  # noqa: ANN001
    """A sync client whose connections lack a method the lean transport calls
    gets the stock transport, chosen once when the client is made."""
    monkeypatch.setattr(transport_module, "_CONNECTION_METHODS", ("send_packed_command", "moved_away"))
    b = RedisBackend.from_url(redis_url, prefix=f"fb{uuid.uuid4().hex[:8]}")
    p = Partition("fb", "items", "s")
    try:
        assert b.write(p, [make_put("a", b"1")]).conflict is None
        assert isinstance(b._link.sync_transport(), transport_module.StockTransport)
        assert b.get(p, ["a"])[0].value == b"1"  # type: ignore[union-attr]
        assert b.drop(p) == 1
    finally:
        b.close()


def test_transport_option(redis_url: str, redis_cluster_backend: RedisBackend) -> None:
    """transport= and ?transport= pick the stock path; anything else is refused;
    a Cluster always runs on stock."""
    for b in (RedisBackend.from_url(redis_url + "?transport=stock"), RedisBackend(url=redis_url, transport="stock")):
        try:
            assert b.transport == "stock" and b._link.sync_transport().kind == "stock"
            assert asyncio.run(b._link.async_transport()).kind == "stock"
        finally:
            b.close()
    with pytest.raises(ValueError, match="transport"):
        RedisBackend.from_url(redis_url + "?transport=fast")
    with pytest.raises(ValueError, match="transport"):
        RedisBackend(url=redis_url, transport="fast")
    assert redis_cluster_backend._link.sync_transport().kind == "stock"


@needs_hiredis
def test_async_push_messages_go_to_the_parser_not_into_replies(each_redis: RedisBackend, monkeypatch) -> None:  # noqa: ANN001
    """A RESP3 push message arriving between two replies of one round trip (a
    client-tracking invalidation: Redis sends it right after the reply of the
    command that changed a tracked key) reaches the parser's push handler and
    never takes a reply's place."""
    from redis._parsers.hiredis import _AsyncHiredisParser

    handled: list[object] = []
    original = _AsyncHiredisParser.handle_push_response

    async def counting(self, response, **kwargs):  # noqa: ANN001, ANN003, ANN202
        handled.append(response)
        return await original(self, response, **kwargs)

    monkeypatch.setattr(_AsyncHiredisParser, "handle_push_response", counting)
    b = each_redis
    key = f"{b.prefix}:tracked"
    # RESP3 is redis-py's default (RESP2 would refuse tracking without REDIRECT)
    call = _Call([("CLIENT", "TRACKING", "ON"), ("GET", key), ("SET", key, "2"), ("GET", key),
                  ("CLIENT", "TRACKING", "OFF")])  # fmt: skip
    reply = asyncio.run(b._aexecute(call))
    assert reply.values[1:4] == [None, True, b"2"]  # SET's callback applied, the push skipped
    assert len(handled) == 1 and bytes(handled[0][0]) == b"invalidate"  # type: ignore[index]


def test_the_benchmarks_request_counter_sees_every_round_trip(each_redis: RedisBackend) -> None:
    """benchmarks/ counts our round trips with the backend's own counter (``round_trips``,
    on either transport), and every other redis-py client's requests with
    ``counting_redis_py`` (where redis-py writes them); sync and async."""
    from benchmarks.services import counting_redis_py

    b, p = each_redis, Partition("count", "items", "s")
    other, aother = redis.Redis.from_url(b._url), redis.asyncio.Redis.from_url(b._url)  # type: ignore[arg-type]

    async def async_calls(counter: object) -> tuple[int, dict[str, int]]:
        await b.aget(p, ["a"])  # this loop's connection is open before counting
        await aother.ping()
        before = b.round_trips
        await b.awrite(p, [make_put("c", b"3")])
        await b.aget(p, ["a", "c"])
        await b.alist(p, ListQuery())
        ours = b.round_trips - before
        counter.reset()  # type: ignore[attr-defined]
        await aother.get("x")
        await aother.aclose()
        return ours, dict(counter.snapshot())  # type: ignore[attr-defined]

    try:
        with counting_redis_py() as counter:
            b.write(p, [make_put("a", b"1")])  # the sync connections are open before counting
            other.ping()
            before = b.round_trips
            b.write(p, [make_put("b", b"2")])
            b.get(p, ["a", "b"])
            assert b.round_trips - before == 2
            counter.reset()
            other.get("x")
            other.pipeline(transaction=False).get("x").get("y").execute()
            assert dict(counter.snapshot()) == {"sync": 2} and counter.total() == 2
            assert asyncio.run(async_calls(counter)) == (3, {"async": 1})
    finally:
        other.close()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_server_that_stops_answering_times_out(redis_url: str, redis_transport: str, mode: str) -> None:
    """``socket_timeout`` bounds a round trip on a connection already open
    (the lean async one has one timeout for the whole round trip)."""
    b = RedisBackend.from_url(
        redis_url, prefix=f"to{uuid.uuid4().hex[:8]}", retry_attempts=0, socket_timeout=0.3, transport=redis_transport
    )
    p = Partition("slow", "items", "s")
    pauser = redis.Redis.from_url(redis_url)

    async def async_get() -> object:
        assert (await b.aget(p, ["a"]))[0] is not None  # the connection is open
        pauser.execute_command("CLIENT", "PAUSE", 2000, "ALL")
        return await b.aget(p, ["a"])

    try:
        b.write(p, [make_put("a", b"1")])  # the sync connection is open
        started = time.monotonic()
        with pytest.raises(BackendUnavailableError) as info:
            if mode == "sync":
                pauser.execute_command("CLIENT", "PAUSE", 2000, "ALL")
                b.get(p, ["a"])
            else:
                asyncio.run(async_get())
        assert isinstance(info.value.__cause__, rex.TimeoutError)
        assert time.monotonic() - started < 1.5  # it did not wait for the pause to end
    finally:
        pauser.execute_command("CLIENT", "UNPAUSE")
        pauser.close()
        b.close()


# -- list strategies against the reference ------------------------------------


def test_prefix_and_tag_queries_take_every_path(each_redis: RedisBackend) -> None:
    """Few names under a prefix (sorted in the script) and many (index walk)."""
    b, mem = each_redis, MemoryBackend()
    p = Partition("paths", "items", "s")
    puts = []
    for i in range(600):
        group = "x/ab" if i % 3 else "x/ac"
        name = f"{group}{i:04d}" if i < 590 else f"x/ad{i}"
        puts.append(make_put(name, b"v", tags={"m": str(i % 5), "a": str(i % 2)}))
    for chunk in range(0, len(puts), 100):
        assert b.write(p, puts[chunk : chunk + 100]).conflict is None
        mem.write(p, puts[chunk : chunk + 100])
    for prefix in ["x/ab", "x/ad", "x/", "", "x/a", "y"]:
        for limit in [None, 1, 7]:
            for desc, order in [(False, "seq"), (True, "seq"), (True, "name")]:
                for tags in [{}, {"m": "3"}, {"m": "3", "a": "1"}, {"a": "0", "m": "4"}, {"a": "0", "m": "zz"}]:
                    q = ListQuery(prefix=prefix, order=order, descending=desc, limit=limit, tags=tags)
                    assert [r.name for r in b.list(p, q)] == [r.name for r in mem.list(p, q)], q


def _tree(p: Partition, backends: list[RedisBackend | MemoryBackend], checkpoints: int, ns: str = "_") -> None:
    """LangGraph-shaped names: tagged checkpoints ``c/<ns>/<id>``, most with writes
    ``c/<ns>/<id>/<task>/<i>`` written after them (so they are newer in seq order)."""
    puts = []
    for i in range(checkpoints):
        cid = f"c/{ns}/{i:04d}"
        puts.append(make_put(cid, cid.encode(), tags={"k": "c", "m": str(i % 3)}))
        puts += [make_put(f"{cid}/t{j}/{j}", b"w" * j) for j in range(i % 4)]
    for chunk in range(0, len(puts), 200):
        for backend in backends:
            assert backend.write(p, puts[chunk : chunk + 200]).conflict is None


def test_depth_and_children_take_every_path(each_redis: RedisBackend) -> None:
    """Name order both ways, seq order through the sort and the index walk, tag indexes."""
    b, mem = each_redis, MemoryBackend()
    p = Partition("tree", "langgraph", "t")
    _tree(p, [b, mem], 150)
    _tree(p, [b, mem], 20, ns="_sub")
    orphans = [make_put("c/_/9999/t/0", b"o"), make_put("c/_/0010a", b"s", tags={"k": "c"}), make_put("c/_", b"r")]
    for backend in (b, mem):
        backend.write(p, orphans)
    shape = lambda recs: [(r.name, r.etag, r.value) for r in recs]  # noqa: E731
    for prefix in ["c/_/", "c/", "c/_/001", "c/_/0010", ""]:
        for depth, children in [(0, True), (0, False), (1, True), (2, False), (3, True)]:
            for order, desc in [("name", False), ("name", True), ("seq", False), ("seq", True)]:
                for limit in [None, 1, 4]:
                    for tags in [{}, {"k": "c"}, {"m": "1", "k": "c"}]:
                        q = ListQuery(prefix=prefix, depth=depth, children=children, order=order,
                                      descending=desc, limit=limit, tags=tags, values=limit != 4)  # fmt: skip
                        assert shape(b.list(p, q)) == shape(mem.list(p, q)), q
    for start, stop in [("c/_/0050", "c/_/0100"), ("c/_/0050/", "c/_/0051/t1/1")]:
        for desc in (False, True):
            q = ListQuery(prefix="c/_/", depth=0, children=True, descending=desc, limit=3, start=start, stop=stop)
            assert shape(b.list(p, q)) == shape(mem.list(p, q)), q


def _calls_in_server(client: redis.Redis) -> int:
    """Commands the server ran so far, scripts' own commands included (scripts excluded)."""
    stats = client.info("commandstats")
    skip = ("cmdstat_eval", "cmdstat_evalsha", "cmdstat_info")
    return sum(v["calls"] for k, v in stats.items() if k not in skip)


def test_latest_with_children_reads_a_bounded_part_of_the_history(each_redis: RedisBackend) -> None:
    """The newest checkpoint and its writes: one script that runs as many commands
    for 2000 checkpoints as for 12 (the walk skips subtrees, it does not scan)."""
    b = each_redis
    costs = {}
    for history in (12, 2000):  # the newest checkpoint has three writes in both
        p = Partition("tree", "langgraph", f"hot-{history}")
        _tree(p, [b], history)
        newest = f"c/_/{history - 1:04d}"
        for order in ("name", "seq"):
            q = ListQuery(prefix="c/_/", depth=0, descending=True, limit=1, children=True, order=order)
            b.list(p, q)  # the first use of a script loads it (NOSCRIPT -> EVAL)
            before, trips = _calls_in_server(raw_client(b)), b.round_trips
            got = b.list(p, q)
            costs[history, order] = _calls_in_server(raw_client(b)) - before
            assert b.round_trips - trips == 1
            assert [r.name for r in got] == [newest] + [f"{newest}/t{j}/{j}" for j in range(3)]
            assert got[-1].value == b"ww"
    assert costs[12, "name"] == costs[2000, "name"] <= 6, costs
    assert costs[12, "seq"] == costs[2000, "seq"], costs


# -- 3. cluster ------------------------------------------------------------


def test_cluster_batches_and_drop_stay_in_one_slot(redis_cluster_backend: RedisBackend) -> None:
    b = redis_cluster_backend
    client = raw_client(b)
    slots = set()
    for i in range(6):
        p = Partition(f"user{i}", "langgraph", f"thread/{i}")
        puts = [make_put(f"b/_{j}", bytes([j]) * 10, tags={"j": str(j)}) for j in range(5)]
        puts.append(make_put("c/_1", b"checkpoint", mode=Mode.CREATE))
        result = b.write(p, puts)
        assert result.conflict is None and len(result.records) == 6
        assert b.write(p, [make_put("c/_1", b"again", mode=Mode.CREATE)]).conflict is not None
        assert b.write(p, [make_put("c/_2", b"x")], [Delete("b/_0"), Delete("b/_1")]).conflict is None
        listed = b.list(p, ListQuery(prefix="b/", tags={"j": "3"}))
        assert [r.name for r in listed] == ["b/_3"]
        keyslots = {client.keyslot(k) for k in b.keys_of(p)}
        assert len(keyslots) == 1
        slots |= keyslots
        assert b.partitions(f"user{i}", "langgraph") == [f"thread/{i}"]
        assert b.drop(p) == 5
        assert b.get(p, ["b/_3", "c/_1"]) == [None, None]
        assert b.partitions(f"user{i}", "langgraph") == []
        assert not any(client.exists(k) for k in b.keys_of(p))
    assert len(slots) > 1  # the partitions really are spread over the cluster


async def test_cluster_async(redis_cluster_backend: RedisBackend) -> None:
    b = redis_cluster_backend
    p = Partition("async", "items", "s")
    try:
        result = await b.awrite(p, [make_put("a", b"1"), make_put("b", b"2", tags={"t": "v"})])
        assert result.conflict is None
        assert [r.name for r in await b.alist(p, ListQuery(order="seq", descending=True))] == ["b", "a"]
        assert await b.apartitions("async", "items") == ["s"]
        assert await b.adrop(p) == 2
    finally:
        await b.aclose()


# -- 4. SIGKILL and restart with the append-only file --------------------------


@pytest.fixture
def aof_server(tmp_path: Path) -> Iterator[RedisServer]:
    if not have_binaries():
        pytest.skip("the fault test starts its own redis-server: binary not found")
    server = RedisServer(
        tmp_path / "aof", free_port(), ["--appendonly", "yes", "--appendfsync", "always"]
    ).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("mode", "kills"),
    [("sync", 1), ("async", 1), pytest.param("sync", 5, marks=pytest.mark.deep)],
)
def test_sigkill_and_restart_loses_no_acknowledged_write(
    aof_server: RedisServer, redis_transport: str, mode: str, kills: int
) -> None:
    """Writes go on while the server is SIGKILLed and restarted from its AOF.

    Each write either succeeds (perhaps after retries) or raises
    BackendUnavailableError; every write that succeeded is there afterwards.
    """
    backend = RedisBackend.from_url(
        aof_server.url, prefix="fault", retry_attempts=8, retry_backoff=0.05, retry_backoff_max=0.5,
        transport=redis_transport,
    )  # fmt: skip
    p = Partition("fault", "items", "s")
    acknowledged: dict[str, str] = {}
    failures: list[BackendUnavailableError] = []
    stop = threading.Event()

    def next_put(i: int) -> Put:
        return make_put(f"i/_{i:06d}", f"v{i}".encode(), mode=Mode.CREATE if i % 2 else Mode.APPEND)

    def record(put: Put, result: WriteResult) -> None:
        assert result.conflict is None, result.conflict
        acknowledged[put.name] = result.records[0].digest

    def sync_writer() -> None:
        i = 0
        while not stop.is_set():
            put = next_put(i)
            try:
                record(put, backend.write(p, [put]))
            except BackendUnavailableError as exc:
                failures.append(exc)
            i += 1

    async def async_writer() -> None:
        i = 0
        while not stop.is_set():
            put = next_put(i)
            try:
                record(put, await backend.awrite(p, [put]))
            except BackendUnavailableError as exc:
                failures.append(exc)
            i += 1

    def wait_for(count: int) -> None:
        deadline = time.monotonic() + 10
        while len(acknowledged) < count and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(acknowledged) >= count, "writes did not resume after the restart"

    target = sync_writer if mode == "sync" else (lambda: asyncio.run(async_writer()))
    thread = threading.Thread(target=target)
    thread.start()
    try:
        for _ in range(kills):
            wait_for(len(acknowledged) + 50)
            aof_server.kill()
            time.sleep(0.3)
            aof_server.start()
        wait_for(len(acknowledged) + 50)
    finally:
        stop.set()
        thread.join(timeout=30)
    assert backend.retries >= kills or failures  # the kills were noticed
    for exc in failures:
        assert isinstance(exc.__cause__, DRIVER_ERRORS)
    names = sorted(acknowledged)
    stored = backend.get(p, names)
    assert [r.digest if r else None for r in stored] == [acknowledged[n] for n in names]
    backend.close()


# -- 5. ttl ---------------------------------------------------------------------


def test_ttl_expires_a_partition_together_and_writes_refresh_it(redis_url: str, redis_transport: str) -> None:
    b = RedisBackend.from_url(redis_url, prefix=f"ttl{uuid.uuid4().hex[:8]}", ttl=1, transport=redis_transport)
    client = raw_client(b)
    p = Partition("ttl", "items", "s")
    other = Partition("ttl", "items", "kept")
    try:
        b.write(p, [make_put("a", b"1", tags={"t": "x"}), make_put("q/b", b"2")])
        b.write(other, [make_put("a", b"1")])
        time.sleep(0.6)
        b.write(p, [make_put("c", b"3")])  # refreshes every key of p, not other's
        ttls = [client.pttl(k) for k in b.keys_of(p)]
        assert all(600 < t <= 1000 for t in ttls), ttls
        deadlines = {client.execute_command("PEXPIRETIME", k) for k in b.keys_of(p)}
        assert len(deadlines) == 1  # one deadline for all of them, set in one script
        time.sleep(0.6)  # past the first deadline, before the refreshed one
        assert b.get(p, ["a"])[0] is not None
        assert b.get(other, ["a"]) == [None]
        assert b.partitions("ttl", "items") == ["s"]
        time.sleep(0.6)
        assert b.get(p, ["a", "q/b", "c"]) == [None, None, None]
        assert b.list(p, ListQuery()) == []
        assert not any(client.exists(k) for k in b.keys_of(p))
        assert b.partitions("ttl", "items") == []
    finally:
        b.close()


# -- 6. error translation and retries ----------------------------------------------


def driver_exception_classes() -> list[type[BaseException]]:
    return [
        cls
        for _, cls in inspect.getmembers(rex, inspect.isclass)
        if issubclass(cls, Exception) and cls.__module__ == rex.__name__
    ]


@pytest.mark.parametrize("cls", driver_exception_classes(), ids=lambda c: c.__name__)
def test_every_redis_exception_is_translated(cls: type[BaseException]) -> None:
    try:
        original = cls("boom")
    except ValueError:  # MOVED/ASK parse "<slot> <host:port>"
        original = cls("3999 127.0.0.1:6381")
    with pytest.raises(BackendUnavailableError) as info:
        with translate_errors("test"):
            raise original
    assert info.value.__cause__ is original
    assert cls.__name__ in str(info.value)


def test_transient_errors_are_the_retryable_ones() -> None:
    assert is_transient(rex.ConnectionError("x")) and is_transient(rex.BusyLoadingError("x"))
    assert is_transient(rex.TimeoutError("x")) and is_transient(rex.TryAgainError("x"))
    assert is_transient(rex.ClusterDownError("x")) and is_transient(rex.ReadOnlyError("x"))
    assert not is_transient(rex.AuthenticationError("x"))
    assert not is_transient(rex.ResponseError("x")) and not is_transient(rex.DataError("x"))


def test_unreachable_server_is_retried_then_unavailable(redis_transport: str) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    b = RedisBackend.from_url(url, retry_attempts=3, retry_backoff=0.01, transport=redis_transport)
    with pytest.raises(BackendUnavailableError) as info:
        b.get(Partition("u", "items", "s"), ["a"])
    assert isinstance(info.value.__cause__, rex.ConnectionError)
    assert (b.round_trips, b.retries) == (4, 3)
    with pytest.raises(BackendUnavailableError) as info:
        asyncio.run(b.aget(Partition("u", "items", "s"), ["a"]))
    assert isinstance(info.value.__cause__, rex.ConnectionError)
    assert (b.round_trips, b.retries) == (8, 6)
    b.close()


def run_as_retried(b: RedisBackend, op):  # noqa: ANN001, ANN201
    """Drive an operation as if its first round trip had been a retry."""
    reply = b._execute(next(op))
    call = op.send(type(reply)(reply.values, retried=True))
    try:
        while True:
            call = op.send(b._execute(call))
    except StopIteration as done:
        return done.value


def test_retried_create_that_had_applied_reports_success(each_redis: RedisBackend) -> None:
    """A CREATE whose first attempt applied but whose reply was lost is not a conflict."""
    b = each_redis
    p = Partition("u", "items", "s")
    put = make_put("i/_x", b"v", mode=Mode.CREATE)
    b.write(p, [put])  # the first attempt, whose reply was "lost"
    result = run_as_retried(b, b._write_op(p, [put], []))
    assert result.conflict is None and result.records[0].etag == put.etag
    # without a retry the same call is a genuine conflict, and so is another
    # writer's CREATE after a retry (its etag is not the stored one)
    assert b.write(p, [put]).conflict is not None
    other = make_put("i/_x", b"v", mode=Mode.CREATE)
    assert run_as_retried(b, b._write_op(p, [other], [])).conflict is not None
    stale = make_put("i/_x", b"w", mode=Mode.IF_MATCH, if_match="old")
    assert run_as_retried(b, b._write_op(p, [stale], [])).conflict is not None


# -- staged puts: values ahead of the script ----------------------------------


def _blob(data: bytes) -> Put:
    """A content-addressed staged put, as the saver makes them."""
    from checkpointers._flows import digest

    return make_put(f"b/{digest(data)}", data, mode=Mode.APPEND, staged=True)


def _hash_fields(b: RedisBackend, p: Partition) -> set[bytes]:
    return set(raw_client(b).hkeys(b.keys_of(p)[0]))


def test_staged_values_skip_the_script_and_read_like_any_record(each_redis: RedisBackend) -> None:
    b = each_redis
    p = Partition("st", "langgraph", "t-" + uuid.uuid4().hex[:8])
    sent: list = []  # type: ignore[type-arg]
    execute = b._execute
    b._execute = lambda call: (sent.append(call), execute(call))[1]  # type: ignore[method-assign]
    big = bytes(range(256)) * 100
    blob, small = _blob(big), _blob(b"tiny")
    ckpt = make_put("c/_/1", b"checkpoint", tags={"kind": "c"}, mode=Mode.APPEND)
    result = b.write(p, [blob, small, ckpt])
    assert result.conflict is None
    # the values went with HSETNX in the script's round trip (the second one
    # re-registers a new partition), the script got none of them
    call = sent[0]
    script_args = [c for c in call.commands if not isinstance(c, tuple)][0].args
    assert big not in script_args and b"tiny" not in script_args and b"checkpoint" in script_args
    assert [c[0] for c in call.commands if isinstance(c, tuple) and c[0] == "HSETNX"] == ["HSETNX"] * 2
    seqs = [r.seq for r in result.records]
    assert seqs == sorted(seqs) and len(set(seqs)) == 3
    # read, listed (name and seq order, values or not), counted, like any record
    for got, put in zip(b.get(p, [blob.name, small.name, ckpt.name]), (blob, small, ckpt), strict=True):
        assert got is not None and (got.value, got.digest, got.etag) == (put.value, put.digest, put.etag)
    assert [(r.name, r.value) for r in b.list(p, ListQuery(prefix="b/"))] == sorted(
        [(blob.name, big), (small.name, b"tiny")]
    )
    by_seq = b.list(p, ListQuery(order="seq", descending=True))
    assert [r.name for r in by_seq] == [ckpt.name, small.name, blob.name]
    assert [r.seq for r in by_seq] == sorted(seqs, reverse=True)
    # a second batch naming the same blob is an append no-op: old seq and etag kept
    again = _blob(big)
    result2 = b.write(p, [again, make_put("c/_/2", b"next", mode=Mode.APPEND)])
    assert result2.conflict is None
    assert (result2.records[0].etag, result2.records[0].seq) == (blob.etag, seqs[0])
    assert result2.records[1].seq > max(seqs)
    assert b.partitions("st", "langgraph") and p.name in b.partitions("st", "langgraph")
    # deleted like any record, and dropped with the partition
    assert b.write(p, [], [Delete(small.name)]).conflict is None
    assert b.get(p, [small.name]) == [None] and f"v:{small.name}".encode() not in _hash_fields(b, p)
    assert b.drop(p) == 3
    assert b.get(p, [blob.name]) == [None] and all_keys(b, b.match_pattern(p)) == set()


@pytest.mark.parametrize("empty", [False, True])
def test_refused_batch_leaves_no_trace_of_its_staged_values(redis_url: str, redis_transport: str, empty: bool) -> None:
    """A conflict on the checkpoint record leaves the partition exactly as it was
    (the values sent ahead are removed again), also with ttl on an empty partition."""
    b = RedisBackend.from_url(redis_url, prefix="st" + uuid.uuid4().hex[:8], ttl=60, transport=redis_transport)
    try:
        p = Partition("st", "langgraph", "t")
        kept = _blob(b"kept")
        if not empty:
            b.write(p, [kept, make_put("c/_/1", b"first", mode=Mode.APPEND)])
        state = lambda: (  # noqa: E731
            _hash_fields(b, p),
            [(r.name, r.value, r.etag, r.seq) for r in b.list(p, ListQuery(order="seq"))],
            all_keys(b, b.match_pattern(p)),
        )
        before = state()
        new = _blob(b"new value " * 1000)
        if empty:
            clash = make_put("c/_/1", b"x", mode=Mode.IF_MATCH, if_match="nope")
        else:
            clash = make_put("c/_/1", b"different", mode=Mode.APPEND)
        result = b.write(p, [new, _blob(b"kept"), clash])
        assert result.conflict is not None and result.conflict.index == 2
        assert state() == before
        assert b.get(p, [new.name]) == [None]
        if empty:
            assert before[2] == set() and b.partitions("st", "langgraph") == []
        else:
            assert b.get(p, [kept.name])[0].value == b"kept"  # type: ignore[union-attr]
    finally:
        b.close()


def _resumed(op, first):  # noqa: ANN001, ANN202
    """The rest of ``op``, from its pending call ``first`` on."""
    call = first
    while True:
        try:
            call = op.send((yield call))
        except StopIteration as done:
            return done.value


def test_staged_value_deleted_before_the_script_is_resent_inline(each_redis: RedisBackend) -> None:
    """A concurrent delete between the HSETNX and the script (simulated: the
    HSETNX is dropped from the round trip) costs one more round trip, never a
    record without its value."""
    b = each_redis
    p = Partition("st", "langgraph", "race-" + uuid.uuid4().hex[:8])
    blob = _blob(b"raced")
    op = b._write_op(p, [blob, make_put("c/_/1", b"c", mode=Mode.APPEND)], [])
    call = next(op)
    without = type(call)([c for c in call.commands if not (isinstance(c, tuple) and c[0] == "HSETNX")])
    retry = op.send(b._execute(without))
    script_args = [c for c in retry.commands if not isinstance(c, tuple)][0].args
    assert b"raced" in script_args  # now inline
    result = b._run(_resumed(op, retry))
    assert result.conflict is None
    (rec,) = b.get(p, [blob.name])
    assert rec is not None and rec.value == b"raced" and rec.digest == blob.digest


def test_from_url_reads_valkey_scheme_and_query_options(redis_url: str) -> None:
    url = redis_url.replace("redis://", "valkey://") + "?prefix=vk" + uuid.uuid4().hex[:6] + "&ttl=30"
    b = RedisBackend.from_url(url)
    try:
        assert b.prefix.startswith("vk") and b.ttl == 30.0 and not b.cluster
        p = Partition("v", "items", "s")
        assert b.write(p, [make_put("a", b"1")]).conflict is None
        assert 0 < raw_client(b).pttl(b.keys_of(p)[0]) <= 30_000
        b.drop(p)
    finally:
        b.close()
    with pytest.raises(ValueError, match="prefix"):
        RedisBackend.from_url(redis_url, prefix="a*")
    with pytest.raises(ValueError, match="decode_responses"):
        RedisBackend(redis.Redis(decode_responses=True))


# -- damaged stored data: CorruptItemError on every read path --------------------
#
# A record is the hash fields "m:<name>" (seq \n etag \n digest \n <tag pairs>
# \n <tags JSON>) and "v:<name>" (the value) of the key r, plus members of the
# zsets n (names), x (seq order) and t (tags). Each kind of damage below is
# written straight into those with redis-py; every read path (get, list in
# every shape, many, and their async forms) must raise CorruptItemError naming
# the record, never a raw parse error and never BackendUnavailableError (which
# reports an outage), and return what it returned before wherever it does not
# read the damaged part.


@pytest.fixture(params=["redis", "redis_stock", "redis_cluster"])
def any_redis(request: pytest.FixtureRequest) -> RedisBackend:
    """The backend on a standalone server (each transport), then on the 3-master cluster."""
    return request.getfixturevalue(f"{request.param}_backend")  # type: ignore[no-any-return]


PICK, CHILD = "c/a", "c/a/w"  # a tagged record with a child, and the child
LARGE_A, LARGE_W = b"A" * 3000, b"W" * 1500
#: What each reader asks, as ("get", names) or ("list", query); every reader
#: runs sync, through many(), async and through amany().
READERS: dict[str, tuple[str, object]] = {
    "get": ("get", [PICK, CHILD, "c/b"]),
    "list by name": ("list", ListQuery(prefix="c/")),
    "list without values": ("list", ListQuery(prefix="c/", values=False)),
    "list with children": ("list", ListQuery(prefix="c/", depth=0, children=True)),
    "list children without values": ("list", ListQuery(prefix="c/", depth=0, children=True, values=False)),
    "list by tag": ("list", ListQuery(tags={"k": "v"})),
    "list by tag in seq order": ("list", ListQuery(tags={"k": "v"}, order="seq", descending=True)),
    "list by tag with children": ("list", ListQuery(prefix="c/", tags={"k": "v"}, depth=0, children=True)),
    "list in seq order": ("list", ListQuery(prefix="c/", order="seq")),
    # the whole partition has no seq index: read and sorted
    "list in seq order, all": ("list", ListQuery(order="seq")),
    # a prefix that is no indexed ancestor, with few names under it: read and sorted
    "list in seq order, sorted": ("list", ListQuery(prefix="c/a", order="seq", descending=True)),
}


def _damage_partition(b: RedisBackend, layout: str = "inline") -> Partition:
    """``layout="fields"``: every record rewritten as records were stored before
    values went inline (the value in its own "v:<name>" field)."""
    p = Partition("dmg", "items", "s-" + uuid.uuid4().hex[:8])
    # PICK and CHILD are large enough to be stored compressed, "c/b" raw
    puts = [make_put(PICK, LARGE_A, tags={"k": "v"}), make_put(CHILD, LARGE_W), make_put("c/b", b"B", tags={"k": "v"})]
    puts += [make_put(f"c/f{i}", b"F") for i in range(5)]  # so that "c/a" in seq order takes the sorting path
    assert b.write(p, puts).conflict is None
    if layout == "fields":
        _to_fields(raw_client(b), b.keys_of(p)[0])
    return p


def _split_inline(meta: bytes) -> tuple[bytes, bytes, bytes]:
    """A stored metadata field as (the five metadata lines, its last line's flag, the inline value)."""
    head = meta.split(b"\n", 5)
    if len(head) < 6:
        return meta, b"", b""
    return b"\n".join(head[:5]), head[5][:1], head[5][1:]


def _to_fields(c: redis.Redis, r: str) -> None:
    """Every inline record of hash ``r`` rewritten in the earlier layout: its
    value in "v:<name>", its metadata ending with "\\nz" when compressed."""
    for field, meta in c.hgetall(r).items():
        head, flag, value = _split_inline(meta)
        if field.startswith(b"m:") and flag in (b"=", b"~"):
            c.hset(r, mapping={field: head + (b"\nz" if flag == b"~" else b""), b"v:" + field[2:]: value})


def _sync_read(b: RedisBackend, p: Partition, reader: tuple[str, object], many: bool) -> object:
    kind, arg = reader
    op = GetOp(p, arg) if kind == "get" else ListOp(p, arg)  # type: ignore[arg-type]
    if many:
        return b.many([op])[0]
    return b.get(p, arg) if kind == "get" else b.list(p, arg)  # type: ignore[arg-type]


async def _async_read(b: RedisBackend, p: Partition, reader: tuple[str, object], many: bool) -> object:
    kind, arg = reader
    op = GetOp(p, arg) if kind == "get" else ListOp(p, arg)  # type: ignore[arg-type]
    if many:
        return (await b.amany([op]))[0]
    return await (b.aget(p, arg) if kind == "get" else b.alist(p, arg))  # type: ignore[arg-type]


def _shape(result: object) -> object:
    return [None if r is None else (r.name, r.value, dict(r.tags), r.etag, r.digest, r.seq) for r in result]  # type: ignore[attr-defined]


def _outcome(call) -> object:  # noqa: ANN001
    """What a read gave: its records, or ("corrupt", key); any other error fails the test."""
    try:
        return _shape(call())
    except CorruptItemError as exc:
        return ("corrupt", exc.key)


def _every_read(b: RedisBackend, p: Partition) -> dict[tuple[str, str], object]:
    """Every reader on every path: {(reader, path): outcome}."""
    out: dict[tuple[str, str], object] = {}
    for label, reader in READERS.items():
        out[label, "sync"] = _outcome(lambda reader=reader: _sync_read(b, p, reader, False))
        out[label, "many"] = _outcome(lambda reader=reader: _sync_read(b, p, reader, True))

    async def run_async() -> None:
        for label, reader in READERS.items():
            for path, many in (("async", False), ("amany", True)):
                try:
                    out[label, path] = _shape(await _async_read(b, p, reader, many))
                except CorruptItemError as exc:
                    out[label, path] = ("corrupt", exc.key)

    asyncio.run(run_async())
    return out


def _meta(fix):  # noqa: ANN001, ANN202
    """A damage that rewrites the metadata's fields [seq, etag, digest, pairs, tags] with ``fix``."""

    def damage(c: redis.Redis, keys: list[str], name: str) -> None:
        head, flag, value = _split_inline(c.hget(keys[0], f"m:{name}"))
        tail = b"\n" + flag + value if flag else b""  # the last line ("z", or an inline value): kept
        c.hset(keys[0], f"m:{name}", fix(head.split(b"\n", 4)) + tail)

    return damage


def _swap_fields(c: redis.Redis, keys: list[str], name: str) -> None:
    meta, value = c.hmget(keys[0], [f"m:{name}", f"v:{name}"])
    if value is None:  # inline: the value bytes become the metadata, the metadata a value field
        value = _split_inline(meta)[2]
    c.hset(keys[0], mapping={f"m:{name}": value, f"v:{name}": meta})


def _set_value(stored: bytes):  # noqa: ANN202
    """A damage storing ``stored`` as the record's compressed value (inline, or in its field)."""

    def damage(c: redis.Redis, keys: list[str], name: str) -> None:
        head, flag, _ = _split_inline(c.hget(keys[0], f"m:{name}"))
        if flag == b"~":
            c.hset(keys[0], f"m:{name}", head + b"\n~" + stored)
        else:
            assert flag == b"z"
            c.hset(keys[0], f"v:{name}", stored)

    return damage


def _drop_value(c: redis.Redis, keys: list[str], name: str) -> None:
    head, flag, _ = _split_inline(c.hget(keys[0], f"m:{name}"))
    if flag in (b"=", b"~"):  # inline: metadata alone, saying the value is in its field
        c.hset(keys[0], f"m:{name}", head)
    c.hdel(keys[0], f"v:{name}")


def _cut_value(c: redis.Redis, keys: list[str], name: str) -> None:
    head, flag, value = _split_inline(c.hget(keys[0], f"m:{name}"))
    if flag == b"~":
        c.hset(keys[0], f"m:{name}", head + b"\n~" + value[:-4])
    else:
        c.hset(keys[0], f"v:{name}", c.hget(keys[0], f"v:{name}")[:-4])


#: name -> (damage, whether only reads of the value notice it)
RECORD_DAMAGE = {
    "seq not an integer": (_meta(lambda f: b"\n".join([b"x1", *f[1:]])), False),
    "seq empty": (_meta(lambda f: b"\n".join([b"", *f[1:]])), False),
    "seq with a sign": (_meta(lambda f: b"\n".join([b"+" + f[0], *f[1:]])), False),
    "seq with spaces": (_meta(lambda f: b"\n".join([b" " + f[0], *f[1:]])), False),
    "seq not UTF-8": (_meta(lambda f: b"\n".join([b"\xff" + f[0], *f[1:]])), False),
    "two fields missing": (_meta(lambda f: b"\n".join(f[:3])), False),
    "no newline at all": (_meta(lambda f: b"garbage"), False),
    "empty metadata": (_meta(lambda f: b""), False),
    "etag not UTF-8": (_meta(lambda f: b"\n".join([f[0], b"\xff\xfe", *f[2:]])), False),
    "digest not ASCII": (_meta(lambda f: b"\n".join([*f[:2], "sha\u00e9".encode(), *f[3:]])), False),
    "tags JSON cut short": (_meta(lambda f: b"\n".join([*f[:4], f[4][:-1] if f[4] != b"{}" else b"{"])), False),
    "tags JSON not UTF-8": (_meta(lambda f: b"\n".join([*f[:4], b'{"k":"\xff"}'])), False),
    "tags JSON a list": (_meta(lambda f: b"\n".join([*f[:4], b'["k","v"]'])), False),
    "tags JSON a number": (_meta(lambda f: b"\n".join([*f[:4], b"7"])), False),
    "tag value not a string": (_meta(lambda f: b"\n".join([*f[:4], b'{"k":1}'])), False),
    "tag value an object": (_meta(lambda f: b"\n".join([*f[:4], b'{"k":{"v":"v"}}'])), False),
    "tags JSON nested 100,000 deep": (_meta(lambda f: b"\n".join([*f[:4], b'{"k":' + b"[" * 100_000])), False),
    "tags JSON with trailing bytes": (_meta(lambda f: b"\n".join([*f[:4], f[4] + b"\nx"])), False),
    "metadata and value swapped": (_swap_fields, False),
    "last line neither z nor an inline value": (_meta(lambda f: b"\n".join([*f, b"q"])), False),
    "value missing": (_drop_value, True),
    "compressed value cut short": (_cut_value, True),
    "compressed value not zlib": (_set_value(b"not zlib at all"), True),
    # ~10 KB that would inflate to 50 MB: refused past 256x its stored size, never inflated whole
    "compressed value a zip bomb": (_set_value(zlib.compress(b"\0" * 50_000_000, 9)), True),
}


@pytest.mark.parametrize("layout", ["inline", "fields"])
@pytest.mark.parametrize("target", [PICK, CHILD])
@pytest.mark.parametrize("damage", list(RECORD_DAMAGE))
def test_damaged_record_is_corrupt_on_every_read_path(
    any_redis: RedisBackend, damage: str, target: str, layout: str
) -> None:
    """On either layout: values inline in the metadata field, or (records
    written before) in a field of their own."""
    b = any_redis
    p = _damage_partition(b, layout)
    healthy = _every_read(b, p)
    fn, value_only = RECORD_DAMAGE[damage]
    fn(raw_client(b), b.keys_of(p), target)
    damaged = _every_read(b, p)
    for (label, path), before in healthy.items():
        reader = READERS[label]
        reads_values = reader[0] == "get" or reader[1].values  # type: ignore[attr-defined]
        if any(r is not None and r[0] == target for r in before) and (reads_values or not value_only):  # type: ignore[attr-defined]
            assert damaged[label, path] == ("corrupt", target), (label, path)
        else:
            assert damaged[label, path] == before, (label, path)


def test_large_values_are_stored_compressed_and_read_back(each_redis: RedisBackend) -> None:
    """A large compressible value is stored zlib-compressed (its metadata's last
    line says so, "~" when inline); small, incompressible and staged values are
    stored raw; every read path gives the values back as written."""
    b = each_redis
    p = Partition("zip", "items", "z-" + uuid.uuid4().hex[:8])
    noise = random.Random(7).randbytes(4000)
    values = {"c/big": b"abc" * 2000, "c/noise": noise, "c/small": b"s" * 100, "b/blob": b"blob" * 1000,
              "c/zeros": b"\0" * 300_000}
    puts = [make_put(n, v, tags={"k": "v"}) for n, v in values.items() if n != "b/blob"]
    puts.append(make_put("b/blob", values["b/blob"], mode=Mode.APPEND, staged=True))
    assert b.write(p, puts).conflict is None
    c, r = raw_client(b), b.keys_of(p)[0]
    stored = {n: _split_inline(c.hget(r, f"m:{n}"))[1:] for n in values}
    assert stored["c/big"][0] == b"~" and len(stored["c/big"][1]) < 200
    assert zlib.decompress(stored["c/big"][1]) == values["c/big"]
    # the most compressible value there is: level 1 packs it ~228x, under the 256x a reader allows
    assert stored["c/zeros"][0] == b"~" and 200 < len(values["c/zeros"]) / len(stored["c/zeros"][1]) < 256
    for n in ("c/noise", "c/small"):  # not worth it, too small: raw, inline
        assert stored[n] == (b"=", values[n]), n
    assert stored["b/blob"] == (b"", b"") and c.hget(r, "v:b/blob") == values["b/blob"]  # staged: raw, own field
    assert c.hlen(r) == len(values) + 1
    assert {rec.name: rec.value for rec in b.get(p, list(values))} == values  # type: ignore[union-attr]
    listed = b.list(p, ListQuery())
    assert {rec.name: rec.value for rec in listed} == values
    assert all(rec.value == b"" and rec.tags for rec in b.list(p, ListQuery(prefix="c/", values=False)))
    assert [rec.value for rec in b.list(p, ListQuery(tags={"k": "v"}, order="seq"))] == [
        values["c/big"], noise, values["c/small"], values["c/zeros"]]
    assert {rec.name: rec.value for rec in b.many([GetOp(p, list(values))])[0]} == values  # type: ignore[union-attr]
    assert {rec.name: rec.value for rec in asyncio.run(b.alist(p, ListQuery()))} == values
    # an append of the same content returns the stored record, decompressed
    again = b.write(p, [make_put("c/big", values["c/big"], mode=Mode.APPEND)])
    big = next(rec for rec in listed if rec.name == "c/big")
    assert again.records[0].value == values["c/big"] and again.records[0].etag == big.etag
    # a refused batch reports the stored record, decompressed
    refused = b.write(p, [make_put("c/big", b"other", mode=Mode.CREATE)])
    assert refused.conflict is not None and refused.conflict.existing.value == values["c/big"]  # type: ignore[union-attr]


def test_records_of_the_previous_format_are_read(each_redis: RedisBackend) -> None:
    """Before compression every value was stored raw, its metadata without the
    flag: such records read as they did, and a write over one stores the new way."""
    b = each_redis
    p = Partition("zip", "items", "old-" + uuid.uuid4().hex[:8])
    value = b"old format " * 300
    assert b.write(p, [make_put("c/old", value, tags={"k": "v"})]).conflict is None
    c, r = raw_client(b), b.keys_of(p)[0]
    head, flag, _ = _split_inline(c.hget(r, "m:c/old"))
    assert flag == b"~"
    c.hset(r, mapping={"m:c/old": head, "v:c/old": value})  # as the previous code stored it
    (rec,) = b.get(p, ["c/old"])
    assert rec is not None and rec.value == value and rec.tags == {"k": "v"}
    assert [x.value for x in b.list(p, ListQuery(tags={"k": "v"}))] == [value]
    assert b.write(p, [make_put("c/old", value + b"!", if_match=rec.etag, mode=Mode.IF_MATCH)]).conflict is None
    assert _split_inline(c.hget(r, "m:c/old"))[1] == b"~" and not c.hexists(r, "v:c/old")
    assert b.get(p, ["c/old"])[0].value == value + b"!"  # type: ignore[union-attr]


def test_whole_partition_seq_index_of_the_previous_format_goes_at_the_next_write(each_redis: RedisBackend) -> None:
    """The previous layout also indexed every record under the ancestor "" (members
    "|<seq16>|<name>"): reads ignore such members, the next write removes them all."""
    b = each_redis
    p = Partition("old", "items", "x-" + uuid.uuid4().hex[:8])
    fill(b, p, 12)
    c, x = raw_client(b), b.keys_of(p)[2]
    before = c.zcard(x)
    c.zadd(x, {f"|{rec.seq:016d}|{rec.name}": 0 for rec in b.list(p, ListQuery())})  # as the previous code did
    c.zadd(x, {"|0000000000000099|c/_000001": 0})  # a stray one (damage): never read any more
    assert [r.name for r in b.list(p, ListQuery(order="seq", descending=True, limit=3))] == [
        "c/_000011", "c/_000010", "c/_000009"]
    assert [r.seq for r in b.list(p, ListQuery(prefix="c/", order="seq", limit=2))] == [1, 2]
    b._filled.clear()  # as a backend that never wrote there: its first write clears them too
    assert b.write(p, [make_put("c/_000012", b"v")]).conflict is None
    assert c.zcard(x) == before + 1  # the new record under its one ancestor, "c/"
    assert c.zrangebylex(x, "[|", "(}") == []


def test_second_level_seq_index_of_the_previous_layout_goes_at_the_first_write(each_redis: RedisBackend) -> None:
    """Records written when two ancestor levels were indexed also have a member
    under their second one ("c/_ns/|<seq16>|<name>"): a seq-order read under that
    prefix never reads them (it walks "c/", or sorts), and the first write a
    backend sends to the partition removes them all; a record written now has
    one member, under "c/"."""
    b = each_redis
    p = Partition("old", "items", "a2-" + uuid.uuid4().hex[:8])
    names = [f"c/_ns{i % 2}/_{i:04d}" for i in range(12)]
    assert b.write(p, [make_put(n, f"v{i}".encode()) for i, n in enumerate(names)]).conflict is None
    c, x = raw_client(b), b.keys_of(p)[2]
    stored = b.list(p, ListQuery())
    assert sorted(c.zrange(x, 0, -1)) == sorted(f"c/|{r.seq:016d}|{r.name}".encode() for r in stored)
    c.zadd(x, {f"{r.name[:7]}|{r.seq:016d}|{r.name}": 0 for r in stored})  # as the previous code did
    c.zadd(x, {"c/_ns0/|0000000000000099|c/_ns1/_0001": 0})  # a stray one (damage): never read any more
    ns0 = [n for n in names if n.startswith("c/_ns0/")]
    assert [r.name for r in b.list(p, ListQuery(prefix="c/_ns0/", order="seq", descending=True, limit=2))] == ns0[
        :-3:-1]
    assert [r.name for r in b.list(p, ListQuery(prefix="c/_ns0/", order="seq"))] == ns0
    assert [r.name for r in b.list(p, ListQuery(prefix="c/", order="seq", descending=True, limit=1))] == names[-1:]
    assert b.write(p, [make_put("c/_ns0/_0012", b"v")]).conflict is None  # this backend has seen p: no sweep
    assert c.zlexcount(x, "[c/", "(c/|") == 13
    b._filled.clear()  # as a backend that never wrote there (another process, a restart)
    assert b.write(p, [make_put("c/_ns1/_0013", b"v")], [Delete(names[0])]).conflict is None
    assert c.zrangebylex(x, "[c/", "(c/|") == []
    assert c.zcard(x) == len(names) + 1  # 12 - 1 deleted + 2 written, each under "c/" alone
    assert [r.name for r in b.list(p, ListQuery(prefix="c/_ns0/", order="seq"))] == [*ns0[1:], "c/_ns0/_0012"]


def test_an_unchanged_if_match_re_put_is_checked_not_rewritten(each_redis: RedisBackend) -> None:
    """A re-put under its own etag with the stored digest and tags (a lease guard)
    keeps the stored record: same seq, no new seq assigned, nothing rewritten;
    any difference (tags, digest, a new etag) is a write as before."""
    b = each_redis
    assert b.inline_conditions
    p = Partition("reput", "items", "r-" + uuid.uuid4().hex[:8])
    first = b.write(p, [make_put("c/lease", b"held by nobody", tags={"k": "v"})]).records[0]
    c, (r, _n, _x, _t, seqkey) = raw_client(b), b.keys_of(p)
    stored = c.hgetall(r)

    def reput(**changes: object) -> Put:
        fields = {"name": "c/lease", "value": first.value, "tags": first.tags, "etag": first.etag,
                  "digest": first.digest, "mode": Mode.IF_MATCH, "if_match": first.etag, **changes}
        return Put(**fields)  # type: ignore[arg-type]

    guard, other = reput(), make_put("c/other", b"x")
    result = b.write(p, [guard, other])
    assert result.conflict is None and result.records[0].seq == first.seq and result.records[1].seq == first.seq + 1
    assert c.hmget(r, ["m:c/lease", "v:c/lease"]) == [stored[b"m:c/lease"], None]  # the value inline, unchanged
    assert int(c.get(seqkey)) == first.seq + 1  # one new seq: the other record's
    # a stale etag is still refused
    assert b.write(p, [reput(if_match="stale", etag="stale")]).conflict is not None
    # new tags under the same etag and digest: a write (a new seq)
    moved = b.write(p, [reput(tags={"k": "w"})]).records[0]
    assert moved.seq == first.seq + 2 and b.get(p, ["c/lease"])[0].tags == {"k": "w"}  # type: ignore[union-attr]


def test_the_list_script_reports_damage_not_an_outage(each_redis: RedisBackend) -> None:
    """Before: 'attempt to perform arithmetic on a nil value' from the script,
    reported as BackendUnavailableError."""
    b = each_redis
    p = _damage_partition(b)
    raw_client(b).hset(b.keys_of(p)[0], f"m:{PICK}", b"no fields")
    for query in (ListQuery(tags={"k": "v"}), ListQuery(prefix="c/a", order="seq")):
        with pytest.raises(CorruptItemError) as info:
            b.list(p, query)
        assert info.value.key == PICK and "fields" in info.value.reason


#: name -> (key index in keys_of(), how to damage it, readers that touch the key)
KEY_DAMAGE = {
    "records hash is a string": (0, lambda c, k: c.set(k, "junk"), set(READERS)),
    "records hash is a zset": (0, lambda c, k: c.zadd(k, {"m:c/a": 0}), set(READERS)),
    "names zset is a hash": (1, lambda c, k: c.hset(k, "c/a", "x"), {"list by name", "list with children"}),
    "seq index is a string": (2, lambda c, k: c.set(k, "junk"), {"list in seq order"}),
    "tag index is a list": (3, lambda c, k: c.rpush(k, "junk"), {"list by tag", "list by tag in seq order"}),
}


@pytest.mark.parametrize("damage", list(KEY_DAMAGE))
def test_key_of_the_wrong_type_is_corrupt_not_an_outage(any_redis: RedisBackend, damage: str) -> None:
    b = any_redis
    p = _damage_partition(b)
    healthy = _every_read(b, p)
    at, fn, touching = KEY_DAMAGE[damage]
    key = b.keys_of(p)[at]
    c = raw_client(b)
    c.delete(key)
    fn(c, key)
    damaged = _every_read(b, p)
    for (label, path), before in healthy.items():
        got = damaged[label, path]
        if label in touching:
            # names the record a get asked for first, else the key
            assert got == ("corrupt", PICK if label == "get" else key), (label, path)
        else:
            assert got in (before, ("corrupt", key)), (label, path)
    # a write meets it too: corruption, not an outage (except where it never
    # touches the key), and drop clears the partition whatever its keys hold
    try:
        b.write(p, [make_put(PICK, b"new", tags={"k": "v"})])
    except CorruptItemError as exc:
        assert exc.key == key
    assert b.drop(p) >= 0
    assert not any(c.exists(k) for k in b.keys_of(p))
    assert b.get(p, [PICK]) == [None] and b.list(p, ListQuery()) == []


def test_damaged_sequence_counter_is_corrupt_on_write(any_redis: RedisBackend) -> None:
    b = any_redis
    p = _damage_partition(b)
    seqkey = b.keys_of(p)[4]
    raw_client(b).set(seqkey, "not a number")
    with pytest.raises(CorruptItemError) as info:
        b.write(p, [make_put("c/new", b"n")])
    assert info.value.key == seqkey
    assert b.get(p, ["c/new"]) == [None] and len(b.list(p, ListQuery())) == 8


def test_index_entries_that_disagree_with_the_record_are_corrupt(any_redis: RedisBackend) -> None:
    """A seq or tag index entry that the record's metadata contradicts: never a
    record listed out of place or under a tag it does not carry."""
    b = any_redis
    p = _damage_partition(b)
    c, (r, _n, x, t, _seq) = raw_client(b), b.keys_of(p)
    healthy = _every_read(b, p)
    by_seq = ("list in seq order", "list by tag in seq order")
    # the record's seq moved (a valid integer): the seq indexes disagree
    meta = c.hget(r, f"m:{PICK}")
    c.hset(r, f"m:{PICK}", b"999" + meta[meta.index(b"\n") :])
    got = _every_read(b, p)
    for (label, path), before in healthy.items():
        if label in by_seq:
            assert got[label, path] == ("corrupt", PICK), (label, path)
        elif label not in ("list in seq order, sorted", "list in seq order, all"):  # sort by the seq they find
            assert [row[:5] for row in got[label, path]] == [row[:5] for row in before], (label, path)  # type: ignore[index, union-attr]
    c.hset(r, f"m:{PICK}", meta)
    assert _every_read(b, p) == healthy
    # a stray seq index entry naming a real record
    c.zadd(x, {"c/|0000000000000500|c/b": 0})
    with pytest.raises(CorruptItemError) as info:
        b.list(p, ListQuery(prefix="c/", order="seq", descending=True, limit=1))
    assert info.value.key == "c/b"
    c.zrem(x, "c/|0000000000000500|c/b")
    # a record whose tags JSON says another value than its index entries
    c.hset(r, f"m:{PICK}", meta.replace(b'{"k":"v"}', b'{"k":"w"}'))
    got = _every_read(b, p)
    for label in ("list by tag", "list by tag in seq order", "list by tag with children"):
        for path in ("sync", "many", "async", "amany"):
            assert got[label, path] == ("corrupt", PICK), (label, path)
    c.hset(r, f"m:{PICK}", meta)
    # a stray tag index entry naming an untagged record
    c.zadd(t, {"n_k=_v|c/f0": 0})
    with pytest.raises(CorruptItemError) as info:
        b.list(p, ListQuery(tags={"k": "v"}))
    assert info.value.key == "c/f0"


def test_writes_over_a_damaged_record(any_redis: RedisBackend) -> None:
    """A condition on a damaged record cannot be checked: CorruptItemError, and
    nothing of the batch is applied (staged values sent ahead are removed). An
    upsert or unconditional delete replaces it, leaving no stale index entry."""
    b = any_redis
    broken = b"7\nno more fields"
    for kind in ("append", "if_match", "create", "checked delete"):
        p = _damage_partition(b)
        c, r = raw_client(b), b.keys_of(p)[0]
        c.hset(r, f"m:{PICK}", broken)
        before = (sorted(c.hkeys(r)), c.zrange(b.keys_of(p)[2], 0, -1), c.get(b.keys_of(p)[4]))
        blob = _blob(b"sent ahead " + kind.encode())
        if kind == "checked delete":
            puts, deletes = [make_put("c/new", b"n"), blob], [Delete(PICK, if_match="e")]
        else:
            mode = {"append": Mode.APPEND, "if_match": Mode.IF_MATCH, "create": Mode.CREATE}[kind]
            damaged = make_put(PICK, b"A2", mode=mode, if_match="e" if mode is Mode.IF_MATCH else None)
            puts, deletes = [make_put("c/new", b"n"), blob, damaged], []
        with pytest.raises(CorruptItemError) as info:
            b.write(p, puts, deletes)
        assert info.value.key == PICK, kind
        assert (sorted(c.hkeys(r)), c.zrange(b.keys_of(p)[2], 0, -1), c.get(b.keys_of(p)[4])) == before, kind
    for kind in ("upsert", "delete"):
        p = _damage_partition(b)
        c, r = raw_client(b), b.keys_of(p)[0]
        for damage in (broken, b"x\n\n\n\n{}", b"3\ne\nd\n_k=_v garbage|{}\n{}"):
            c.hset(r, f"m:{PICK}", damage)
            if kind == "upsert":
                result = b.write(p, [make_put(PICK, b"fixed", tags={"j": "1"})])
                assert result.conflict is None and result.records[0].value == b"fixed"
            else:
                assert b.write(p, [], [Delete(PICK)]).conflict is None
                assert b.get(p, [PICK]) == [None]
            reads = _every_read(b, p)
            assert not any(isinstance(v, tuple) for v in reads.values()), (kind, reads)
            names = [row[0] for row in reads["list in seq order", "sync"]]  # type: ignore[index, union-attr]
            assert len(names) == len(set(names)) and (PICK in names) == (kind == "upsert")
            assert PICK not in [row[0] for row in reads["list by tag", "sync"]]  # type: ignore[index, union-attr]
            if kind == "delete":
                b.write(p, [make_put(PICK, b"A", tags={"k": "v"})])


def test_append_no_op_over_damaged_tags_raises(any_redis: RedisBackend) -> None:
    """An append of the same content over a record whose tags JSON is damaged
    (the script does not parse it) is a no-op that must return the stored
    record: parsing it raises CorruptItemError, never returns damaged data."""
    b = any_redis
    p = _damage_partition(b)
    c, r = raw_client(b), b.keys_of(p)[0]
    (stored,) = b.get(p, [PICK])
    meta = c.hget(r, f"m:{PICK}")
    c.hset(r, f"m:{PICK}", meta.replace(b'{"k":"v"}', b'{"k":'))
    same = Put(PICK, b"A", stored.digest, "another-etag", {"k": "v"}, Mode.APPEND)
    with pytest.raises(CorruptItemError) as info:
        b.write(p, [same])
    assert info.value.key == PICK and "JSON" in info.value.reason
    assert c.hget(r, f"m:{PICK}") == meta.replace(b'{"k":"v"}', b'{"k":')  # a no-op: unchanged


@pytest.mark.parametrize("damage", ["parse", "wrong type"])
def test_many_finishes_the_other_operations_before_raising(any_redis: RedisBackend, damage: str) -> None:
    """One operation of many() meeting damage does not abandon the others in the
    middle of their protocol: a write that empties its partition still removes
    it from the user's registry, then the damage is raised."""
    b = any_redis
    p = _damage_partition(b)
    c = raw_client(b)
    if damage == "parse":
        c.hset(b.keys_of(p)[0], f"m:{PICK}", b"x")
    else:
        c.delete(b.keys_of(p)[0])
        c.set(b.keys_of(p)[0], "junk")
    q = Partition("dmg", "items", "other-" + uuid.uuid4().hex[:8])
    b.write(q, [make_put("only", b"1")])
    registry = f"{b.prefix}:{{{q.user_key}}}:parts"
    assert c.hexists(registry, q.key)
    with pytest.raises(CorruptItemError) as info:
        b.many([GetOp(p, [PICK]), WriteOp(q, (), (Delete("only"),))])
    assert info.value.key == PICK
    assert b.get(q, ["only"]) == [None] and not c.hexists(registry, q.key)

    async def again() -> None:
        await b.awrite(q, [make_put("only", b"1")])
        with pytest.raises(CorruptItemError):
            await b.amany([ListOp(p, ListQuery(prefix="c/")), WriteOp(q, (), (Delete("only"),))])

    asyncio.run(again())
    assert b.get(q, ["only"]) == [None] and not c.hexists(registry, q.key)


def test_damaged_partition_registry(any_redis: RedisBackend) -> None:
    """partitions(): a registry entry of a live partition that does not give back
    its name is corrupt; a foreign entry, or one naming no live partition, is
    skipped; a registry of the wrong type is corrupt."""
    b = any_redis
    user = "reg-" + uuid.uuid4().hex[:6]
    p, q = Partition(user, "items", "one"), Partition(user, "items", "two")
    b.write(p, [make_put("a", b"1")])
    b.write(q, [make_put("a", b"1")])
    c = raw_client(b)
    registry = f"{b.prefix}:{{{p.user_key}}}:parts"

    def partitions_everywhere() -> list[object]:
        out: list[object] = []
        for call in (lambda: b.partitions(user, "items"), lambda: b.many([PartitionsOp(user, "items")])[0]):
            try:
                out.append(call())
            except CorruptItemError as exc:
                out.append(("corrupt", exc.key))

        async def run_async() -> None:
            try:
                out.append(await b.apartitions(user, "items"))
            except CorruptItemError as exc:
                out.append(("corrupt", exc.key))
            try:
                out.append((await b.amany([PartitionsOp(user, "items")]))[0])
            except CorruptItemError as exc:
                out.append(("corrupt", exc.key))

        asyncio.run(run_async())
        return out

    assert partitions_everywhere() == [["one", "two"]] * 4
    # foreign entries (not this user's keys) and entries naming nothing live: skipped
    c.hset(registry, mapping={b"\xffjunk": b"x", "_someone/_items/_one": "one", p.user_key + "_gone": b"\xff"})
    assert partitions_everywhere() == [["one", "two"]] * 4
    for damaged in (b"\xff\xfe", b"three"):  # undecodable, or another partition's name
        c.hset(registry, q.key, damaged)
        assert partitions_everywhere() == [("corrupt", "two")] * 4
    c.hset(registry, q.key, "two")
    assert partitions_everywhere() == [["one", "two"]] * 4
    c.delete(registry)
    c.set(registry, "junk")
    assert partitions_everywhere() == [("corrupt", registry)] * 4
    c.delete(registry)


# -- append compares content digests (a seal may follow a '.') ----------------------


@pytest.mark.parametrize("staged", [False, True])
def test_append_compares_the_content_part_of_digests(any_redis: RedisBackend, staged: bool) -> None:
    from checkpointers._flows import new_etag

    b = any_redis
    p = Partition("seal", "items", "s-" + uuid.uuid4().hex[:8])
    name = "b/abc" if staged else "c/x"

    def append(digest: str, value: bytes = b"v") -> WriteResult:
        return b.write(p, [Put(name, value, digest, new_etag(), {}, Mode.APPEND, staged=staged)])

    first = append("abc.x")
    assert first.conflict is None
    (stored,) = first.records
    # same content, another seal: a no-op returning the stored record
    again = append("abc.y")
    assert again.conflict is None and again.records == [stored]
    assert b.get(p, [name]) == [stored] and stored.digest == "abc.x"
    bare = append("abc")  # a record written before seals existed
    assert bare.conflict is None and bare.records == [stored]
    # other content: a conflict that names the stored record
    other = append("abd.x", b"w")
    assert other.conflict is not None and other.conflict.existing == stored
    assert append("abd").conflict is not None
    assert b.get(p, [name]) == [stored]


def test_a_retried_batch_recognises_its_append_by_content_digest(each_redis: RedisBackend) -> None:
    """A retried batch refused only because its first attempt applied: an append in it
    whose stored record carries another seal of the same content still counts as its own."""
    from checkpointers._flows import new_etag

    b = each_redis
    p = Partition("seal", "items", "retry-" + uuid.uuid4().hex[:8])
    b.write(p, [Put("b/abc", b"v", "abc.x", new_etag(), {}, Mode.APPEND)])
    batch = [make_put("c/1", b"c", mode=Mode.CREATE), Put("b/abc", b"v", "abc.y", new_etag(), {}, Mode.APPEND)]
    assert b.write(p, batch).conflict is None  # the first attempt, whose reply was "lost"
    result = run_as_retried(b, b._write_op(p, batch, []))
    assert result.conflict is None and [r.digest for r in result.records] == [batch[0].digest, "abc.x"]


# -- differential check against the reference backend ------------------------------

NAMES = ["a", "a/b", "a/b/c", "a/bc", "b", "c/_1", "c/_1/t/0", "c/_1/u", "c/_2", "c/_10", "c/_10/t/1", "i/_x%2Fy", "z"]
TAG_KEYS, TAG_VALUES = st.sampled_from(["k", "k=", "k v", "{k}", ""]), st.sampled_from(["", "1", "a b", "}"])
TAGS = st.dictionaries(TAG_KEYS, TAG_VALUES, max_size=2)
BATCH = st.tuples(
    st.lists(
        st.tuples(
            st.sampled_from(NAMES), st.sampled_from(list(Mode)), st.sampled_from([b"1", b"2"]), TAGS, st.booleans()
        ),
        max_size=4,
        unique_by=lambda t: t[0],
    ),
    st.lists(st.tuples(st.sampled_from(NAMES), st.booleans()), max_size=2, unique_by=lambda t: t[0]),
)
QUERY = st.builds(
    dict,
    prefix=st.sampled_from(["", "a", "a/", "a/b", "c/", "c/_1", "i/", "q"]),
    order=st.sampled_from(["name", "seq"]),
    descending=st.booleans(),
    limit=st.sampled_from([None, 0, 1, 2, 5]),
    tags=TAGS,
    values=st.booleans(),
    tree=st.sampled_from([(None, False), (0, False), (0, True), (1, False), (1, True), (2, True)]),
    bound=st.sampled_from([None, "start", "stop"]),
    at=st.integers(0, 9),
)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(batches=st.lists(BATCH, min_size=1, max_size=8), queries=st.lists(QUERY, min_size=1, max_size=12))
def test_same_results_as_the_memory_backend(each_redis: RedisBackend, batches, queries) -> None:  # noqa: ANN001
    b, mem = each_redis, MemoryBackend()
    p = Partition("diff", "items", uuid.uuid4().hex)
    for puts_spec, dels_spec in batches:
        names_in_puts = {n for n, *_ in puts_spec}
        current = {r.name: r for r in mem.list(p, ListQuery())}
        puts: list[Put] = []
        for name, mode, value, tags, good_etag in puts_spec:
            etag = current[name].etag if good_etag and name in current else "stale"
            puts.append(make_put(name, value, tags=tags, mode=mode, if_match=etag if mode is Mode.IF_MATCH else None))
        deletes = [
            Delete(n, (current[n].etag if n in current else "stale") if checked else None)
            for n, checked in dels_spec
            if n not in names_in_puts
        ]
        got, want = b.write(p, puts, deletes), mem.write(p, puts, deletes)
        assert (got.conflict is None) == (want.conflict is None)
        if want.conflict:
            assert (got.conflict.index, got.conflict.name) == (want.conflict.index, want.conflict.name)
            assert (got.conflict.existing and got.conflict.existing.etag) == (
                want.conflict.existing and want.conflict.existing.etag
            )
        else:
            assert [(r.name, r.etag, r.value, dict(r.tags)) for r in got.records] == [
                (r.name, r.etag, r.value, dict(r.tags)) for r in want.records
            ]
    everything = {"redis": b.list(p, ListQuery(order="seq")), "memory": mem.list(p, ListQuery(order="seq"))}
    assert [r.name for r in everything["redis"]] == [r.name for r in everything["memory"]]
    assert b.partitions("diff", "items") == ([p.name] if everything["memory"] else [])
    for spec in queries:
        bound, at = spec.pop("bound"), spec.pop("at")
        spec["depth"], spec["children"] = spec.pop("tree")
        results = {}
        for label, backend in (("redis", b), ("memory", mem)):
            q = ListQuery(**spec)
            if bound and everything[label]:
                pivot = everything[label][at % len(everything[label])]
                value = pivot.name if q.order == "name" else pivot.seq
                q = ListQuery(**spec, **{bound: value})
            results[label] = [(r.name, r.etag, r.value, dict(r.tags)) for r in backend.list(p, q)]
        assert results["redis"] == results["memory"], spec
    assert b.drop(p) == len(everything["memory"])


def test_records_stored_before_values_went_inline_read_the_same(any_redis: RedisBackend) -> None:
    """A value stored in at most _INLINE_MAX bytes is appended to its metadata
    field; records written before keep it in "v:<name>" and read the same on
    every path. Writing over or deleting such a record leaves no "v:" field."""
    b = any_redis
    p = _damage_partition(b)
    c, r = raw_client(b), b.keys_of(p)[0]
    assert c.hlen(r) == 8 and _split_inline(c.hget(r, f"m:{PICK}"))[1] == b"~"
    assert _split_inline(c.hget(r, "m:c/b"))[1:] == (b"=", b"B")
    inline = _every_read(b, p)
    _to_fields(c, r)
    assert c.hlen(r) == 16 and c.hget(r, "v:c/b") == b"B"
    assert _every_read(b, p) == inline
    assert b.write(p, [make_put(PICK, LARGE_A + b"!", tags={"k": "v"})], [Delete(CHILD)]).conflict is None
    assert not c.hexists(r, f"v:{PICK}") and not c.hexists(r, f"m:{CHILD}") and not c.hexists(r, f"v:{CHILD}")
    assert c.hlen(r) == 6 * 2 + 1  # c/b and the five c/f* still in two fields each, PICK in one
    assert b.get(p, [PICK, "c/b"])[0].value == LARGE_A + b"!"  # type: ignore[union-attr]
    assert [x.value for x in b.list(p, ListQuery(prefix="c/f"))] == [b"F"] * 5


def test_a_value_past_the_inline_size_keeps_its_own_field(each_redis: RedisBackend) -> None:
    """A value stored in more than _INLINE_MAX bytes (compressed or not) and a
    staged blob keep a "v:<name>" field: reading metadata never copies them."""
    b = each_redis
    p = Partition("u", "items", "in-" + uuid.uuid4().hex[:8])
    big = random.Random(1).randbytes(_INLINE_MAX + 1)  # incompressible
    edge = random.Random(2).randbytes(_INLINE_MAX)
    blob = _blob(b"S" * 50)
    puts = [make_put("c/big", big), make_put("c/edge", edge), blob]
    assert b.write(p, puts).conflict is None
    c, r = raw_client(b), b.keys_of(p)[0]
    assert c.hget(r, "v:c/big") == big and _split_inline(c.hget(r, "m:c/big"))[1] == b""
    assert not c.hexists(r, "v:c/edge") and _split_inline(c.hget(r, "m:c/edge"))[1:] == (b"=", edge)
    assert c.hget(r, f"v:{blob.name}") == b"S" * 50 and _split_inline(c.hget(r, f"m:{blob.name}"))[1] == b""
    assert [x.value for x in b.list(p, ListQuery())] == [b"S" * 50, big, edge]
    assert [x.value for x in b.list(p, ListQuery(values=False))] == [b""] * 3
