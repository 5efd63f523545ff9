"""Measure the command line on stores of N checkpoints (numbers in docs/cli.md).

Not a test (pytest does not collect it). Two steps, each in a process of its own::

    python -m tests.measure_cli fill ours sqlite:////tmp/m/ours.db --threads 100 --per-thread 100
    python -m tests.measure_cli fill sqlitesaver /tmp/m/lg.db --threads 100 --per-thread 100
    python -m tests.measure_cli run migrate sqlite:////tmp/m/ours.db redis://127.0.0.1:6379/0?prefix=m --user u

``fill`` writes ``threads x per-thread`` checkpoints (each with a 300-byte
note, a counter and one pending write) through the saver's ``put`` and
``put_writes``. ``run`` runs one ``checkpointers`` command in this process
and prints its exit code, wall time and the process's peak resident memory
(``ru_maxrss``), so the peak of a run on 1,000 and on 10,000 checkpoints can
be compared: flat memory means the same peak.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from typing import Any

from langgraph.checkpoint.base import BaseCheckpointSaver, create_checkpoint, empty_checkpoint


def _fill(saver: BaseCheckpointSaver[Any], threads: int, per_thread: int) -> int:
    count = 0
    for t in range(threads):
        config: Any = {"configurable": {"thread_id": f"thread-{t:05d}", "checkpoint_ns": ""}}
        checkpoint = empty_checkpoint()
        for step in range(per_thread):
            checkpoint = create_checkpoint(checkpoint, None, step)
            checkpoint["channel_values"] = {"n": step, "note": f"{t}:{step}:" + "x" * 300}
            checkpoint["channel_versions"] = {"n": f"{step + 1:032}.0", "note": f"{step + 1:032}.0"}
            versions = dict(checkpoint["channel_versions"])
            config = saver.put(config, checkpoint, {"source": "loop", "step": step}, versions)
            saver.put_writes(config, [("n", step + 1)], f"task-{step}", f"~__pregel_pull, step{step}")
            count += 1
    return count


def fill(kind: str, where: str, threads: int, per_thread: int) -> int:
    """Write the checkpoints into our store (``ours URL``) or a SqliteSaver file (``sqlitesaver PATH``)."""
    if kind == "ours":
        from checkpointers.savers import Checkpointer

        with Checkpointer.from_url(where) as saver:
            return _fill(saver.for_user("u"), threads, per_thread)
    import sqlite3

    from langgraph.checkpoint.sqlite import SqliteSaver

    conn = sqlite3.connect(where, check_same_thread=False)
    try:
        saver = SqliteSaver(conn)
        saver.setup()
        return _fill(saver, threads, per_thread)
    finally:
        conn.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="step", required=True)
    f = sub.add_parser("fill")
    f.add_argument("kind", choices=["ours", "sqlitesaver"])
    f.add_argument("where")
    f.add_argument("--threads", type=int, default=100)
    f.add_argument("--per-thread", type=int, default=100)
    r = sub.add_parser("run")
    r.add_argument("args", nargs=argparse.REMAINDER)
    ns = parser.parse_args()
    start = time.perf_counter()
    if ns.step == "fill":
        n = fill(ns.kind, ns.where, ns.threads, ns.per_thread)
        print(f"filled {n} checkpoints in {time.perf_counter() - start:.1f} s")
        return 0
    from checkpointers.cli import main as cli

    code = cli([a for a in ns.args if a != "--"] + ["--quiet"])
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"exit {code}, {time.perf_counter() - start:.1f} s, peak RSS {peak:.0f} MiB", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
