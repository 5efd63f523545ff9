"""PostgreSQL: the hot reads touch a bounded number of rows whatever the planner's statistics say.

The latest checkpoint (and its writes), ``list(limit=10)`` with and without
a namespace and below a checkpoint, a read by names, the newest record in
seq order and the single-tag reads of both faces, on a thread of 3,000
checkpoints next to one of 5,000, in each state the planner's estimate of
the thread's size can be in: never analyzed; analyzed before the thread
existed (the skewed case: it "holds about one row"); analyzed when it was
small, then grown; and each with generic plans (``force_generic_plan``, as
a prepared statement may get after five executions). The rows touched are
counted by the server (``pg_stat_get_xact_tuples_returned`` and ``_fetched``
of the schema's tables and indexes, in the read's transaction), so they
include what the read functions of migration 6 do inside; counts, not
timings.

Each state is built in a schema of its own, autovacuum off (it would
ANALYZE behind the test's back), with rows inserted by SQL
(:func:`tests.test_postgres_backend._fill`, a few hundred milliseconds where
24,000 puts would take a minute): the statements under test only read them.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from checkpointers._names import Partition
from checkpointers.backends.base import ListQuery
from checkpointers.backends.postgres import PostgresBackend, _get_op, _list_op
from tests.test_postgres_backend import _fill

BIG, THREAD = Partition("u", "langgraph", "big"), Partition("u", "langgraph", "thread")
CHECKPOINTS = 3000  # of THREAD; BIG has 5,000

#: Each read, the names it returns and the most rows it may touch (an index entry and a heap row count one each).
READS: dict[str, tuple[ListQuery | list[str], list[str], int]] = {
    "latest": (
        ListQuery(prefix="c/_/", depth=0, descending=True, limit=1, children=True),
        ["c/_/00003000", "c/_/00003000/w/1", "c/_/00003000/w/2"],
        30,
    ),
    "list10": (
        ListQuery(prefix="c/_/", depth=0, descending=True, limit=10, children=True),
        [f"c/_/{n:08d}{w}" for n in range(3000, 2990, -1) for w in ("", "/w/1", "/w/2")],
        150,
    ),
    "list10_all_namespaces": (
        ListQuery(prefix="c/", depth=1, descending=True, limit=10),
        [f"c/_/{n:08d}" for n in range(3000, 2990, -1)],
        150,
    ),
    "list10_before": (
        ListQuery(descending=True, start="c/_/", stop="c/_/00001000", depth=2, limit=10),
        [f"c/_/{n:08d}" for n in range(999, 989, -1)],
        150,
    ),
    "get": (["c/_/00002000", "c/_/00002999/w/1"], ["c/_/00002000", "c/_/00002999/w/1"], 10),
    "newest_seq": (ListQuery(order="seq", descending=True, limit=1), ["c/_/00003000/w/2"], 10),
    "tagged_seq": (  # the Agent Framework face's latest checkpoint
        ListQuery(prefix="c/", order="seq", descending=True, limit=1, tags={"src": "loop"}),
        ["c/_/00002999"],
        10,
    ),
    "rare_tagged_seq": (
        ListQuery(prefix="c/", order="seq", descending=True, limit=1, tags={"src": "input"}),
        ["c/_/00003000"],
        10,
    ),
    "tagged_name": (  # LangGraph's list(filter=..., limit=10)
        ListQuery(prefix="c/_/", depth=0, descending=True, limit=10, tags={"src": "loop"}),
        [f"c/_/{n:08d}" for n in range(2999, 2989, -1)],
        150,
    ),
    "rare_tagged_name": (
        ListQuery(prefix="c/_/", depth=0, descending=True, limit=10, tags={"src": "input"}),
        [f"c/_/{n:08d}" for n in range(3000, 2000, -100)],
        150,
    ),
}

_TOUCHED = (
    "SELECT sum(pg_stat_get_xact_tuples_returned(c.oid) + pg_stat_get_xact_tuples_fetched(c.oid))::int "
    "FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace WHERE n.nspname = %s"
)


def _analyze(admin: psycopg.Connection[Any], s: str) -> None:
    admin.execute(f"ANALYZE {s}.records; ANALYZE {s}.tags; ANALYZE {s}.partitions")


def _empty(admin: psycopg.Connection[Any], s: str, p: Partition) -> None:
    admin.execute(f"DELETE FROM {s}.tags WHERE pkey = %s", (p.key,))
    admin.execute(f"DELETE FROM {s}.records WHERE pkey = %s", (p.key,))


@pytest.fixture(params=["never_analyzed", "analyzed_before_the_thread", "analyzed_when_the_thread_was_small"])
def schema(
    request: pytest.FixtureRequest, postgres_url: str, _postgres_admin: psycopg.Connection[Any]
) -> Iterator[str]:
    """A schema in one statistics state, THREAD holding CHECKPOINTS checkpoints (two writes and a tag each)."""
    s = f"cpplan_{uuid.uuid4().hex[:10]}"
    admin = _postgres_admin
    backend = PostgresBackend(postgres_url, schema=s)
    try:
        backend.migrate()
    finally:
        backend.close()
    try:
        for table in ("records", "tags", "partitions"):
            admin.execute(f"ALTER TABLE {s}.{table} SET (autovacuum_enabled = off)")
        for other in range(3):
            _fill(admin, s, Partition("u", "langgraph", f"o{other}").key, 200)
        _fill(admin, s, BIG.key, 5000)
        if request.param == "analyzed_before_the_thread":
            _analyze(admin, s)
        elif request.param == "analyzed_when_the_thread_was_small":
            _fill(admin, s, THREAD.key, 300)
            _analyze(admin, s)
            _empty(admin, s, THREAD)
        _fill(admin, s, THREAD.key, CHECKPOINTS)
        # one checkpoint in a hundred is tagged src=input instead: a rare tag value
        admin.execute(f"UPDATE {s}.tags SET v = '\"input\"' WHERE pkey = %s AND name LIKE '%%00'", (THREAD.key,))
        admin.execute(
            f"UPDATE {s}.records SET tags = '{{\"src\":\"input\"}}' "
            "WHERE pkey = %s AND tags <> '{}' AND name LIKE '%%00'",
            (THREAD.key,),
        )
        yield s
    finally:
        admin.execute(f"DROP SCHEMA {s} CASCADE")


def _touched(postgres_url: str, schema: str, read: str, plans: str) -> tuple[list[str], int]:
    """The names ``read`` returns, and the rows it touched, on a new connection (so new plans) with ``plans``."""
    query, _, _ = READS[read]
    now = time.time()
    op = _get_op(schema, THREAD, query, now) if isinstance(query, list) else _list_op(schema, THREAD, query, now)
    stmt = next(op)
    with psycopg.connect(postgres_url) as conn:
        if plans == "generic":
            conn.execute("SET plan_cache_mode = force_generic_plan")
            conn.commit()
        rows = conn.execute(stmt.sql, stmt.params, prepare=True).fetchall()  # prepared, as the backend does
        (touched,) = conn.execute(_TOUCHED, (schema,)).fetchone()  # type: ignore[misc]
        conn.rollback()
    with pytest.raises(StopIteration) as done:  # one statement
        op.send(rows)
    return [rec.name for rec in done.value.value if rec is not None], touched


def test_hot_reads_touch_rows_bounded_by_their_limit_whatever_the_statistics(postgres_url: str, schema: str) -> None:
    too_many = {}
    for read, (_, expected, most) in READS.items():
        for plans in ("custom", "generic"):
            got, touched = _touched(postgres_url, schema, read, plans)
            assert got == expected, (read, plans)
            assert touched > 0, "the server counts no rows read (track_counts off?)"
            if touched > most:
                too_many[f"{read} ({plans} plan)"] = f"{touched} rows touched, at most {most} expected"
    assert not too_many, too_many
