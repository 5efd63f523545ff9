"""Store URLs: one parser for boolean options, one opener for every scheme."""

from __future__ import annotations

import pytest

from checkpointers.backends import open_backend, url_flag


@pytest.mark.parametrize("value,expected", [("true", True), ("Yes", True), ("1", True), ("off", False), ("0", False)])
def test_url_flag_reads_the_usual_spellings(value: str, expected: bool) -> None:
    assert url_flag("cluster", value) is expected


@pytest.mark.parametrize("value", ["ture", "", "2", "maybe"])
def test_url_flag_refuses_anything_else(value: str) -> None:
    with pytest.raises(ValueError, match="cluster"):
        url_flag("cluster", value)


def test_unknown_scheme_names_the_supported_ones() -> None:
    with pytest.raises(ValueError, match="sqlite:///.*postgresql://"):
        open_backend("mysql://localhost/db")


def test_s3_url_refuses_a_misspelled_flag() -> None:
    with pytest.raises(ValueError, match="conditional_writes"):
        open_backend("s3://bucket/prefix?conditional_writes=nope")


@pytest.mark.parametrize("scheme", ["postgresql", "postgres"])
def test_postgres_url_splits_our_options_from_libpq_ones(scheme: str) -> None:
    # nothing connects before the first operation, so no server is needed here
    url = f"{scheme}://me@db.example:6432/app?schema=agents&sslmode=require&max_size=3&pipeline=off&timeout=2.5"
    backend = open_backend(url)
    try:
        assert backend.kind == "postgres"
        assert (backend.schema, backend.max_size, backend.pipeline, backend.timeout) == ("agents", 3, False, 2.5)  # type: ignore[attr-defined]
        assert backend.conninfo == f"{scheme}://me@db.example:6432/app?sslmode=require"  # type: ignore[attr-defined]
    finally:
        backend.close()


@pytest.mark.parametrize("schema", ["Agents", "1st", "a;drop", "a" * 64, ""])
def test_postgres_url_refuses_a_schema_it_would_have_to_quote(schema: str) -> None:
    with pytest.raises(ValueError, match="schema"):
        open_backend(f"postgresql://localhost/db?schema={schema}")


def test_postgres_url_refuses_a_misspelled_flag() -> None:
    with pytest.raises(ValueError, match="pipeline"):
        open_backend("postgresql://localhost/db?pipeline=nope")
