"""The crash demo: ``python -m checkpointers demo`` (``--fleet``: the lease demo).

A LangGraph countdown (a ``planner`` and a ``worker`` node in a loop, 20 down
to 0) runs in a child process that SIGKILLs itself in step 12, **between** the
worker's side effect and its record. A fresh process resumes the thread from
the store and finishes it. The side effect is a call to a downstream service
(a :class:`Ledger`: a table in a second SQLite file that, like most real
services, does not deduplicate); the worker makes it inside the journal of
:mod:`checkpointers.effects`::

    with saver.effect(config, "deliver", reconcile=ledger.find) as fx:
        if not fx.done:
            fx.record(ledger.deliver(fx.key, n))

What the report shows, and why: the checkpointer makes every *finished* step
durable (none of them runs again); the killed step runs again after the
resume, with the same task id, so it finds its own journal: an intent without
an outcome. The journal cannot know whether the call happened (it did: the
process died after it), so it asks the service by the effect's idempotency
key (``reconcile=``), which says "already applied": the step records that
answer and does not call again. Together: 21 outputs, none repeated, 21
calls in the ledger, no duplicate key, one effect reconciled. (Without
``reconcile=``, run 2 would stop with ``UnknownOutcomeError`` rather than
guess.)

The graph and the ledger are importable; only the command line lives in
``checkpointers/__main__.py``.
"""

from __future__ import annotations

import argparse
import importlib
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
from .effects import NOT_APPLIED, EffectInfo, Journal, saver_effect
from .savers import Checkpointer

__all__ = ["Ledger", "countdown_graph", "main", "run_child", "run_demo"]

#: The user the demo's threads belong to.
DEMO_USER = "demo"
#: The name of the worker's effect in each of its tasks.
EFFECT = "deliver"

_LEDGER_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS calls (id INTEGER PRIMARY KEY, key TEXT, value INTEGER, pid INTEGER)",
    "CREATE TABLE IF NOT EXISTS runs (id INTEGER PRIMARY KEY, node TEXT, value INTEGER, pid INTEGER)",
)


class Ledger:
    """The downstream service, in a small SQLite file: one row per call, no deduplication.

    ``deliver`` is the side effect (a payment API, a mail server);
    ``find`` is what such a service offers to reconcile by idempotency key.
    The demo also logs every node execution (``runs``) to find re-runs.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(os.fspath(path), check_same_thread=False, timeout=30, isolation_level=None)
        for statement in _LEDGER_SCHEMA:
            self._conn.execute(statement)

    def deliver(self, key: str, value: int) -> dict[str, int]:
        """Apply the side effect (every call: a row); its receipt."""
        with self._lock:
            cur = self._conn.execute("INSERT INTO calls (key, value, pid) VALUES (?, ?, ?)", (key, value, os.getpid()))
        return {"receipt": int(cur.lastrowid or 0), "step": value}

    def find(self, key: str) -> Any:
        """Reconcile: the receipt of the call made with ``key``, or ``NOT_APPLIED``."""
        with self._lock:
            row = self._conn.execute("SELECT id, value FROM calls WHERE key = ? ORDER BY id LIMIT 1", (key,)).fetchone()
        return NOT_APPLIED if row is None else {"receipt": row[0], "step": row[1]}

    def calls(self) -> list[tuple[str, int, int]]:
        """``(key, value, pid)`` of every call, in order."""
        return self._conn.execute("SELECT key, value, pid FROM calls ORDER BY id").fetchall()

    def record_run(self, node: str, value: int) -> None:
        """Log that ``node`` ran for step ``value`` in this process."""
        with self._lock:
            self._conn.execute("INSERT INTO runs (node, value, pid) VALUES (?, ?, ?)", (node, value, os.getpid()))

    def runs(self) -> list[tuple[str, int, int]]:
        """``(node, value, pid)`` of every node execution, in order."""
        return self._conn.execute("SELECT node, value, pid FROM runs ORDER BY id").fetchall()

    def close(self) -> None:
        """Close the connection."""
        self._conn.close()


class Countdown(TypedDict, total=False):
    """The countdown's state: where it started, the current number, the outputs."""

    start: int
    n: int
    outputs: Annotated[list[int], operator.add]


def countdown_graph(checkpointer: Checkpointer, ledger: Ledger, crash_at: int | None = None) -> Any:
    """The countdown graph: ``planner`` picks the next number, ``worker`` acts on it.

    The worker delivers ``n`` to ``ledger`` inside the effect ``deliver`` of
    its task (reconciled by ``ledger.find``) and, when ``n`` is ``crash_at``,
    SIGKILLs its own process between that call and its record.
    """

    def planner(state: Countdown) -> dict[str, Any]:
        n = state["start"] if "n" not in state else state["n"] - 1
        ledger.record_run("planner", n)
        return {"n": n}

    def worker(state: Countdown, config: RunnableConfig) -> dict[str, Any]:
        n = state["n"]
        ledger.record_run("worker", n)
        with saver_effect(checkpointer, config, EFFECT, reconcile=ledger.find) as fx:
            if not fx.done:
                receipt = ledger.deliver(fx.key, n)
                if n == crash_at:
                    os.kill(os.getpid(), signal.SIGKILL)
                fx.record(receipt)
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


def run_child(store: str, ledger_path: str, thread_id: str, start: int, crash_at: int | None) -> None:
    """Run (``crash_at`` set) or resume (``crash_at`` None) the countdown thread."""
    saver = _open(store)
    ledger = Ledger(ledger_path)
    graph = countdown_graph(saver, ledger, crash_at)
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


@dataclass
class _Outcome:
    """What the store and the ledger hold after run 2."""

    outputs: list[int]
    checkpoints: int
    effects: list[EffectInfo]
    calls: list[tuple[str, int, int]]
    runs: list[tuple[str, int, int]]
    size: str | None


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


def run_demo(store: str | None = None, crash_at: int = 12, start: int = 20, keep: bool = False) -> int:
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
    ledger_path = workdir / "ledger.db"
    common = ["--store", store, "--ledger", str(ledger_path), "--thread", thread_id, "--start", str(start)]
    rep = _Report()
    rep.line(
        f"checkpointers crash demo: countdown {start}..0, SIGKILL in step {crash_at} between its call and its record"
    )
    rep.line(f"store:   {store}  (thread {thread_id!r}, user {DEMO_USER!r})")
    rep.line(f"ledger db: {ledger_path}  (the downstream service: one row per call, no deduplication)")

    first = _spawn([*common, "--kill-at", str(crash_at)])
    killed = first.returncode == -signal.SIGKILL
    rep.line(f"run 1:   exit {first.returncode}" + ("  (SIGKILL, as planned)" if killed else ""))
    rep.check(killed, f"run 1 should die by SIGKILL, exited {first.returncode}: {_last_line(first.stderr)}")
    second = _spawn(common)
    rep.line(f"run 2:   exit {second.returncode}  (fresh process, resumed from the store)")
    rep.check(second.returncode == 0, f"run 2 failed: {_last_line(second.stderr)}")

    found = _read_back(store, ledger_path, thread_id, start)
    _report_outputs(rep, found, start, crash_at)
    _report_effects(rep, found, start, crash_at)
    on_disk = f", {found.size} on disk" if found.size else ""
    rep.line(f"checkpoints: {found.checkpoints} stored for the thread{on_disk}")
    rep.check(found.checkpoints > 0, "no checkpoints found in the store")
    return rep


def _read_back(store: str, ledger_path: Path, thread_id: str, start: int) -> _Outcome:
    """The thread's final state, checkpoints and journal from the store; the ledger's calls and runs."""
    ledger, saver = Ledger(ledger_path), _open(store)
    try:
        config = _config(thread_id, start)
        state = countdown_graph(saver, ledger).get_state(config).values
        journal = Journal(saver.backend, saver.integrity, saver._partition(config, thread_id))
        found = _Outcome(
            state.get("outputs", []), len(list(saver.list(config))), journal.list(), ledger.calls(), ledger.runs(), None
        )
        sqlite_path = saver.backend.path if isinstance(saver.backend, SqliteBackend) else None
    finally:
        ledger.close()
        saver.close()
    found.size = _file_bytes(sqlite_path)  # after close: the WAL is folded into the file
    return found


def _report_outputs(rep: _Report, found: _Outcome, start: int, crash_at: int) -> None:
    outputs = found.outputs
    repeated = sorted({n for n in outputs if outputs.count(n) > 1})
    rep.line(f"outputs: {' '.join(map(str, outputs))}")
    rep.line(f"         {len(outputs)} values, repeated: {repeated or 'none'}")
    rep.check(outputs == list(range(start, -1, -1)), f"outputs should be {start}..0 in order")
    pids: dict[tuple[str, int], list[int]] = {}
    for node, value, pid in found.runs:
        seen = pids.setdefault((node, value), [])
        if pid not in seen:
            seen.append(pid)
    twice = [run for run, ps in pids.items() if len(ps) > 1]
    shown = ", ".join(f"{node} step {n} (pids {' then '.join(map(str, pids[node, n]))})" for node, n in twice)
    rep.line(f"ran in two processes: {shown or 'none'}")
    rep.check(
        twice == [("worker", crash_at)], f"only the worker of step {crash_at} should run in two processes, got {twice}"
    )


def _report_effects(rep: _Report, found: _Outcome, start: int, crash_at: int) -> None:
    """The journal's effects (one per step, the killed one reconciled) and the ledger (no duplicate)."""
    effects, calls = found.effects, found.calls
    reconciled = [e for e in effects if e.via == "reconcile"]
    by_call = len(effects) - len(reconciled)
    rep.line(f"journal: {len(effects)} effects done, {by_call} by their call, {len(reconciled)} reconciled")
    for e in reconciled:
        step = e.outcome.get("step") if isinstance(e.outcome, dict) else None
        rep.line(f"step {step}: unknown outcome, reconciled by key `{e.key}`: already applied")
        rep.line(f"         (intent by {e.intent.owner} in run 1; receipt {e.outcome.get('receipt')} from the ledger)")
    steps = [e.outcome.get("step") for e in reconciled]
    rep.check(steps == [crash_at], f"exactly step {crash_at}'s effect should be reconciled, got steps {steps}")
    rep.check(
        len(effects) == start + 1 and all(e.outcome is not None for e in effects),
        f"the journal should hold {start + 1} effects, all done",
    )
    keys = [key for key, _, _ in calls]
    duplicates = sorted({k for k in keys if keys.count(k) > 1})
    rep.line(f"ledger:  {len(calls)} calls, {len(set(keys))} keys, duplicates: {', '.join(duplicates) or 'none'}")
    rep.check(len(calls) == len(set(keys)) == start + 1, f"the ledger should hold {start + 1} calls, one per step")
    rep.check(set(keys) == {e.key for e in effects}, "every call should be made with its effect's key")


def _fleet(argv: list[str]) -> int:
    """``demo --fleet``: the lease demo of :mod:`checkpointers.fleet_demo`, with the other arguments."""
    try:
        fleet_demo = importlib.import_module(f"{__package__}.fleet_demo")
    except ModuleNotFoundError as exc:
        if exc.name != f"{__package__}.fleet_demo":
            raise
        print(
            "python -m checkpointers demo --fleet: the fleet demo (checkpointers.fleet_demo) is not in this version",
            file=sys.stderr,
        )
        return 2
    return int(fleet_demo.main(argv))


def main(argv: list[str] | None = None) -> int:
    """Parse the ``demo`` sub-command's arguments (after ``demo``) and run it."""
    args_list = sys.argv[1:] if argv is None else list(argv)
    if "--fleet" in args_list:
        return _fleet([a for a in args_list if a != "--fleet"])
    parser = argparse.ArgumentParser(
        prog="python -m checkpointers demo",
        description="Crash a LangGraph countdown with SIGKILL between a side effect and its record, resume it "
        "from the store, and show the journal settle the unknown outcome.",
    )
    parser.add_argument(
        "--store", help="store URL, any Checkpointer.from_url accepts (default: sqlite:///<tempdir>/demo.db)"
    )
    parser.add_argument("--crash-at", type=int, default=12, help="step to SIGKILL in (default 12)")
    parser.add_argument("--start", type=int, default=20, help="count down from N (default 20)")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (store, ledger)")
    parser.add_argument("--fleet", action="store_true", help="run the lease demo instead (other options: its own)")
    # Internal: one run of the graph in a child process.
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--ledger", help=argparse.SUPPRESS)
    parser.add_argument("--thread", help=argparse.SUPPRESS)
    parser.add_argument("--kill-at", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(args_list)

    if args.child:
        run_child(args.store, args.ledger, args.thread, args.start, args.kill_at)
        return 0
    if args.start < 0:
        parser.error("--start must be >= 0")
    try:
        return run_demo(args.store, args.crash_at, args.start, keep=args.keep)
    except ValueError as exc:
        parser.error(str(exc))
