"""The write batch's array parameters (``_Texts`` / ``_Bytes``) reach the server as psycopg's own lists do."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from checkpointers.backends.postgres import _Bytes, _Texts


def _server_sees(conn: psycopg.Connection[Any], texts: list[Any], values: list[bytes]) -> tuple[Any, ...]:
    row = conn.execute("SELECT %b::text[], %b::bytea[], cardinality(%b::text[])", [texts, values, texts]).fetchone()
    assert row is not None
    return tuple(row)


@pytest.mark.parametrize("encoding", ["UTF8", "LATIN1"])
@pytest.mark.parametrize(
    ("texts", "values"),
    [
        ([], []),
        (["a"], [b""]),
        (["a", None, "", 'q"uo\\te,{x}', "é"], [b"\x00\x01", b"", b"\xff" * 300]),
        ([None, None], [b"x"]),
    ],
    ids=["empty", "one", "mixed", "nulls"],
)
def test_our_arrays_are_the_same_on_the_server_as_psycopgs_lists(
    postgres_url: str, encoding: str, texts: list[Any], values: list[bytes]
) -> None:
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"SET client_encoding = {encoding}")
        ours = _server_sees(conn, _Texts(texts), _Bytes(values))
        assert ours == _server_sees(conn, list(texts), list(values))
        assert ours == (texts, values, len(texts))


class _Unregistered(list):  # type: ignore[type-arg]
    """A list subclass no dumper is registered for: how ``_Texts`` looks to adapters customised before our import."""


def test_a_list_subclass_without_a_dumper_is_sent_as_a_list(postgres_url: str) -> None:
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        assert _server_sees(conn, _Unregistered(["a", None]), _Unregistered([b"b"])) == (["a", None], [b"b"], 2)
