"""The examples in docstrings run, so they cannot rot."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "checkpointers._names",
    "checkpointers.store",
    "checkpointers.savers",
    "checkpointers.backends.sqlite",
    "checkpointers._integrity",
    "checkpointers._serde",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)  # examples that open files write them here
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0, f"{name} has no examples"
    assert result.failed == 0
