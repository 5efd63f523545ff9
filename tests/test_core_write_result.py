"""WriteResult builds its instance dict in one call (two are built per write) and stays a frozen dataclass."""

from __future__ import annotations

import dataclasses

import pytest

from checkpointers.backends.base import Conflict, Record, WriteResult


def test_write_result_keeps_its_dataclass_behaviour() -> None:
    rec = Record("n", b"v", {}, "e", "d", 1)
    ok = WriteResult([rec])
    assert ok.records == [rec] and ok.conflict is None
    assert ok == WriteResult(records=[rec], conflict=None) and ok != WriteResult([])
    refused = WriteResult(records=[], conflict=Conflict(0, "n", rec))
    assert refused.conflict == Conflict(0, "n", rec) and refused.records == []
    assert dataclasses.replace(ok, conflict=refused.conflict).conflict is refused.conflict
    assert [f.name for f in dataclasses.fields(WriteResult)] == ["records", "conflict"]
    assert repr(ok).startswith("WriteResult(records=[Record(")
    with pytest.raises(dataclasses.FrozenInstanceError):
        ok.conflict = None  # type: ignore[misc]
