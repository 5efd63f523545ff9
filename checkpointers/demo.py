"""The crash demo: ``python -m checkpointers demo``.

A LangGraph countdown (a ``planner`` and a ``worker`` node in a loop, 20 down
to 0) runs in a child process that SIGKILLs itself right after the side
effect of step 12. A fresh process resumes the thread from the store and
finishes it. The worker's side effect goes to an *outbox* (a small SQLite
table) under an idempotency key derived from the work, ``<thread>:step:<N>``,
with ``INSERT OR IGNORE``.

What the report shows, and why: the side effect of the killed step happened
before that step's checkpoint was saved, so the step runs again after the
resume. The checkpointer makes every *finished* step durable (none of them
runs twice); the idempotency key makes the one unfinished step's side effect
apply once (the re-run is skipped as a duplicate). Together: 21 outputs, none
repeated, 21 outbox rows, 1 duplicate skipped.

The graph and the outbox are importable; only the command line lives in
``checkpointers/__main__.py``.
"""

from __future__ import annotations

import argparse
import operator
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, TypedDict
from urllib.parse import urlsplit

from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph

from .backends.sqlite import SqliteBackend
from .savers import Checkpointer

__all__ = ["Outbox", "countdown_graph", "main", "run_child", "run_demo"]

#: The user the demo's threads belong to.
DEMO_USER = "demo"


_OUTBOX_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS outbox (key TEXT PRIMARY KEY, value INTEGER, pid INTEGER)",
    "CREATE TABLE IF NOT EXISTS attempts"
    " (id INTEGER PRIMARY KEY, key TEXT, value INTEGER, pid INTEGER, applied INTEGER)",
    "CREATE TABLE IF NOT EXISTS runs"
    " (id INTEGER PRIMARY KEY, node TEXT, value INTEGER, pid INTEGER)",
)


class Outbox:
    """Side effects recorded once per idempotency key, in a small SQLite file.

    Every delivery attempt is logged (``attempts``) with the process that made
    it; the ``outbox`` table holds one row per key (``INSERT OR IGNORE``). The
    demo also logs every node execution (``runs``) to find re-runs.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(os.fspath(path), check_same_thread=False, timeout=30)
        with self._conn:
            for statement in _OUTBOX_SCHEMA:
                self._conn.execute(statement)

    def deliver(self, key: str, value: int) -> bool:
        """Apply the side effect for ``key`` unless it was applied before.

        Returns ``True`` if applied, ``False`` if skipped as a duplicate. The
        row and its attempt log commit in one transaction.
        """
        pid = os.getpid()
        with self._lock, self._conn:
            cur = self._conn.execute(
                "INSERT OR IGNORE INTO outbox (key, value, pid) VALUES (?, ?, ?)", (key, value, pid)
            )
            applied = cur.rowcount == 1
            self._conn.execute(
                "INSERT INTO attempts (key, value, pid, applied) VALUES (?, ?, ?, ?)",
                (key, value, pid, int(applied)),
            )
        return applied

    def rows(self) -> list[tuple[str, int, int]]:
        """``(key, value, pid)`` of every applied side effect, in insertion order."""
        return self._conn.execute("SELECT key, value, pid FROM outbox ORDER BY rowid").fetchall()

    def record_run(self, node: str, value: int) -> None:
        """Log that ``node`` ran for step ``value`` in this process."""
        with self._lock, self._conn:
            self._conn.execute(
                "INSERT INTO runs (node, value, pid) VALUES (?, ?, ?)", (node, value, os.getpid())
            )

    def runs(self) -> list[tuple[str, int, int]]:
        """``(node, value, pid)`` of every node execution, in order."""
        return self._conn.execute("SELECT node, value, pid FROM runs ORDER BY id").fetchall()

    def attempts(self) -> list[tuple[str, int, int, bool]]:
        """``(key, value, pid, applied)`` of every delivery attempt, in order."""
        rows = self._conn.execute("SELECT key, value, pid, applied FROM attempts ORDER BY id")
        return [(k, v, p, bool(a)) for k, v, p, a in rows]

    def close(self) -> None:
        """Close the connection."""
        self._conn.close()


class Countdown(TypedDict, total=False):
    """The countdown's state: where it started, the current number, the outputs."""

    start: int
    n: int
    outputs: Annotated[list[int], operator.add]


def step_key(thread_id: str, n: int) -> str:
    """The idempotency key of countdown step ``n``: ``<thread>:step:<n>``."""
    return f"{thread_id}:step:{n}"


def countdown_graph(checkpointer: Any, outbox: Outbox, crash_at: int | None = None) -> Any:
    """The countdown graph: ``planner`` picks the next number, ``worker`` acts on it.

    The worker delivers ``<thread>:step:<n>`` to ``outbox`` and, when ``n`` is
    ``crash_at``, SIGKILLs its own process right after that side effect.
    """
    def planner(state: Countdown) -> dict[str, Any]:
        n = state["start"] if "n" not in state else state["n"] - 1
        outbox.record_run("planner", n)
        return {"n": n}

    def worker(state: Countdown, config: RunnableConfig) -> dict[str, Any]:
        n = state["n"]
        outbox.record_run("worker", n)
        outbox.deliver(step_key(config["configurable"]["thread_id"], n), n)
        if n == crash_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return {"outputs": [n]}

    def route(state: Countdown) -> str:
        return "planner" if state["n"] > 0 else END

    builder = StateGraph(Countdown)
    builder.add_node("planner", planner)
    builder.add_node("worker", worker)
    builder.add_edge(START, "planner")
    builder.add_edge("planner", "worker")
    builder.add_conditional_edges("worker", route, ["planner", END])
    return builder.compile(checkpointer=checkpointer)


def _open(store: str) -> Checkpointer:
    return Checkpointer.from_url(store).for_user(DEMO_USER)


def _config(thread_id: str, start: int) -> RunnableConfig:
    # Two supersteps per number, plus slack: the default limit (25) is too low.
    return {"configurable": {"thread_id": thread_id}, "recursion_limit": 2 * start + 10}


def run_child(
    store: str, outbox_path: str, thread_id: str, start: int, crash_at: int | None
) -> None:
    """Run (``crash_at`` set) or resume (``crash_at`` None) the countdown thread."""
    saver = _open(store)
    outbox = Outbox(outbox_path)
    graph = countdown_graph(saver, outbox, crash_at)
    config = _config(thread_id, start)
    fresh = saver.get_tuple(config) is None
    # durability="sync": each superstep's checkpoint is saved before the next
    # starts, so the crash loses exactly the step that was running.
    graph.invoke({"start": start} if fresh else None, config, durability="sync")


@dataclass
class _Report:
    lines: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def line(self, text: str) -> None:
        self.lines.append(text)

    def check(self, ok: bool, what: str) -> None:
        if not ok:
            self.failures.append(what)


def _file_bytes(path: str | None) -> str | None:
    """``"<n> bytes (<file> <n> + <file>-wal <n>)"`` for a SQLite file, else ``None``."""
    if path is None:
        return None
    db = Path(path)
    sizes = {p.name: p.stat().st_size for p in (db, Path(f"{db}-wal")) if p.exists()}
    detail = " + ".join(f"{name} {size:,}" for name, size in sizes.items())
    return f"{sum(sizes.values()):,} bytes ({detail})"


def _last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1] if lines else ""


def _spawn(args: list[str]) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "checkpointers", "demo", "--child", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def run_demo(
    store: str | None = None, crash_at: int = 12, start: int = 20, keep: bool = False
) -> int:
    """Run the crash demo, print its report; return 0 on PASS, 1 on FAIL."""
    if not 0 <= crash_at <= start:
        raise ValueError(f"--crash-at must be between 0 and --start ({start}), got {crash_at}")
    if store is not None and urlsplit(store).scheme == "memory":
        raise ValueError("memory:// does not outlive a process: use sqlite:///, redis:// or s3://")
    workdir = Path(tempfile.mkdtemp(prefix="checkpointers-demo-"))
    try:
        store = store or f"sqlite:///{workdir / 'demo.db'}"
        report = _crash_and_resume(store, workdir, crash_at, start)
    finally:
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
    print("\n".join(report.lines))
    if report.failures:
        print("FAIL: " + "; ".join(report.failures))
        return 1
    print("PASS")
    return 0


def _crash_and_resume(store: str, workdir: Path, crash_at: int, start: int) -> _Report:
    thread_id = f"countdown-{uuid.uuid4().hex[:8]}"
    outbox_path = workdir / "outbox.db"
    common = ["--store", store, "--outbox", str(outbox_path), "--thread", thread_id]
    common += ["--start", str(start)]
    rep = _Report()
    rep.line(
        f"checkpointers crash demo: countdown {start}..0, "
        f"SIGKILL after step {crash_at}'s side effect"
    )
    rep.line(f"store:   {store}  (thread {thread_id!r}, user {DEMO_USER!r})")
    rep.line(f"outbox db: {outbox_path}")

    first = _spawn([*common, "--kill-at", str(crash_at)])
    killed = first.returncode == -signal.SIGKILL
    rep.line(f"run 1:   exit {first.returncode}" + ("  (SIGKILL, as planned)" if killed else ""))
    rep.check(
        killed,
        f"run 1 should die by SIGKILL, exited {first.returncode}: {_last_line(first.stderr)}",
    )
    second = _spawn(common)
    rep.line(f"run 2:   exit {second.returncode}  (fresh process, resumed from the store)")
    rep.check(second.returncode == 0, f"run 2 failed: {_last_line(second.stderr)}")

    outbox = Outbox(outbox_path)
    saver = _open(store)
    try:
        config = _config(thread_id, start)
        state = countdown_graph(saver, outbox).get_state(config).values
        outputs: list[int] = state.get("outputs", [])
        checkpoints = len(list(saver.list(config)))
        rows, attempts, runs = outbox.rows(), outbox.attempts(), outbox.runs()
        sqlite_path = saver.backend.path if isinstance(saver.backend, SqliteBackend) else None
    finally:
        outbox.close()
        saver.close()
    size = _file_bytes(sqlite_path)  # after close: the WAL is folded into the file

    expected = list(range(start, -1, -1))
    repeated = sorted({n for n in outputs if outputs.count(n) > 1})
    rep.line(f"outputs: {' '.join(map(str, outputs))}")
    rep.line(f"         {len(outputs)} values, repeated: {repeated or 'none'}")
    rep.check(outputs == expected, f"outputs should be {start}..0 in order")

    pids: dict[tuple[str, int], list[int]] = {}
    for node, value, pid in runs:
        seen = pids.setdefault((node, value), [])
        if pid not in seen:
            seen.append(pid)
    twice = [run for run, ps in pids.items() if len(ps) > 1]
    shown = ", ".join(
        f"{node} step {n} (pids {' then '.join(map(str, pids[node, n]))})" for node, n in twice
    )
    rep.line(f"ran in two processes: {shown or 'none'}")
    rep.check(
        twice == [("worker", crash_at)],
        f"only the worker of step {crash_at} should run in two processes, got {twice}",
    )

    applied = sum(1 for a in attempts if a[3])
    skipped = [key for key, _, _, ok in attempts if not ok]
    rep.line(
        f"outbox:  {applied} applied, {len(skipped)} skipped as duplicate"
        + (f" ({', '.join(skipped)})" if skipped else "")
        + f"; {len(rows)} rows"
    )
    rep.check(
        applied == len(rows) == start + 1, f"the outbox should hold {start + 1} rows, one per step"
    )
    rep.check(
        skipped == [step_key(thread_id, crash_at)],
        f"exactly the re-run of step {crash_at} should be skipped as a duplicate",
    )

    on_disk = f", {size} on disk" if size else ""
    rep.line(f"checkpoints: {checkpoints} stored for the thread{on_disk}")
    rep.check(checkpoints > 0, "no checkpoints found in the store")
    return rep


def main(argv: list[str] | None = None) -> int:
    """Parse the ``demo`` sub-command's arguments (after ``demo``) and run it."""
    parser = argparse.ArgumentParser(
        prog="python -m checkpointers demo",
        description="Crash a LangGraph countdown with SIGKILL and resume it from the store.",
    )
    parser.add_argument(
        "--store",
        help="store URL, any Checkpointer.from_url accepts (default: sqlite:///<tempdir>/demo.db)",
    )
    parser.add_argument(
        "--crash-at", type=int, default=12, help="step to SIGKILL after (default 12)"
    )
    parser.add_argument("--start", type=int, default=20, help="count down from N (default 20)")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (store, outbox)")
    # Internal: one run of the graph in a child process.
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--outbox", help=argparse.SUPPRESS)
    parser.add_argument("--thread", help=argparse.SUPPRESS)
    parser.add_argument("--kill-at", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.child:
        run_child(args.store, args.outbox, args.thread, args.start, args.kill_at)
        return 0
    if args.start < 0:
        parser.error("--start must be >= 0")
    try:
        return run_demo(args.store, args.crash_at, args.start, keep=args.keep)
    except ValueError as exc:
        parser.error(str(exc))
