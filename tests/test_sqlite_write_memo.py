"""The SQLite writer's memo of partition seqs (no read before appending new names).

A writer connection remembers, per partition it wrote, the seq to count up
from, and trusts it only while ``PRAGMA data_version`` says no other
connection has committed since. These checks put a second backend (its own
writer connection, as another process would have) between the first one's
writes, and check that every rule of a write still holds: seqs above all
earlier ones, append no-ops and conflicts, atomic refusal, the partition row.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from checkpointers._flows import make_put, new_etag
from checkpointers._names import Partition
from checkpointers.backends.base import Delete, ListQuery, Mode, Put, Record
from checkpointers.backends.sqlite import SqliteBackend

P = Partition("alice", "langgraph", "t1")
Q = Partition("alice", "langgraph", "t2")


def _append(backend: SqliteBackend, p: Partition, name: str, value: bytes = b"v") -> int:
    """Append one record; return its seq."""
    result = backend.write(p, [make_put(name, value, mode=Mode.APPEND)])
    assert result.conflict is None
    return result.records[0].seq


def _seqs(backend: SqliteBackend, p: Partition) -> dict[str, int]:
    return {r.name: r.seq for r in backend.list(p, ListQuery(values=False))}


@pytest.fixture
def pair(tmp_path: Path):  # type: ignore[no-untyped-def]
    path = tmp_path / "memo.db"
    a, b = SqliteBackend(path), SqliteBackend(path)
    yield a, b
    a.close()
    b.close()


def test_appends_count_up_from_memo_and_from_other_writers(pair) -> None:  # type: ignore[no-untyped-def]
    a, b = pair
    seen = [_append(a, P, f"a{i}") for i in range(3)]  # a's memo is warm from here on
    seen.append(_append(b, P, "b0"))  # another connection writes: a's memo is stale
    seen += [_append(a, P, f"a{i}") for i in range(3, 6)]
    assert seen == sorted(seen) and len(set(seen)) == len(seen)
    assert _seqs(a, P) == _seqs(b, P)


def test_append_of_an_existing_name_is_a_noop_or_a_conflict_with_a_warm_memo(pair) -> None:  # type: ignore[no-untyped-def]
    a, b = pair
    first = _append(a, P, "x", b"one")
    _append(a, P, "y")
    # the same bytes again: a no-op that returns the stored record and seq
    again = a.write(P, [make_put("x", b"one", mode=Mode.APPEND)])
    assert again.conflict is None and again.records[0].seq == first
    # other bytes, batched with a new name: refused as a whole, nothing written
    refused = a.write(P, [make_put("z", b"new", mode=Mode.APPEND), make_put("x", b"two", mode=Mode.APPEND)])
    assert refused.conflict is not None and refused.conflict.index == 1
    assert "z" not in _seqs(b, P)
    # a name another connection wrote meanwhile is found too
    _append(b, P, "w", b"theirs")
    clash = a.write(P, [make_put("w", b"ours", mode=Mode.APPEND)])
    assert clash.conflict is not None and clash.conflict.existing is not None
    after = _append(a, P, "v")
    assert after > max(_seqs(b, P)[n] for n in ("x", "y", "w"))


def test_drop_by_another_writer_re_registers_the_partition(pair) -> None:  # type: ignore[no-untyped-def]
    a, b = pair
    top = max(_append(a, P, f"a{i}") for i in range(3))
    assert b.drop(P) == 3
    assert a.partitions("alice", "langgraph") == []
    seq = _append(a, P, "again")
    assert seq > top  # seqs of dropped records are never handed out again
    assert a.partitions("alice", "langgraph") == ["t1"]
    assert b.partitions("alice", "langgraph") == ["t1"]


def test_own_drop_and_deletes_forget_the_memo(pair) -> None:  # type: ignore[no-untyped-def]
    a, _ = pair
    _append(a, P, "p0")
    q_top = max(_append(a, Q, f"q{i}") for i in range(5))
    a.write(Q, [], [Delete(f"q{i}") for i in range(5)])  # raises seq_counter to q_top
    assert _append(a, P, "p1") > q_top
    assert a.drop(P) == 2
    assert _append(a, P, "p2") > q_top
    assert a.partitions("alice", "langgraph") == ["t1"]


def test_delete_by_another_writer_raises_seqs_everywhere(pair) -> None:  # type: ignore[no-untyped-def]
    a, b = pair
    _append(a, P, "p0")
    q_top = max(_append(b, Q, f"q{i}") for i in range(5))
    b.write(Q, [], [Delete(f"q{i}") for i in range(5)])
    assert _append(a, P, "p1") > q_top


def test_file_written_by_a_plain_connection_meanwhile(tmp_path: Path) -> None:
    """Any other connection counts, not only this library's (sqlite3 CLI, a migration...)."""
    path = tmp_path / "plain.db"
    with SqliteBackend(path) as a:
        _append(a, P, "p0")
        with sqlite3.connect(path) as plain:
            plain.execute("UPDATE seq_counter SET seq = 1000 WHERE id = 0")
        assert _append(a, P, "p1") > 1000


def test_single_untagged_appends_mixed_with_tagged_batches(pair) -> None:  # type: ignore[no-untyped-def]
    """Appends of one record and of a tagged record, from two writers, interleaved."""
    a, b = pair
    assert _append(a, P, "w0") == 1  # no partitions row yet: the checked path registers it
    assert a.partitions("alice", "langgraph") == ["t1"]
    seqs = [_append(a, P, "w1")]
    tagged = a.write(P, [make_put("c1", b"c", tags={"m.step": "1"}, mode=Mode.APPEND)])  # memo path
    seqs.append(tagged.records[0].seq)
    seqs.append(_append(b, P, "w2"))  # the other writer
    seqs.append(_append(a, P, "w3"))
    seqs.append(a.write(P, [make_put("c2", b"c", tags={"m.step": "2"}, mode=Mode.APPEND)]).records[0].seq)
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs) and seqs[0] == 2
    assert a.list(P, ListQuery(tags={"m.step": "2"}))[0].name == "c2"
    # the same bytes again: a no-op keeping its seq; other bytes: a conflict
    noop = a.write(P, [make_put("w1", b"v", mode=Mode.APPEND)])
    assert noop.conflict is None and noop.records[0].seq == seqs[0]
    assert a.write(P, [make_put("w1", b"other", mode=Mode.APPEND)]).conflict is not None
    # seqs of deleted records (seq_counter) are never handed out again
    top = _append(a, Q, "q0")
    a.write(Q, [], [Delete("q0")])
    b.write(Q, [], [Delete("nothing")])
    assert _append(b, P, "w4") > max(top, *seqs)


def _sealed(name: str, value: bytes, digest: str) -> Put:
    """An append whose digest carries a seal after the content digest (``<sha256>.<seal>``)."""
    return Put(name, value, digest, new_etag(), {}, Mode.APPEND)


def test_appends_compare_content_digests_not_seals(pair) -> None:  # type: ignore[no-untyped-def]
    """``abc.x`` then ``abc.y``: the same content under another seal, a no-op; ``abd.x``: a conflict.

    On the warm-memo path (no read before the insert), on the checked path,
    batched with a new name, and from the other writer.
    """
    a, b = pair
    _append(a, P, "warm")  # a's memo is warm: the next append is tried without reading
    stored = a.write(P, [_sealed("x", b"one", "abc.x")]).records[0]
    for writer in (a, b, a):
        again = writer.write(P, [_sealed("x", b"one", "abc.y")])
        assert again.conflict is None
        assert again.records[0] == stored  # the stored record, its seal and seq unchanged
        batch = writer.write(P, [_sealed(f"new-{id(again)}", b"n", "fff.y"), _sealed("x", b"one", "abc")])
        assert batch.conflict is None and batch.records[1] == stored
        for other in ("abd.x", "abd", "abcd.x", "ab.x"):
            clash = writer.write(P, [_sealed("x", b"two", other)])
            assert clash.conflict is not None and clash.conflict.existing is not None
            assert clash.conflict.existing.digest == "abc.x"
    assert a.get(P, ["x"])[0] == stored


def _reput(record: Record) -> Put:
    """The lease guard's re-put: the stored record under its own etag, conditioned on it."""
    return Put(record.name, record.value, record.digest, record.etag, dict(record.tags), Mode.IF_MATCH, record.etag)


def _reads(backend: SqliteBackend) -> list[str]:
    """The statements the backend's writer connection runs from now on."""
    statements: list[str] = []
    assert backend._wconn is not None
    backend._wconn.set_trace_callback(statements.append)
    return statements


def test_an_unchanged_reput_the_memo_knows_is_written_without_reading(pair) -> None:  # type: ignore[no-untyped-def]
    """A batch of new names plus an unchanged IF_MATCH re-put of a record this writer wrote: no read.

    The condition is judged from the memo only while no other connection has
    committed; a lease moved by another writer meanwhile still refuses the batch.
    """
    a, b = pair
    (lease,) = a.write(P, [make_put("lease", b"vacant", mode=Mode.CREATE)]).records
    traced = _reads(a)
    done = a.write(P, [_reput(lease), make_put("c1", b"c", mode=Mode.APPEND)])
    assert done.conflict is None and done.records[0] == lease and done.records[1].seq == lease.seq + 1
    assert not [s for s in traced if s.lstrip().upper().startswith("SELECT")], traced
    # another writer takes the lease: the stale re-put is refused, nothing of its batch written
    (taken,) = b.write(P, [make_put("lease", b"bob", mode=Mode.IF_MATCH, if_match=lease.etag)]).records
    refused = a.write(P, [_reput(lease), make_put("c2", b"c", mode=Mode.APPEND)])
    assert refused.conflict is not None and refused.conflict.index == 0
    assert refused.conflict.existing is not None and refused.conflict.existing.etag == taken.etag
    assert "c2" not in _seqs(b, P)
    # a re-put of what is stored now goes through (read, then remembered), and a changed one is a rewrite
    assert a.write(P, [_reput(taken), make_put("c3", b"c", mode=Mode.APPEND)]).conflict is None
    assert a.write(P, [_reput(taken), make_put("c4", b"c", mode=Mode.APPEND)]).conflict is None
    # the memo knows the tags too: the same etag and unsealed digest with other tags is a rewrite
    (tagged, _) = a.write(P, [Put("lease", taken.value, taken.digest, taken.etag, {"t": "1"}, Mode.IF_MATCH,
                                  taken.etag), make_put("c4b", b"c", mode=Mode.APPEND)]).records
    assert tagged.seq > taken.seq and b.list(P, ListQuery(tags={"t": "1"}))[0].name == "lease"
    taken = tagged
    other = Put("lease", b"carol", taken.digest, "e-new", {}, Mode.IF_MATCH, taken.etag)  # same digest, new etag
    (rewritten, _) = a.write(P, [other, make_put("c5", b"c", mode=Mode.APPEND)]).records
    assert rewritten.etag == "e-new" and b.get(P, ["lease"])[0].etag == "e-new"  # type: ignore[union-attr]
    assert _seqs(a, P) == _seqs(b, P)
