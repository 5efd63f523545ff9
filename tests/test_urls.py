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
    with pytest.raises(ValueError, match="sqlite:///"):
        open_backend("postgres://localhost/db")


def test_s3_url_refuses_a_misspelled_flag() -> None:
    with pytest.raises(ValueError, match="conditional_writes"):
        open_backend("s3://bucket/prefix?conditional_writes=nope")
