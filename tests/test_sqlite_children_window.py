"""SQLite children listings (``ListQuery(depth=..., children=True)``) against the memory reference.

A name-ordered children listing without tags is one range scan from the
first pick to the last one's children (``_window_sql``), sorted out in
Python (``_windowed``): these checks throw name trees at it whose names sort
in the awkward places (``1-a`` and ``1%b`` between ``1`` and ``1/...``,
orphan children, names one level up or down) and compare every query with
:class:`MemoryBackend`'s, which reads everything and picks in Python.
"""

from __future__ import annotations

import sqlite3
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from checkpointers._flows import make_put
from checkpointers._names import Partition
from checkpointers.backends.base import ListQuery
from checkpointers.backends.memory import MemoryBackend
from checkpointers.backends.sqlite import SqliteBackend

P = Partition("alice", "langgraph", "t")

#: A name tree whose names sort in the awkward places: "%" "-" "." sort below "/", "0" above it,
#: so "c/1%b", "c/1-a" and "c/1.c" come between "c/1" and its children; "c/3/a" is an orphan.
_UNIVERSE = [
    "c/1", "c/1%b", "c/1-a", "c/1.c", "c/10", "c/2", "c/1/a", "c/1/a/b", "c/1/b/c", "c/1%b/a",
    "c/1-a/w", "c/1-a/w/x", "c/10/a", "c/2/a", "c/3/a", "c/1/", "d", "d/e",
]
_BOUND = st.sampled_from([None, None, None, None, "c/1", "c/1-a", "c/1/", "c/10", "c/2", "c/1%b/a"])


@st.composite
def _queries(draw: st.DrawFn) -> ListQuery:
    return ListQuery(
        prefix=draw(st.sampled_from(["c/", "c/", "c/", "c/1", "c/1/", "c/1-a/", ""])),
        descending=draw(st.booleans()),
        limit=draw(st.sampled_from([None, 1, 2, 3])),
        start=draw(_BOUND),
        stop=draw(_BOUND),
        values=draw(st.booleans()),
        depth=draw(st.sampled_from([0, 0, 1, 2])),
        children=True,
    )


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(names=st.sets(st.sampled_from(_UNIVERSE), min_size=1), queries=st.lists(_queries(), min_size=1, max_size=12))
def test_children_listings_match_the_memory_reference(names: set[str], queries: list[ListQuery]) -> None:
    reference = MemoryBackend()
    with tempfile.TemporaryDirectory() as tmp, SqliteBackend(Path(tmp) / "w.db") as backend:
        puts = [make_put(n, n.encode()) for n in sorted(names)]
        for b in (backend, reference):
            b.write(P, puts)
        for query in queries:
            got, want = backend.list(P, query), reference.list(P, query)
            assert [r.name for r in got] == [r.name for r in want], query
            assert got == want, query


def test_a_pick_that_extends_another_does_not_cut_off_its_children(sqlite_backend: SqliteBackend) -> None:
    # "c/1%b" sorts between "c/1" and "c/1/a": the window must reach past the last pick
    names = ["c/1", "c/1%b", "c/1/a", "c/1/b/c", "c/1-a/w", "c/2"]
    sqlite_backend.write(P, [make_put(n, n.encode()) for n in names])
    got = sqlite_backend.list(P, ListQuery(prefix="c/", depth=0, limit=2, children=True))
    assert [r.name for r in got] == ["c/1", "c/1/a", "c/1/b/c", "c/1%b"]
    got = sqlite_backend.list(P, ListQuery(prefix="c/", depth=0, limit=2, descending=True, children=True))
    assert [r.name for r in got] == ["c/2", "c/1%b"]  # "c/1-a" is not stored: its child is nobody's


def test_a_scan_stopped_early_holds_no_read_snapshot(tmp_path: Path) -> None:
    # the newest pick is found after two rows of many: the statement must be ended there, or its
    # snapshot would keep every later commit in the WAL (a TRUNCATE checkpoint could not finish)
    path = tmp_path / "s.db"
    with SqliteBackend(path) as backend:
        backend.write(P, [make_put(f"c/{i:04d}", b"x" * 100) for i in range(200)])
        (newest,) = backend.list(P, ListQuery(prefix="c/", depth=0, descending=True, limit=1, children=True))
        assert newest.name == "c/0199"
        backend.write(P, [make_put("c/0200", b"y")])
        with sqlite3.connect(path) as other:
            busy, _, _ = other.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        other.close()
        assert busy == 0, "a reader still holds a snapshot"


def test_every_bound_and_limit_on_the_whole_tree_matches_the_memory_reference(sqlite_backend: SqliteBackend) -> None:
    # all of _UNIVERSE at once, every start/stop of _BOUND's: a stop that extends a pick ("c/1/",
    # "c/1-a", "c/1%b/a") must still bring that pick's children, which sort above the stop
    reference = MemoryBackend()
    puts = [make_put(n, n.encode()) for n in _UNIVERSE]
    for b in (sqlite_backend, reference):
        b.write(P, puts)
    bounds = [None, "c/1", "c/1-a", "c/1/", "c/1/a/", "c/10", "c/2", "c/1%b/a", "c/1.c"]
    for prefix in ("c/", "c/1", ""):
        for depth in (0, 1):
            for stop in bounds:
                for start in (None, "c/1-a", "c/1/"):
                    for descending in (False, True):
                        for limit in (None, 1, 2):
                            query = ListQuery(prefix=prefix, depth=depth, start=start, stop=stop,
                                              descending=descending, limit=limit, children=True)
                            got = sqlite_backend.list(P, query)
                            assert [r.name for r in got] == [r.name for r in reference.list(P, query)], query


def _steps(backend: SqliteBackend, query: ListQuery) -> int:
    """SQLite virtual machine steps (in units of 10) that one listing takes on the read connection."""
    conn = backend._wconn or backend._idle[-1]  # the writer reads while free
    count = [0]

    def tick() -> int:
        count[0] += 1
        return 0

    conn.set_progress_handler(tick, 10)
    try:
        backend.list(P, query)
    finally:
        conn.set_progress_handler(None, 0)
    return count[0]


@pytest.mark.parametrize("children", [False, True])
def test_a_listing_before_a_name_does_not_walk_the_names_above_it(
    sqlite_backend: SqliteBackend, children: bool
) -> None:
    # "before" and a prefix are two upper bounds on name: folded into one, the index range starts
    # at "before" (SQLite ranges on one bound and checks the other row by row)
    names = [f"c/x/{i:04d}" for i in range(400)]
    sqlite_backend.write(P, [make_put(n, b"v") for n in names])

    def before(name: str) -> ListQuery:
        return ListQuery(prefix="c/x/", depth=0, descending=True, limit=1, stop=name, children=children)

    assert [r.name for r in sqlite_backend.list(P, before(names[1]))] == [names[0]]
    near_top, near_bottom = _steps(sqlite_backend, before(names[-1])), _steps(sqlite_backend, before(names[1]))
    assert near_bottom < 2 * near_top + 10, (near_top, near_bottom)
