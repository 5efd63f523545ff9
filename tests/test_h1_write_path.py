"""The write path's inlined shortcuts give exactly what the general code gives.

``Integrity.put`` builds its seal inline (not through ``seal``/``_message``),
``CheckpointLayout._regular_puts`` serializes one record without ``_packed``,
and ``ckpt_prefix`` remembers its namespaces: each is checked here against the
general code it stands for, so a shortcut that drifts fails.
"""

from __future__ import annotations

from typing import Any

import pytest

from checkpointers._integrity import Integrity
from checkpointers._names import Partition
from checkpointers._names import encode_component as enc
from checkpointers._saver_flows import ckpt_prefix
from checkpointers.backends.base import Mode

P = Partition("alice", "langgraph", "t\u00e9/1")
KEY = "k" * 32


@pytest.mark.parametrize("keys", [[], [KEY], [KEY, "o" * 32]], ids=["unkeyed", "keyed", "rotated"])
@pytest.mark.parametrize("tags", [None, {}, {"m.step": "1", "m.source": '"loop"', "z": "\u00e9"}], ids=repr)
def test_a_put_is_sealed_as_seal_seals_it(keys: list[str], tags: dict[str, str] | None) -> None:
    integrity = Integrity(keys)
    put = integrity.put(P, "c/_/_1", b"value", etag="e", tags=tags, mode=Mode.APPEND)
    sha = put.digest.split(".")[0]
    assert put.digest == integrity.seal(P, "c/_/_1", tags or {}, sha)
    assert put.tags == (tags or {}) and put.mode is Mode.APPEND and put.etag == "e"
    integrity.check(P, _record(put))  # passes
    with pytest.raises(Exception, match="seal"):
        integrity.check(Partition("bob", "langgraph", "t\u00e9/1"), _record(put))


def test_a_put_given_its_sha_seals_that_sha() -> None:
    integrity = Integrity([])
    put = integrity.put(P, "b/x", b"blob", etag="e", staged=True, sha="a" * 64)
    assert put.digest == integrity.seal(P, "b/x", {}, "a" * 64) and put.staged


def _record(put: Any) -> Any:
    from checkpointers._integrity import _as_record

    return _as_record(put)


@pytest.mark.parametrize("ns", ["", "a:1|b:2", "x" * 300, "\u00e9/."])
def test_ckpt_prefix_remembered_is_the_encoded_one(ns: str) -> None:
    assert ckpt_prefix(ns) == f"c/{enc(ns)}/" == ckpt_prefix(ns)
