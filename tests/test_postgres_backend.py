"""PostgreSQL-specific checks; the shared bodies run on PostgreSQL through the ``backend`` fixture.

Here: migrations applied once by several processes starting at once, eight
processes writing one partition at once (no lost update, no duplicated seq,
every batch whole), the server crashed and restarted under a write loop
(nothing reported saved is lost, errors are ``BackendUnavailableError``), no
server-side prepared statements (PgBouncer transaction mode), index-served
latest/list/tag queries whose work does not grow with history (EXPLAIN), a
retried write recognising its own lost success, and the drop-in: real
compiled LangGraph graphs on ``PostgresCheckpointer.from_conn_string``,
sync and async, side by side with LangGraph's ``PostgresSaver``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from checkpointers import BackendUnavailableError
from checkpointers._flows import make_put
from checkpointers._names import Partition
from checkpointers.backends.base import Delete, ListQuery, Mode, Put
from checkpointers.backends.ops import GetOp, ListOp
from checkpointers.backends.postgres import SCHEMA_VERSION, PostgresBackend, _list_op, _write_op
from checkpointers.postgres_saver import PostgresCheckpointer
from tests.graph_apps import loop_graph
from tests.plugins.postgres_plugin import PostgresCluster, with_query

ROOT = Path(__file__).resolve().parent.parent


def _spawn(code: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _outputs(procs: list[subprocess.Popen[str]]) -> list[Any]:
    out = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 0, stderr
        out.append(json.loads(stdout))
    return out


def schema_at(postgres_url: str, schema: str, version: int) -> None:
    """Create ``schema`` as the first ``version`` migrations leave it (an older release's database)."""
    from checkpointers.backends.postgres import MIGRATIONS

    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        conn.execute(f"CREATE TABLE {schema}.schema_migrations (v int PRIMARY KEY, at timestamptz DEFAULT now())")
        for statement in [s for m in MIGRATIONS[:version] for s in m]:
            conn.execute(statement.replace("@schema", schema))
        versions = [(v,) for v in range(1, version + 1)]
        conn.cursor().executemany(f"INSERT INTO {schema}.schema_migrations (v) VALUES (%s)", versions)


# -- migrations ------------------------------------------------------------------------

_MIGRATE = """
    import json, sys, time
    from checkpointers.backends.postgres import PostgresBackend
    url, start = sys.argv[1], float(sys.argv[2])
    backend = PostgresBackend.from_url(url)
    time.sleep(max(0.0, start - time.time()))
    print(json.dumps(backend.migrate()))
    backend.close()
"""


def test_several_processes_migrate_a_fresh_schema_once(postgres_url: str) -> None:
    schema = f"cpm_{uuid.uuid4().hex[:10]}"
    url = with_query(postgres_url, schema=schema)
    start = time.time() + 2.0  # all imported and connected by then: they race on the migration itself
    try:
        found = _outputs([_spawn(_MIGRATE, url, str(start)) for _ in range(6)])
        # exactly one process applied the migrations (it found version 0); the others found them done
        assert sorted(found) == [0] + [SCHEMA_VERSION] * 5
        with psycopg.connect(postgres_url) as conn:
            versions = [v for (v,) in conn.execute(f"SELECT v FROM {schema}.schema_migrations ORDER BY v")]
        assert versions == list(range(1, SCHEMA_VERSION + 1))
        with PostgresBackend.from_url(url) as backend:
            assert backend.migrate() == SCHEMA_VERSION  # idempotent
            p = Partition("u", "items", "x")
            assert backend.write(p, [make_put("a", b"1")]).conflict is None
    finally:
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def test_a_schema_newer_than_this_release_is_refused(postgres_url: str) -> None:
    schema = f"cpm_{uuid.uuid4().hex[:10]}"
    url = with_query(postgres_url, schema=schema)
    try:
        with PostgresBackend.from_url(url) as backend:
            backend.migrate()
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(f"INSERT INTO {schema}.schema_migrations (v) VALUES (%s)", (SCHEMA_VERSION + 1,))
        with PostgresBackend.from_url(url) as backend, pytest.raises(Exception, match="newer than this release"):
            backend.get(Partition("u", "items", "x"), ["a"])
    finally:
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


# -- eight processes, one partition --------------------------------------------------------

_WRITER = """
    import json, sys, time
    from checkpointers._flows import make_put
    from checkpointers._names import Partition
    from checkpointers.backends.base import Mode
    from checkpointers.backends.postgres import PostgresBackend
    url, part, me, batches, start = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5])
    p = Partition("u", "items", part)
    backend = PostgresBackend.from_url(url)
    backend.migrate()
    time.sleep(max(0.0, start - time.time()))
    done, conflicts = [], 0
    for i in range(batches):
        while True:  # one batch: two new records and the shared counter, compare-and-set
            counter = backend.get(p, ["ctr"])[0]
            count = int(counter.value) if counter else 0
            bump = (make_put("ctr", str(count + 1).encode(), mode=Mode.IF_MATCH, if_match=counter.etag)
                    if counter else make_put("ctr", b"1", mode=Mode.CREATE))
            puts = [make_put(f"w/{me}/{i}/a", b"a", mode=Mode.CREATE),
                    make_put(f"w/{me}/{i}/b", b"b", mode=Mode.CREATE), bump]
            result = backend.write(p, puts)
            if result.conflict is None:
                done.append([r.seq for r in result.records])
                break
            assert result.conflict.name == "ctr", result.conflict
            conflicts += 1
    print(json.dumps({"seqs": done, "conflicts": conflicts}))
    backend.close()
"""


def test_eight_processes_write_one_partition_at_once(
    postgres_schema_url: str, postgres_backend: PostgresBackend
) -> None:
    part, batches = f"shared-{uuid.uuid4().hex[:8]}", 20
    start = str(time.time() + 2.5)
    results = _outputs([_spawn(_WRITER, postgres_schema_url, part, str(me), str(batches), start) for me in range(8)])
    p = Partition("u", "items", part)
    stored = {r.name: r for r in postgres_backend.list(p, ListQuery())}
    # no lost update: the counter saw every one of the 160 compare-and-sets
    assert int(stored["ctr"].value) == 8 * batches
    assert sum(r["conflicts"] for r in results) > 0  # they did contend
    seen: set[int] = set()
    for me, result in enumerate(results):
        own = [seq for batch in result["seqs"] for seq in batch]
        assert own == sorted(own) and len(set(own)) == len(own)  # a process's seqs only grow
        for i, (a, b, _) in enumerate(result["seqs"]):  # every batch whole, with the seqs it reported
            assert (stored[f"w/{me}/{i}/a"].seq, stored[f"w/{me}/{i}/b"].seq) == (a, b)
        seen.update(own)
    assert len(seen) == 8 * batches * 3  # no seq handed out twice in the partition
    assert len(stored) == 8 * batches * 2 + 1


# -- the server crashes and restarts mid-run -------------------------------------------------


@pytest.fixture
def cluster() -> Iterator[PostgresCluster]:
    if not PostgresCluster.available():
        pytest.skip("initdb/pg_ctl not on PATH: cannot start a throwaway PostgreSQL to restart")
    server = PostgresCluster().start()
    try:
        yield server
    finally:
        server.destroy()


class _Loop(threading.Thread):
    """Writes batch after batch (two CREATEs each), recording what was reported saved and every error."""

    def __init__(self, backend: PostgresBackend, p: Partition) -> None:
        super().__init__(daemon=True)
        self.backend, self.p = backend, p
        self.saved: list[tuple[int, int, int]] = []  # (batch, seq a, seq b)
        self.errors: list[BaseException] = []
        self.stop = threading.Event()

    def run(self) -> None:
        i = 0
        while not self.stop.is_set():
            puts = [make_put(f"r/{i}/a", b"a", mode=Mode.CREATE), make_put(f"r/{i}/b", b"b", mode=Mode.CREATE)]
            try:
                result = self.backend.write(self.p, puts)
            except Exception as exc:
                self.errors.append(exc)
                time.sleep(0.05)
            else:
                assert result.conflict is None, result.conflict
                self.saved.append((i, result.records[0].seq, result.records[1].seq))
            i += 1

    def wait_for(self, count: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        target = len(self.saved) + count
        while len(self.saved) < target:
            assert time.monotonic() < deadline, f"no progress: {self.errors[-3:]}"
            time.sleep(0.01)


def test_server_restart_mid_run_loses_nothing_reported_saved(cluster: PostgresCluster) -> None:
    url = with_query(cluster.url, schema="restart")
    backend = PostgresBackend.from_url(url, timeout=1.0, retry_attempts=2, max_size=2)
    p = Partition("u", "items", "loop")
    loop = _Loop(backend, p)
    loop.start()
    try:
        loop.wait_for(30)
        cluster.stop("immediate")  # a crash: the next start recovers from the WAL
        with pytest.raises(BackendUnavailableError) as caught:
            backend.get(p, ["r/0/a"])
        assert isinstance(caught.value.__cause__, psycopg.Error)
        cluster.start()
        loop.wait_for(30)
    finally:
        loop.stop.set()
        loop.join(30)
    assert not [e for e in loop.errors if not isinstance(e, BackendUnavailableError)], loop.errors
    assert loop.errors  # the outage was seen by the loop too, as BackendUnavailableError
    with PostgresBackend.from_url(url) as fresh:
        stored = {r.name: r.seq for r in fresh.list(p, ListQuery())}
    for i, a, b in loop.saved:  # everything reported saved is there, with the seqs reported
        assert (stored.get(f"r/{i}/a"), stored.get(f"r/{i}/b")) == (a, b)
    batches = {name.split("/")[1] for name in stored}
    assert all(f"r/{i}/a" in stored and f"r/{i}/b" in stored for i in batches)  # failed batches: all or nothing
    seqs = [a for _, a, _ in loop.saved]
    assert seqs == sorted(seqs)  # still growing after the crash
    backend.close()


def test_unreachable_server_is_unavailable_after_bounded_retries() -> None:
    from tests.plugins.redis_plugin import free_port

    backend = PostgresBackend(f"postgresql://postgres@127.0.0.1:{free_port()}/x", timeout=0.5, retry_attempts=1)
    started = time.monotonic()
    with pytest.raises(BackendUnavailableError, match="unavailable") as caught:
        backend.get(Partition("u", "items", "x"), ["a"])
    assert isinstance(caught.value.__cause__, psycopg.Error)
    assert time.monotonic() - started < 20  # bounded (the bound itself is not a unit-test matter)
    backend.close()


def test_retried_write_that_had_applied_reports_success(postgres_backend: PostgresBackend) -> None:
    """A batch whose first attempt applied but whose reply was lost is not a conflict when retried."""
    b, s = postgres_backend, postgres_backend.schema
    p = Partition("u", "items", "s")
    put = make_put("i/x", b"v", mode=Mode.CREATE)
    b.write(p, [put])  # the first attempt, whose reply was "lost"
    result = b._run(lambda retried: _write_op(s, p, [put], [], True, b._times()))
    assert result.conflict is None and result.records[0].etag == put.etag
    # without a retry it is a genuine conflict, and so is another writer's CREATE after a retry
    assert b.write(p, [put]).conflict is not None
    other = make_put("i/x", b"v", mode=Mode.CREATE)
    assert b._run(lambda retried: _write_op(s, p, [other], [], True, b._times())).conflict is not None


@pytest.mark.timeout(60)
def test_one_backend_serves_successive_event_loops(postgres_backend: PostgresBackend) -> None:
    """``asyncio.run`` per call: each loop ends while the backend lives on (no task of ours left on it)."""
    b = postgres_backend
    p = Partition("u", "items", "loops")
    for i in range(3):
        result = asyncio.run(b.awrite(p, [make_put(f"k{i}", b"v")]))
        assert result.conflict is None
        assert [r.name for r in asyncio.run(b.alist(p, ListQuery()))] == [f"k{j}" for j in range(i + 1)]
    assert len(b._loops) <= 1  # the connections of loops that ended are let go


def test_many_pipelines_reads_with_the_results_of_one_by_one(postgres_backend: PostgresBackend) -> None:
    b = postgres_backend
    p = Partition("u", "items", "many")
    b.write(p, [make_put("a/1", b"1", tags={"t": "x"}), make_put("a/2", b"2"), make_put("b", b"3")])
    ops = [GetOp(p, ["a/1", "zz"]), ListOp(p, ListQuery(prefix="a/")), ListOp(p, ListQuery(tags={"t": "x"}))]
    expected = [op.call(b) for op in ops]
    assert b.many(ops) == expected
    assert asyncio.run(b.amany(ops)) == expected


def test_damaged_rows_are_corrupt_items_not_driver_errors(
    postgres_backend: PostgresBackend, _postgres_admin: psycopg.Connection[Any]
) -> None:
    from checkpointers.errors import CorruptItemError

    b, s = postgres_backend, postgres_backend.schema
    p = Partition("u", "items", "damaged")
    b.write(p, [make_put("a", b"1", tags={"t": "x"}), make_put("b", b"2")])
    _postgres_admin.execute(f"UPDATE {s}.records SET tags = 'not json' WHERE pkey = %s AND name = 'a'", (p.key,))
    with pytest.raises(CorruptItemError, match="'a'"):
        b.get(p, ["a"])
    assert b.get(p, ["b"])[0] is not None  # the others still read
    # a tag row that its record does not carry (forged or damaged) is refused, not returned as a match
    _postgres_admin.execute(
        f"INSERT INTO {s}.tags (pkey, name, k, v, seq) VALUES (%s, 'b', '\"t\"', '\"x\"', 1)", (p.key,)
    )
    with pytest.raises(CorruptItemError, match="'b'"):
        b.list(p, ListQuery(tags={"t": "x"}, prefix="b"))
    # a registry row naming another partition than its key's
    _postgres_admin.execute(f"UPDATE {s}.partitions SET name = %s WHERE pkey = %s", (b"elsewhere", p.key))
    with pytest.raises(CorruptItemError):
        b.partitions("u", "items")


def test_seqs_keep_growing_across_deletes_and_drops(postgres_backend: PostgresBackend) -> None:
    b = postgres_backend
    p = Partition("u", "items", "seqs")
    first = b.write(p, [make_put("a", b"1"), make_put("b", b"2")]).records
    b.write(p, [], [Delete("b")])  # the newest record goes
    after_delete = b.write(p, [make_put("c", b"3")]).records[0].seq
    assert b.drop(p) == 2 and b.partitions("u", "items") == []
    after_drop = b.write(p, [make_put("d", b"4")]).records[0].seq
    assert first[0].seq < first[1].seq < after_delete < after_drop


# -- PgBouncer transaction mode: no server-side prepared statements --------------------------


def test_no_statement_is_prepared_on_the_server(postgres_schema_url: str, _postgres_admin: Any) -> None:
    """``prepare_threshold=None`` (URL ``?prepare_threshold=none``): PgBouncer before 1.21."""
    b = PostgresBackend.from_url(with_query(postgres_schema_url, prepare_threshold="none"), timeout=5)
    assert b.prepare_threshold is None
    p = Partition("u", "items", f"prep-{uuid.uuid4().hex[:8]}")
    for i in range(12):  # psycopg's default would prepare a statement after its 5th use
        b.write(p, [make_put(f"k{i}", b"v")])
        b.get(p, [f"k{i}"])
        b.list(p, ListQuery(prefix="k", limit=3))
    b.many([GetOp(p, ["k1"]), ListOp(p, ListQuery(prefix="k"))])
    with b._sync_pool().connection() as conn:
        assert conn.execute("SELECT count(*) FROM pg_prepared_statements").fetchone() == (0,)

    async def main() -> int:
        for i in range(8):
            await b.aget(p, [f"k{i}"])
            await b.awrite(p, [make_put(f"k{i}", b"w")])
        async with b._async_pool().connection() as conn:
            row = await (await conn.execute("SELECT count(*) FROM pg_prepared_statements")).fetchone()
        await b.aclose()
        return int(row[0]) if row else -1

    assert asyncio.run(main()) == 0
    b.close()


def test_statements_are_prepared_on_the_server_by_default(postgres_schema_url: str) -> None:
    """As ``PostgresSaver``'s connections (``prepare_threshold=0``): the statements' plans are made once."""
    b = PostgresBackend.from_url(postgres_schema_url, min_size=1, max_size=1)  # one connection sees them all
    p = Partition("u", "items", f"prep-{uuid.uuid4().hex[:8]}")
    b.write(p, [make_put("k", b"v")])
    b.get(p, ["k"])
    b.list(p, ListQuery(prefix="k", depth=0, limit=3, children=True))
    with b._sync_pool().connection() as conn:
        rows = conn.execute("SELECT statement FROM pg_prepared_statements").fetchall()
    b.close()
    assert any("write_batch" in r[0] for r in rows) and any("MATERIALIZED" in r[0] for r in rows), rows


def test_the_prepared_statements_check_can_fail(postgres_url: str) -> None:
    """The same check on psycopg's default connection does see a prepared statement."""
    with psycopg.connect(postgres_url) as conn:
        for _ in range(6):
            conn.execute("SELECT %s::int", (1,))
        assert conn.execute("SELECT count(*) FROM pg_prepared_statements").fetchone() != (0,)


# -- EXPLAIN: indexes, and work that does not grow with history --------------------------------


def _scans(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    if "Relation Name" in plan:
        yield plan
    for child in plan.get("Plans", ()):
        yield from _scans(child)


def _fill(conn: psycopg.Connection[Any], s: str, pkey: str, checkpoints: int) -> None:
    """``checkpoints`` checkpoint records with two writes each and a tag, by SQL (fast)."""
    conn.execute(
        f"INSERT INTO {s}.records (pkey, name, seq, etag, digest, tags, value) "
        f"SELECT %s, n, nextval('{s}.seq'), 'e', 'd', t, '\\x00'::bytea FROM ("
        "  SELECT format('c/_/%%s', lpad(g::text, 8, '0')) AS n, '{\"src\":\"loop\"}' AS t "
        "  FROM generate_series(1, %s) g"
        "  UNION ALL SELECT format('c/_/%%s/w/%%s', lpad(g::text, 8, '0'), w), '{}' "
        "  FROM generate_series(1, %s) g, generate_series(1, 2) w) AS x ORDER BY n",
        (pkey, checkpoints, checkpoints),
    )
    conn.execute(
        f"INSERT INTO {s}.tags (pkey, name, k, v, seq) SELECT pkey, name, '\"src\"', '\"loop\"', seq "
        f"FROM {s}.records WHERE pkey = %s AND tags <> '{{}}'",
        (pkey,),
    )


@pytest.mark.parametrize(
    "query",
    [
        ListQuery(prefix="c/_/", depth=0, descending=True, limit=1, children=True),  # get_tuple (latest)
        ListQuery(prefix="c/_/", depth=0, descending=True, limit=10),  # list(limit=10)
        ListQuery(prefix="c/_/", depth=0, descending=True, limit=10, tags={"src": "loop"}),  # list(filter=...)
        ListQuery(order="seq", descending=True, limit=1),  # newest record
    ],
    ids=["latest", "list10", "tagged", "seq"],
)
def test_latest_and_list_use_indexes_and_read_a_bounded_part_of_history(
    postgres_backend: PostgresBackend, _postgres_admin: psycopg.Connection[Any], query: ListQuery
) -> None:
    b, s = postgres_backend, postgres_backend.schema
    p = Partition("u", "langgraph", "history")
    for other in range(20):  # other partitions, so the tables are not tiny
        _fill(_postgres_admin, s, Partition("u", "langgraph", f"o{other}").key, 200)
    _fill(_postgres_admin, s, p.key, 5000)
    _postgres_admin.execute(f"ANALYZE {s}.records; ANALYZE {s}.tags")
    stmt = next(_list_op(s, p, query, time.time()))
    with b._sync_pool().connection() as conn:
        (plan,) = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + stmt.sql, stmt.params).fetchone()  # type: ignore[misc]
    scans = list(_scans(plan[0]["Plan"]))
    assert scans and all(node["Node Type"] != "Seq Scan" for node in scans), scans
    # work bounded by the limit and one checkpoint's writes, not by the 5,000 checkpoints
    assert sum(node["Actual Rows"] * node.get("Actual Loops", 1) for node in scans) <= 40, scans
    assert len(b.list(p, query)) in (1, 3, 10)


# -- drop-in: real compiled graphs, side by side with LangGraph's PostgresSaver -------------------


@pytest.fixture
def reference_url(postgres_url: str) -> Iterator[str]:
    """A scratch schema for LangGraph's own PostgresSaver (its tables go on the search_path)."""
    schema = f"lgref_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        yield with_query(postgres_url, options=f"-csearch_path%3D{schema}")
    finally:
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


def _summary(saver: Any, thread: str) -> tuple[Any, list[Any]]:
    graph = loop_graph(saver, limit=4)
    config = {"configurable": {"thread_id": thread}}
    final = graph.invoke({"count": 0, "trail": []}, config)
    history = [(h.values, h.next, h.metadata.get("step")) for h in graph.get_state_history(config)]
    return final, history


async def _asummary(saver: Any, thread: str) -> tuple[Any, list[Any]]:
    graph = loop_graph(saver, limit=4)
    config = {"configurable": {"thread_id": thread}}
    final = await graph.ainvoke({"count": 0, "trail": []}, config)
    history = [(h.values, h.next, h.metadata.get("step")) async for h in graph.aget_state_history(config)]
    return final, history


def test_drop_in_for_postgres_saver_sync(postgres_schema_url: str, reference_url: str) -> None:
    from langgraph.checkpoint.postgres import PostgresSaver

    thread = f"t-{uuid.uuid4().hex[:8]}"
    with PostgresSaver.from_conn_string(reference_url) as reference:
        reference.setup()
        expected = _summary(reference, thread)
    with PostgresCheckpointer.from_conn_string(postgres_schema_url) as saver:
        saver.setup()
        saver.setup()  # idempotent
        assert _summary(saver, thread) == expected
    assert expected[0]["count"] == 4 and len(expected[1]) > 4
    with PostgresCheckpointer.from_conn_string(postgres_schema_url) as reopened:  # durable across savers
        state = loop_graph(reopened, limit=4).get_state({"configurable": {"thread_id": thread}})
        assert state.values == expected[0]


def test_drop_in_for_async_postgres_saver(postgres_schema_url: str, reference_url: str) -> None:
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

    thread = f"t-{uuid.uuid4().hex[:8]}"

    async def main() -> None:
        async with AsyncPostgresSaver.from_conn_string(reference_url) as reference:
            await reference.setup()
            expected = await _asummary(reference, thread)
        async with PostgresCheckpointer.from_conn_string(postgres_schema_url) as saver:
            await saver.asetup()
            assert await _asummary(saver, thread) == expected
        async with PostgresCheckpointer.from_conn_string(postgres_schema_url) as reopened:
            state = await loop_graph(reopened, limit=4).aget_state({"configurable": {"thread_id": thread}})
            assert state.values == expected[0]

    asyncio.run(main())


def test_a_version_1_schema_gains_expiries_and_keeps_its_partitions_forever(postgres_url: str) -> None:
    """Retention's migration (2) adds ``partitions.expires_at`` and a new ``write_batch``: rows written by
    version 1 (through its own ``write_batch``) are NULL and never expire; writes with a ttl set one."""
    schema = f"cpm_{uuid.uuid4().hex[:10]}"
    p = Partition("u", "items", "old")
    try:
        schema_at(postgres_url, schema, 1)  # version 1, one record written by it
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(
                f"SELECT * FROM {schema}.write_batch(%s, %s, %s, ARRAY['a'], ARRAY['u'], ARRAY[NULL], ARRAY['e'], "
                "ARRAY['d'], ARRAY['d'], ARRAY['{}'], ARRAY['\\x01'::bytea], ARRAY[0], '{}', '{}', '{}', '{}')",
                (p.key, p.user_key, p.name.encode()),
            )
        later = time.time() + 3600  # an hour on: nothing written before the migration has expired
        with PostgresBackend.from_url(with_query(postgres_url, schema=schema), ttl=10, clock=lambda: later) as b:
            assert b.migrate() == 1
            assert [r.name for r in b.list(p, ListQuery())] == ["a"]
            assert b.expiry(p) is None and b.expired() == [] and b.sweep() == 0
            assert b.write(p, [make_put("b", b"2")]).conflict is None
            assert b.expiry(p) == pytest.approx(later + 10)
    finally:
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


# -- a caller's connection or pool (PostgresSaver(conn) / AsyncPostgresSaver(conn)) -------------------


def _libpq_and_schema(url: str) -> tuple[str, str]:
    b = PostgresBackend.from_url(url)
    return b.conninfo, b.schema


def _roundtrip(b: PostgresBackend, name: str) -> None:
    p = Partition("u", "items", name)
    assert b.write(p, [make_put("a", b"1"), make_put("b", b"2", tags={"k": "v"})]).conflict is None
    assert [r.value if r else None for r in b.get(p, ["a", "b", "c"])] == [b"1", b"2", None]
    assert [r.name for r in b.list(p, ListQuery(tags={"k": "v"}))] == ["b"]
    assert b.write(p, [make_put("a", b"9", mode=Mode.CREATE)]).conflict is not None


@pytest.mark.parametrize("autocommit", [True, False], ids=["autocommit", "transactions"])
def test_a_given_connection_serves_both_faces_and_stays_open(postgres_schema_url: str, autocommit: bool) -> None:
    from psycopg.rows import dict_row

    conninfo, schema = _libpq_and_schema(postgres_schema_url)
    with psycopg.connect(conninfo, autocommit=autocommit, row_factory=dict_row) as conn:  # PostgresSaver's kind
        b = PostgresBackend(conn, schema=schema)
        _roundtrip(b, f"given-{uuid.uuid4().hex[:8]}")
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE  # each operation committed
        p = Partition("u", "items", f"given-async-{uuid.uuid4().hex[:8]}")

        async def main() -> None:  # the async face runs the sync connection in a worker thread
            await asyncio.gather(*(b.awrite(p, [make_put(f"k{i}", b"v")]) for i in range(6)))
            assert len(await b.alist(p, ListQuery())) == 6

        asyncio.run(main())
        b.close()
        assert not conn.closed
        assert conn.execute("SELECT 1 AS one").fetchone() == {"one": 1}  # its row factory is untouched
    with psycopg.connect(conninfo, autocommit=True) as other:  # written for real, seen by another session
        (count,) = other.execute(f"SELECT count(*) FROM {schema}.records WHERE pkey = %s", (p.key,)).fetchone()  # type: ignore[misc]
        assert count == 6


def test_a_given_pool_is_used_and_not_closed(postgres_schema_url: str) -> None:
    from psycopg_pool import ConnectionPool

    conninfo, schema = _libpq_and_schema(postgres_schema_url)
    with ConnectionPool(conninfo, min_size=1, max_size=3, kwargs={"autocommit": True}) as pool:
        b = PostgresBackend(pool, schema=schema)
        threads = [threading.Thread(target=_roundtrip, args=(b, f"pool-{i}-{uuid.uuid4().hex[:6]}")) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        _roundtrip(b, f"pool-{uuid.uuid4().hex[:8]}")
        b.close()
        assert not pool.closed and pool.get_stats()["requests_num"] >= 5


def test_a_given_async_connection_or_pool_serves_the_async_face_only(postgres_schema_url: str) -> None:
    from psycopg_pool import AsyncConnectionPool

    from checkpointers import CheckpointerError

    conninfo, schema = _libpq_and_schema(postgres_schema_url)
    p = Partition("u", "items", f"agiven-{uuid.uuid4().hex[:8]}")

    async def use(b: PostgresBackend, tag: str) -> None:
        await asyncio.gather(*(b.awrite(p, [make_put(f"{tag}{i}", b"v")]) for i in range(5)))
        assert len(await b.alist(p, ListQuery(prefix=tag))) == 5
        with pytest.raises(CheckpointerError, match="async connection"):
            b.get(p, ["x"])
        await b.aclose()

    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(conninfo) as conn:  # no autocommit
            await use(PostgresBackend(conn, schema=schema), "c")
            assert not conn.closed
        async with AsyncPoolOpen(conninfo) as pool:
            await use(PostgresBackend(pool, schema=schema), "p")
            assert not pool.closed

    def AsyncPoolOpen(info: str) -> AsyncConnectionPool:  # noqa: N802 - a constructor
        return AsyncConnectionPool(info, min_size=1, max_size=2, open=False, kwargs={"autocommit": True})

    asyncio.run(main())


def test_anything_else_is_refused() -> None:
    with pytest.raises(TypeError, match="conninfo string"):
        PostgresBackend(42)  # type: ignore[arg-type]


def test_drop_in_for_postgres_saver_on_a_given_connection(postgres_schema_url: str, reference_url: str) -> None:
    """``PostgresSaver(conn)`` -> ``PostgresCheckpointer(conn)`` (sync), ``AsyncPostgresSaver(conn)`` (async)."""
    from langgraph.checkpoint.postgres import PostgresSaver
    from psycopg.rows import dict_row

    conninfo, schema = _libpq_and_schema(postgres_schema_url)
    thread = f"t-{uuid.uuid4().hex[:8]}"
    with psycopg.connect(reference_url, autocommit=True, prepare_threshold=0, row_factory=dict_row) as conn:
        reference = PostgresSaver(conn)
        reference.setup()
        expected = _summary(reference, thread)
    with psycopg.connect(conninfo, autocommit=True, prepare_threshold=0, row_factory=dict_row) as conn:
        saver = PostgresCheckpointer(conn, schema=schema)
        saver.setup()
        assert _summary(saver, thread) == expected
        saver.close()
        assert not conn.closed

    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True, row_factory=dict_row) as aconn:
            saver = PostgresCheckpointer(aconn, schema=schema)
            await saver.asetup()
            assert await _asummary(saver, f"a{thread}") == expected
            state = await loop_graph(saver, limit=4).aget_state({"configurable": {"thread_id": thread}})
            assert state.values == expected[0]

    asyncio.run(main())


# -- migration 3: write_batch checks an unchanged re-put instead of rewriting it ----------------------


def _row_version(conn: psycopg.Connection[Any], s: str, p: Partition, name: str) -> Any:
    sql = f"SELECT xmin::text, seq FROM {s}.records WHERE pkey = %s AND name = %s"
    return conn.execute(sql, (p.key, name)).fetchone()  # type: ignore[arg-type]


def test_an_unchanged_if_match_reput_is_checked_not_rewritten(
    postgres_backend: PostgresBackend, _postgres_admin: psycopg.Connection[Any]
) -> None:
    b, s = postgres_backend, postgres_backend.schema
    p = Partition("u", "items", "reput")
    (lease,) = b.write(p, [make_put("lease", b"L", tags={"k": "v"})]).records
    before = _row_version(_postgres_admin, s, p, "lease")
    guard = Put(lease.name, lease.value, lease.digest, lease.etag, dict(lease.tags), Mode.IF_MATCH, lease.etag)
    result = b.write(p, [guard, make_put("x", b"1")])
    assert result.conflict is None and result.records[0] == lease  # the stored record, its seq kept
    assert result.records[1].seq > lease.seq
    assert _row_version(_postgres_admin, s, p, "lease") == before  # no new row version
    assert [r.name for r in b.list(p, ListQuery(tags={"k": "v"}))] == ["lease"]  # its tag rows kept
    stale = dataclasses.replace(guard, if_match="someone-else")
    assert b.write(p, [stale]).conflict is not None  # the condition is still checked
    changed = make_put("lease", b"M", mode=Mode.IF_MATCH, if_match=lease.etag)  # a real if_match write
    (new,) = b.write(p, [changed]).records
    assert new.seq > lease.seq and _row_version(_postgres_admin, s, p, "lease") != before
    assert b.list(p, ListQuery(tags={"k": "v"})) == []  # the replaced record's tags went with it


def test_a_version_2_schema_migrates_to_the_cheaper_write_batch(postgres_url: str) -> None:
    schema = f"cpm_{uuid.uuid4().hex[:10]}"
    p = Partition("u", "items", "v2")
    try:
        schema_at(postgres_url, schema, 2)  # version 2, written by its write_batch
        with PostgresBackend.from_url(with_query(postgres_url, schema=schema)) as b:
            b._ready = True  # write through version 2's function first
            (old,) = b.write(p, [make_put("a", b"1", tags={"t": "1"})]).records
            assert b.migrate() == 2 and b.migrate() == SCHEMA_VERSION
            assert b.get(p, ["a"]) == [old] and [r.name for r in b.list(p, ListQuery(tags={"t": "1"}))] == ["a"]
            assert b.write(p, [make_put("a", b"2", tags={"t": "2"})]).conflict is None  # replaces its tags
            assert b.list(p, ListQuery(tags={"t": "1"})) == [] and len(b.list(p, ListQuery(tags={"t": "2"}))) == 1
    finally:
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


# -- migration 4: an APPEND or CREATE put is one INSERT ... ON CONFLICT DO NOTHING --------------------


def _raw_names(conn: psycopg.Connection[Any], s: str, p: Partition) -> tuple[list[str], list[str]]:
    """The names of the partition's ``records`` rows and of its ``tags`` rows, straight from the tables."""
    records = [n for (n,) in conn.execute(f"SELECT name FROM {s}.records WHERE pkey = %s ORDER BY name", (p.key,))]
    tags = [n for (n,) in conn.execute(f"SELECT name FROM {s}.tags WHERE pkey = %s ORDER BY name", (p.key,))]
    return records, tags


def test_appends_and_creates_are_inserted_and_a_refused_batch_leaves_none_of_them(
    postgres_backend: PostgresBackend, _postgres_admin: psycopg.Connection[Any]
) -> None:
    b, s, admin = postgres_backend, postgres_backend.schema, _postgres_admin
    p = Partition("u", "items", "m4")
    written = b.write(
        p,
        [
            make_put("u1", b"1"),
            make_put("a1", b"2", tags={"k": "v"}, mode=Mode.APPEND),
            make_put("c1", b"3", mode=Mode.CREATE),
            make_put("u2", b"4", tags={"k": "v"}),
        ],
    ).records
    seqs = [r.seq for r in written]
    assert seqs == sorted(seqs) and len(set(seqs)) == 4  # drawn in put order, inserted ones too
    a1, c1 = written[1], written[2]
    assert b.get(p, ["a1", "c1"]) == [a1, c1]
    assert [r.name for r in b.list(p, ListQuery(tags={"k": "v"}))] == ["a1", "u2"]
    before = _row_version(admin, s, p, "a1")
    # the same content again: kept, the stored record returned, its row untouched
    (kept,) = b.write(p, [make_put("a1", b"2", tags={"k": "v"}, mode=Mode.APPEND)]).records
    assert kept == a1 and _row_version(admin, s, p, "a1") == before
    other = b.write(p, [make_put("a1", b"other", mode=Mode.APPEND)])  # different content: refused
    assert other.records == [] and other.conflict is not None
    assert (other.conflict.index, other.conflict.name, other.conflict.existing) == (0, "a1", a1)
    raw = _raw_names(admin, s, p)
    refused = [  # each inserts an append and a create before its conflict is found
        (
            [
                make_put("a2", b"x", tags={"k": "v"}, mode=Mode.APPEND),
                make_put("c2", b"y", mode=Mode.CREATE),
                make_put("c1", b"z", mode=Mode.CREATE),
            ],
            [],
            (2, "c1", c1),
        ),
        (
            [make_put("a2", b"x", tags={"k": "v"}, mode=Mode.APPEND), make_put("a1", b"w", mode=Mode.APPEND)],
            [],
            (1, "a1", a1),
        ),
        (
            [
                make_put("a2", b"x", tags={"k": "v"}, mode=Mode.APPEND),
                make_put("i1", b"v", mode=Mode.IF_MATCH, if_match="nope"),
            ],
            [],
            (1, "i1", None),
        ),
        (
            [make_put("a2", b"x", tags={"k": "v"}, mode=Mode.APPEND)],
            [Delete("u1", if_match="stale")],
            (1, "u1", written[0]),
        ),
    ]
    for puts, deletes, (index, name, existing) in refused:
        result = b.write(p, puts, deletes)
        assert result.records == [] and result.conflict is not None
        assert (result.conflict.index, result.conflict.name, result.conflict.existing) == (index, name, existing)
        assert _raw_names(admin, s, p) == raw  # no row of the refused batch stayed, no tag row either
        assert b.get(p, ["a2", "c2"]) == [None, None]
    (a2,) = b.write(p, [make_put("a2", b"x", tags={"k": "v"}, mode=Mode.APPEND)]).records
    assert a2.seq > max(seqs) and [r.name for r in b.list(p, ListQuery(tags={"k": "v"}))] == ["a1", "a2", "u2"]


def test_a_version_3_schema_migrates_to_the_inserting_write_batch(postgres_url: str) -> None:
    schema = f"cpm_{uuid.uuid4().hex[:10]}"
    p = Partition("u", "items", "v3")
    try:
        schema_at(postgres_url, schema, 3)  # version 3
        with PostgresBackend.from_url(with_query(postgres_url, schema=schema)) as b:
            b._ready = True  # write through version 3's function first
            old = b.write(p, [make_put("a", b"1", tags={"t": "1"}, mode=Mode.APPEND), make_put("c", b"2")]).records
            assert b.migrate() == 3 and b.migrate() == SCHEMA_VERSION
            assert b.get(p, ["a", "c"]) == old
            assert b.write(p, [make_put("a", b"1", tags={"t": "1"}, mode=Mode.APPEND)]).records == old[:1]
            refused = b.write(p, [make_put("n", b"3", mode=Mode.APPEND), make_put("c", b"4", mode=Mode.CREATE)])
            assert refused.conflict is not None and refused.conflict.existing == old[1]
            assert b.get(p, ["n"]) == [None]
            (new,) = b.write(p, [make_put("n", b"3", tags={"t": "1"}, mode=Mode.APPEND)]).records
            assert new.seq > old[1].seq and [r.name for r in b.list(p, ListQuery(tags={"t": "1"}))] == ["a", "n"]
    finally:
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
