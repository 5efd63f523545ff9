"""Disk space of a SQLite file around large deletes: file, WAL and free pages.

Not part of ``benchmarks.run`` (it measures bytes, not speed). Each scenario
opens a fresh file, writes ``--count`` records of ``--mb`` MB of random bytes
into one partition, deletes them, then writes the same amount again, and
prints the database file size, the WAL size and ``PRAGMA freelist_count``
after each phase, with the backend still open (as a long-running process
keeps it):

* ``drop``: :meth:`SqliteBackend.drop` of the partition;
* ``batch``: one write batch deleting every record;
* ``saver``: ``SqliteCheckpointer`` puts with one channel of ``--mb`` MB,
  then ``prune`` (keep the latest checkpoint) and ``delete_thread``.

``auto_vacuum`` is the file's mode (0 NONE, 1 FULL, 2 INCREMENTAL); the
times in parentheses are wall-clock and move a lot on a shared machine.

* ``pages`` (not in the default list): where the bytes of issue 15's shape go.
  ``--puts`` puts of 3 channels x 1 KB (one changing per put, ``put_writes``
  of 2 each, :class:`benchmarks.shape.ShapeThread`) through our
  ``Checkpointer`` on SQLite and through LangGraph's ``SqliteSaver``, then
  bytes at rest per put (file + WAL after a checkpoint, as benchmark (d)
  counts them) and, from SQLite's ``dbstat``, each table's and index's
  pages, cells, payload bytes, unused bytes and fill.

Run: ``python -m benchmarks.sqlite_disk`` (``--count 100 --mb 1`` by default);
``python -m benchmarks.sqlite_disk --only pages --puts 200``.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from checkpointers._flows import make_put
from checkpointers._names import Partition
from checkpointers.backends.base import Delete, Mode
from checkpointers.backends.sqlite import SqliteBackend

P = Partition("alice", "items", "big")


def sizes(path: Path) -> dict[str, int]:
    """File and WAL bytes, and the free and total pages the file's header reports."""
    wal = Path(str(path) + "-wal")
    with sqlite3.connect(path) as conn:  # a short read of the header (no checkpoint: others are open)
        (free,) = conn.execute("PRAGMA freelist_count").fetchone()
        (pages,) = conn.execute("PRAGMA page_count").fetchone()
        (mode,) = conn.execute("PRAGMA auto_vacuum").fetchone()
    conn.close()
    return {
        "file": path.stat().st_size,
        "wal": wal.stat().st_size if wal.exists() else 0,
        "free_pages": free,
        "pages": pages,
        "auto_vacuum": mode,
    }


def show(label: str, path: Path, seconds: float | None = None) -> dict[str, int]:
    s = sizes(path)
    took = "" if seconds is None else f"  ({seconds * 1000:,.0f} ms)"
    print(
        f"  {label:<26} file {s['file'] / 1e6:7.2f} MB  wal {s['wal'] / 1e6:7.2f} MB  "
        f"total {(s['file'] + s['wal']) / 1e6:7.2f} MB  free pages {s['free_pages']:>6,}  "
        f"auto_vacuum {s['auto_vacuum']}{took}"
    )
    return s


def timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def fill(backend: SqliteBackend, count: int, size: int, tag: str) -> None:
    for i in range(count):
        backend.write(P, [make_put(f"{tag}{i:04d}", os.urandom(size), mode=Mode.APPEND)])


def backend_scenario(kind: str, directory: Path, count: int, size: int) -> None:
    path = directory / f"{kind}.db"
    print(f"{kind}: {count} records of {size / 1e6:.1f} MB, then "
          f"{'drop()' if kind == 'drop' else 'one batch deleting them'}, then the same writes again")
    with SqliteBackend(path) as backend:
        show("after writes (peak)", path, timed(lambda: fill(backend, count, size, "a")))
        if kind == "drop":
            took = timed(lambda: backend.drop(P))
        else:
            took = timed(lambda: backend.write(P, [], [Delete(f"a{i:04d}") for i in range(count)]))
        show("after delete", path, took)
        show("after writing again", path, timed(lambda: fill(backend, count, size, "b")))
    show("after close", path)


def saver_scenario(directory: Path, count: int, size: int) -> None:
    from langgraph.checkpoint.base import empty_checkpoint
    from langgraph.checkpoint.base.id import uuid6

    from checkpointers.savers import SqliteCheckpointer

    path = directory / "saver.db"
    print(f"saver: {count} SqliteCheckpointer puts with a {size / 1e6:.1f} MB channel, "
          "then prune(keep_latest), delete_thread, the same puts again")

    def puts(saver: Any, thread: str) -> None:
        config: Any = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
        version = None
        for i in range(count):
            checkpoint = empty_checkpoint()
            checkpoint["id"] = str(uuid6(clock_seq=i))
            version = saver.get_next_version(version, None)
            checkpoint["channel_versions"] = {"payload": version}
            checkpoint["channel_values"] = {"payload": os.urandom(size // 2).hex()}
            config = saver.put(config, checkpoint, {"source": "loop", "step": i, "parents": {}},
                               {"payload": version})

    with SqliteCheckpointer.from_conn_string(str(path), max_item_bytes=4 * size) as saver:
        show("after puts (peak)", path, timed(lambda: puts(saver, "t1")))
        show("after prune(keep_latest)", path, timed(lambda: saver.prune(["t1"])))
        show("after delete_thread", path, timed(lambda: saver.delete_thread("t1")))
        show("after puts again", path, timed(lambda: puts(saver, "t2")))
    show("after close", path)


def dbstat(path: Path) -> list[tuple[str, int, int, int, int]]:
    """(table or index, pages, cells, payload bytes, unused bytes), largest first (after a WAL checkpoint)."""
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        rows = conn.execute(
            "SELECT name, COUNT(*), SUM(ncell), SUM(payload), SUM(unused) FROM dbstat "
            "GROUP BY name ORDER BY COUNT(*) DESC, name"
        ).fetchall()
    conn.close()
    return [tuple(r) for r in rows]


def pages_scenario(directory: Path, puts: int) -> None:
    from langgraph.checkpoint.sqlite import SqliteSaver

    from benchmarks.savers import sqlite_footprint
    from benchmarks.shape import ShapeThread
    from checkpointers._flows import run
    from checkpointers.savers import Checkpointer

    def ours(path: Path) -> None:
        with Checkpointer(SqliteBackend(path)) as saver:
            run(ShapeThread("bytes").puts(saver, puts), saver)

    def theirs(path: Path) -> None:
        conn = sqlite3.connect(path, check_same_thread=False)
        saver = SqliteSaver(conn)
        saver.setup()
        run(ShapeThread("bytes").puts(saver, puts), saver)
        conn.close()

    print(f"pages: {puts} puts of 3 channels x 1 KB (one changing), put_writes of 2 each")
    for label, write in (("ours", ours), ("SqliteSaver", theirs)):
        path = directory / f"pages-{label}.db"
        write(path)
        total = sqlite_footprint(path)
        print(f"  {label}: {total / puts / 1024:.2f} KiB per put ({total:,} bytes, {total // 4096:,} pages of 4 KiB)")
        for name, pages, cells, payload, unused in dbstat(path):
            fill = 1 - unused / (pages * 4096)
            print(f"    {name:<30} pages {pages:>5}  cells {cells:>6}  payload {payload:>9,}  "
                  f"unused {unused:>9,}  fill {fill:6.1%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=100)
    parser.add_argument("--mb", type=float, default=1.0)
    parser.add_argument("--only", default="drop,batch,saver", help="drop, batch, saver, pages")
    parser.add_argument("--puts", type=int, default=200, help="puts of the pages scenario")
    args = parser.parse_args()
    size = int(args.mb * (1 << 20))
    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.only.split(","):
            if kind == "saver":
                saver_scenario(Path(tmp), args.count, size)
            elif kind == "pages":
                pages_scenario(Path(tmp), args.puts)
            else:
                backend_scenario(kind, Path(tmp), args.count, size)


if __name__ == "__main__":
    main()
