"""PostgreSQL schema migration 7: ``write_batch`` with less server work per call, values compressed with LZ4.

Same arguments, results and statements as version 6's function; each put's
state is one int, its seq and (kept) the row its check read. These tests pin
what that bookkeeping must get right, on the server's own rows: a kept put
returns its own stored row (also several in one batch, around written
ones), a refused batch leaves no row of its checks' inserts and no tag row,
a replaced record's tags are replaced; and a version-6 schema, written by its
own function, migrates and keeps its records, new values compressed with LZ4.
On the client, writes on one connection reuse its cursor and their dumpers.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from checkpointers._flows import make_put
from checkpointers._names import Partition
from checkpointers.backends.base import Delete, ListQuery, Mode
from checkpointers.backends.postgres import SCHEMA_VERSION, PostgresBackend
from tests.plugins.postgres_plugin import with_query
from tests.test_postgres_backend import schema_at
from tests.test_postgres_lock import _guard  # the lease guard's re-put: kept, not rewritten

#: A value the server compresses (well over the 2 KB at which a row's values are compressed).
_BIG = b"checkpoint " * 400


@pytest.fixture
def schema(postgres_url: str) -> Iterator[str]:
    name = f"cpw_{uuid.uuid4().hex[:10]}"
    try:
        yield name
    finally:
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")


def _rows(postgres_url: str, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        return conn.execute(sql, params).fetchall()


def _lz4(postgres_url: str) -> bool:
    """Whether the server was built with LZ4 (migration 7 sets it only then)."""
    sql = "SELECT 'lz4' = ANY (enumvals) FROM pg_settings WHERE name = 'default_toast_compression'"
    return bool(_rows(postgres_url, sql) == [(True,)])


def test_kept_puts_return_their_own_stored_rows_around_written_ones(postgres_url: str, schema: str) -> None:
    p = Partition("u", "items", "kept")
    b = PostgresBackend.from_url(with_query(postgres_url, schema=schema))
    with b:
        a, c = b.write(p, [make_put("a", b"A", tags={"t": "a"}), make_put("c", _BIG, mode=Mode.APPEND)]).records
        batch = [_guard(a), make_put("b", b"B", tags={"t": "b"}), make_put("c", _BIG, mode=Mode.APPEND)]
        kept_a, new_b, kept_c = b.write(p, batch).records
        assert kept_a == a and kept_c == c  # each kept put returns its own row, as stored
        assert new_b.seq > c.seq and new_b.value == b"B"
        assert b.get(p, ["a", "b", "c"]) == [a, new_b, c]
        assert [r.name for r in b.list(p, ListQuery(tags={"t": "b"}))] == ["b"]
        # nothing kept was rewritten: one row version each, the seqs as before
        names = _rows(postgres_url, f"SELECT name, seq FROM {schema}.records ORDER BY name")
        assert names == [("a", a.seq), ("b", new_b.seq), ("c", c.seq)]


def test_a_refused_batch_leaves_no_row_of_its_checks(postgres_url: str, schema: str) -> None:
    p = Partition("u", "items", "refused")
    b = PostgresBackend.from_url(with_query(postgres_url, schema=schema))
    with b:
        (x,) = b.write(p, [make_put("x", b"X", tags={"t": "x"})]).records
        batch = [make_put("n1", b"1", tags={"t": "n"}, mode=Mode.APPEND), make_put("x", b"Y", mode=Mode.CREATE)]
        refused = b.write(p, batch)
        assert refused.conflict is not None and refused.conflict.index == 1 and refused.conflict.existing == x
        refused = b.write(p, [make_put("n2", b"2", tags={"t": "n"}, mode=Mode.APPEND)], [Delete("x", "not-it")])
        assert refused.conflict is not None and refused.conflict.index == 1 and refused.conflict.name == "x"
        assert _rows(postgres_url, f"SELECT name FROM {schema}.records") == [("x",)]
        assert _rows(postgres_url, f"SELECT name, k FROM {schema}.tags") == [("x", '"t"')]
        (later,) = b.write(p, [make_put("n1", b"1", mode=Mode.APPEND)]).records
        assert later.seq > x.seq  # seqs drawn by refused batches are skipped, never reused


def test_a_replaced_record_gets_new_tag_rows(postgres_url: str, schema: str) -> None:
    p = Partition("u", "items", "tags")
    b = PostgresBackend.from_url(with_query(postgres_url, schema=schema))
    with b:
        (old,) = b.write(p, [make_put("r", b"1", tags={"t": "old", "k": "1"})]).records
        (new,) = b.write(p, [make_put("r", b"2", tags={"t": "new"}, mode=Mode.IF_MATCH, if_match=old.etag)]).records
        assert new.seq > old.seq and b.list(p, ListQuery(tags={"t": "old"})) == []
        assert b.list(p, ListQuery(tags={"t": "new"})) == [new]
        tag_rows = _rows(postgres_url, f"SELECT k, v, seq FROM {schema}.tags")
        assert tag_rows == [('"t"', '"new"', new.seq)]


def test_a_version_6_schema_migrates_to_7(postgres_url: str, schema: str) -> None:
    """Records a version-6 ``write_batch`` wrote (pglz) read back; values written from then on use LZ4."""
    p = Partition("u", "items", "v6")
    schema_at(postgres_url, schema, 6)
    b = PostgresBackend.from_url(with_query(postgres_url, schema=schema))
    with b:
        b._ready = True  # write through version 6's function first
        old, lease = b.write(p, [make_put("old", _BIG, tags={"t": "1"}, mode=Mode.APPEND), make_put("l", b"L")]).records
        assert b.migrate() == 6 and b.migrate() == SCHEMA_VERSION
        assert b.get(p, ["old", "l"]) == [old, lease]
        kept, new = b.write(p, [_guard(lease), make_put("new", _BIG, tags={"t": "1"}, mode=Mode.APPEND)]).records
        assert kept == lease and new.seq > old.seq
        assert b.list(p, ListQuery(tags={"t": "1"})) == [new, old]
    stored = dict(_rows(postgres_url, f"SELECT name, pg_column_compression(value) FROM {schema}.records"))
    assert stored["old"] == "pglz"  # the column's default until version 7; existing values stay as written
    assert stored["new"] == ("lz4" if _lz4(postgres_url) else "pglz")


def test_values_are_compressed_with_lz4(postgres_url: str, schema: str) -> None:
    if not _lz4(postgres_url):
        pytest.skip("this PostgreSQL was built without LZ4: migration 7 keeps pglz")
    b = PostgresBackend.from_url(with_query(postgres_url, schema=schema))
    with b:
        b.migrate()
    sql = (
        "SELECT attcompression FROM pg_attribute "
        f"WHERE attrelid = '{schema}.records'::regclass AND attname IN ('value', 'tags') ORDER BY attname"
    )
    assert _rows(postgres_url, sql) == [("",), ("l",)]  # tags (small) keeps the default; value is LZ4


def test_writes_on_one_connection_reuse_its_cursor_and_dumpers(postgres_url: str, schema: str) -> None:
    """One cursor per connection, and the write statement one string object: psycopg keeps the cursor's
    Transformer (the dumpers it built for a write's parameters) from one write to the next."""
    p = Partition("u", "items", "cursor")
    conninfo = PostgresBackend.from_url(postgres_url).conninfo
    with psycopg.connect(conninfo, autocommit=True) as conn:
        b = PostgresBackend(conn, schema=schema)
        b.write(p, [make_put("a0", b"0", tags={"t": "0"})])
        cursor = conn._checkpointers_cursor  # type: ignore[attr-defined]
        transformer = cursor._tx
        for k in range(1, 4):
            b.write(p, [make_put(f"a{k}", b"1", tags={"t": "1"}, mode=Mode.APPEND)])
            assert conn._checkpointers_cursor is cursor and cursor._tx is transformer  # type: ignore[attr-defined]
        assert [r.name for r in b.get(p, ["a0", "a3"]) if r] == ["a0", "a3"]  # other statements share the cursor
        assert conn._checkpointers_cursor is cursor  # type: ignore[attr-defined]
