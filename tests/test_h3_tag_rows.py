"""PostgreSQL schema migration 8: a tag row has two index entries, and a record's tag rows go by their full key.

The ``tags`` table's primary key is ``(pkey, k, v, name)`` (the index the
name-order tag reads walk) and ``(pkey, name, k)`` is gone, so ``write_batch``
deletes a replaced or deleted record's tag rows by their keys, cut out of the
record's own ``tags`` column (``tag_pairs``). These tests pin the layout, that
no tag row survives its record whatever its keys and values hold (JSON
escapes, quotes, backslashes, ``":"``, unicode), and that a version-7 schema's
tag rows, written by its own function, are found and replaced after migrating.
"""

from __future__ import annotations

import psycopg

from checkpointers._flows import make_put
from checkpointers._names import Partition
from checkpointers.backends.base import Delete, ListQuery, Mode
from checkpointers.backends.postgres import SCHEMA_VERSION, PostgresBackend, _text
from tests.plugins.postgres_plugin import with_query
from tests.test_postgres_backend import schema_at
from tests.test_postgres_writes import _rows
from tests.test_postgres_writes import schema as _schema_fixture

schema = _schema_fixture  # the fixture: a fresh schema, dropped after the test

#: Tags whose JSON forms hold every character tag_pairs must not cut at.
_NASTY = {
    'q"uote': 'a":"b',
    "back\\slash": "\\",
    "sep,}{": '","',
    "uni\u00e9\u2603": "\U0001f600\n\t\x00\x1f",
    "": "",
    "k": '\\"',
}


def _tag_rows(postgres_url: str, schema: str) -> set[tuple[str, str, str]]:
    return {(n, k, v) for n, k, v in _rows(postgres_url, f"SELECT name, k, v FROM {schema}.tags")}


def _expected(name: str, tags: dict[str, str]) -> set[tuple[str, str, str]]:
    return {(name, _text(k), _text(v)) for k, v in tags.items()}


def test_a_tag_row_has_two_index_entries(postgres_url: str, schema: str) -> None:
    with PostgresBackend.from_url(with_query(postgres_url, schema=schema)) as b:
        b.migrate()
    indexes = _rows(
        postgres_url,
        "SELECT i.relname, ix.indisunique, ix.indisprimary, pg_get_indexdef(ix.indexrelid) FROM pg_index AS ix "
        "JOIN pg_class AS i ON i.oid = ix.indexrelid WHERE ix.indrelid = %s::regclass ORDER BY i.relname",
        f"{schema}.tags",
    )
    assert [(n, u, p) for n, u, p, _ in indexes] == [("tags_kv_seq", False, False), ("tags_pkey", True, True)]
    assert indexes[1][3].endswith("(pkey, k, v, name)")


def test_no_tag_row_outlives_its_record_whatever_the_tags_hold(postgres_url: str, schema: str) -> None:
    p, other = Partition("u", "items", "nasty"), Partition("u", "items", "other")
    with PostgresBackend.from_url(with_query(postgres_url, schema=schema)) as b:
        (r1,) = b.write(p, [make_put("r1", b"1", tags=_NASTY)]).records
        b.write(p, [make_put("r2", b"2", tags=_NASTY), make_put("r3", b"3", tags={"t": "x"})])
        b.write(other, [make_put("r1", b"1", tags=_NASTY)])  # same names and tags in another partition: kept
        expected = _expected("r1", _NASTY) | _expected("r2", _NASTY) | _expected("r3", {"t": "x"})
        assert _tag_rows(postgres_url, schema) == expected | _expected("r1", _NASTY)  # set: other's rows coincide
        for k, v in _NASTY.items():
            assert [r.name for r in b.list(p, ListQuery(tags={k: v}))] == ["r1", "r2"]
        # replaced (if_match, then upsert): the old tag rows go, the new ones come
        (r1b,) = b.write(p, [make_put("r1", b"1b", tags={'q"uote': "new"}, mode=Mode.IF_MATCH,
                                      if_match=r1.etag)]).records
        b.write(p, [make_put("r2", b"2b")])  # upsert without tags
        for k, v in _NASTY.items():
            assert b.list(p, ListQuery(tags={k: v})) == []
        assert b.list(p, ListQuery(tags={'q"uote': "new"})) == [r1b]
        # deleted (with and without if_match): their tag rows go
        assert b.write(p, [], [Delete("r1", r1b.etag), Delete("r3")]).conflict is None
        assert b.list(p, ListQuery(tags={"t": "x"})) == [] and b.list(p, ListQuery(tags={'q"uote': "new"})) == []
        assert [r.name for r in b.list(other, ListQuery(tags={"back\\slash": "\\"}))] == ["r1"]
    per_partition = _rows(postgres_url, f"SELECT pkey, count(*) FROM {schema}.tags GROUP BY pkey")
    assert per_partition == [(other.key, len(_NASTY))]


def test_tag_pairs_cuts_the_tags_json_into_the_tag_rows_keys(postgres_url: str, schema: str) -> None:
    from checkpointers.backends.base import tags_json

    with PostgresBackend.from_url(with_query(postgres_url, schema=schema)) as b:
        b.migrate()
    pairs = _rows(postgres_url, f"SELECT k, v FROM {schema}.tag_pairs(%s)", tags_json(_NASTY))
    assert set(pairs) == {(_text(k), _text(v)) for k, v in _NASTY.items()} and len(pairs) == len(_NASTY)
    assert _rows(postgres_url, f"SELECT count(*) FROM {schema}.tag_pairs('{{}}')") == [(0,)]


def test_a_version_7_schema_migrates_to_8_with_its_tag_rows(postgres_url: str, schema: str) -> None:
    p = Partition("u", "items", "v7")
    schema_at(postgres_url, schema, 7)
    with PostgresBackend.from_url(with_query(postgres_url, schema=schema)) as b:
        b._ready = True  # written by version 7's function first
        a, c = b.write(p, [make_put("a", b"A", tags=_NASTY), make_put("c", b"C", tags={"t": "1"})]).records
        assert b.migrate() == 7 and b.migrate() == SCHEMA_VERSION == 8
        assert _tag_rows(postgres_url, schema) == _expected("a", _NASTY) | _expected("c", {"t": "1"})
        assert b.list(p, ListQuery(tags={"t": "1"})) == [c]
        (a2,) = b.write(p, [make_put("a", b"A2", tags={"t": "1"})]).records  # replaces a version-7 record
        assert b.write(p, [], [Delete("c")]).conflict is None
        assert b.list(p, ListQuery(tags={"t": "1"})) == [a2]
        assert _tag_rows(postgres_url, schema) == _expected("a", {"t": "1"})


def test_removing_a_records_tag_rows_reads_no_other_tag_rows(postgres_url: str, schema: str) -> None:
    """In a partition of 6,000 tag rows, never analyzed: replacing one tagged record and deleting another
    read a few pages of the tags index (each tag row looked up by its full key), never the partition's."""
    p = Partition("u", "items", "many")
    with PostgresBackend.from_url(with_query(postgres_url, schema=schema)) as b:
        for i in range(0, 3000, 250):
            b.write(p, [make_put(f"r{j:05d}", b"x", tags={"t": str(j % 7), "s": "loop"}) for j in range(i, i + 250)])
    pages = (
        "SELECT pg_stat_get_xact_blocks_fetched(%s::regclass) + pg_stat_get_xact_blocks_fetched(%s::regclass)"
    )
    indexes = (f"{schema}.tags_pkey", f"{schema}.tags_kv_seq")
    with psycopg.connect(postgres_url) as conn:  # one transaction: the operations run in savepoints of it
        conn.execute("SET plan_cache_mode = force_generic_plan")  # as the statement's plan after five calls
        b = PostgresBackend(conn, schema=schema)
        b._ready = True
        (before,) = conn.execute(pages, indexes).fetchone()  # type: ignore[misc]
        b.write(p, [make_put("r01234", b"y", tags={"t": "new"})])
        assert b.write(p, [], [Delete("r02345")]).conflict is None
        (after,) = conn.execute(pages, indexes).fetchone()  # type: ignore[misc]
        assert [r.name for r in b.list(p, ListQuery(tags={"t": "new"}))] == ["r01234"]
        assert b.list(p, ListQuery(tags={"s": "loop"}, limit=3000)).__len__() == 2998
        conn.rollback()
    assert after - before <= 30, f"{after - before} index pages read"  # walking the partition's tags: 140
