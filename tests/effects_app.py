"""A downstream service (a SQLite ledger) and a worker that performs effects against it.

The ledger stands in for a payment API or a mail server: ``apply`` inserts a
row per call and does **not** deduplicate (no unique key), so an effect that
fired twice shows up as two rows. ``find`` is what a real service offers to
reconcile by idempotency key.

Run as a script (``python -m tests.effects_app ...``) the worker performs the
effects ``e1``, ``e2``, ``e3`` of one scope through the journal and can
SIGKILL itself at one of three points of one effect:

* ``before_intent``: before entering the effect (nothing of it is stored);
* ``after_call``: after the ledger applied it, before its outcome is recorded;
* ``after_outcome``: after the outcome is recorded.

It prints one line per effect: ``applied:<e>``, ``skipped:<e>`` (done before),
``reconciled:<e>`` (an unknown outcome settled by the ledger) or
``unknown:<e>`` (UnknownOutcomeError, reported, not retried).
"""

from __future__ import annotations

import argparse
import asyncio
import operator
import os
import signal
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, TypedDict

from agent_framework import Executor, WorkflowBuilder, WorkflowContext, handler
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph

from adapters.agent_framework_effects import storage_effect
from checkpointers import Store
from checkpointers.backends import Backend, open_backend
from checkpointers.effects import NOT_APPLIED, UnknownOutcomeError, effect, saver_effect
from checkpointers.savers import Checkpointer

EFFECTS = ("e1", "e2", "e3")
POINTS = ("before_intent", "after_call", "after_outcome")


class Ledger:
    """The downstream system: one row per applied call, no deduplication."""

    def __init__(self, path: str | Path) -> None:
        # used from the graph runtime's worker threads too: one connection, one lock
        self._conn = sqlite3.connect(str(path), isolation_level=None, timeout=30, check_same_thread=False)
        self._lock = threading.Lock()
        self._conn.execute("CREATE TABLE IF NOT EXISTS ledger (key TEXT, effect TEXT, pid INTEGER)")

    def apply(self, key: str, effect_name: str) -> int:
        """Perform the effect; return its row id (its "receipt")."""
        with self._lock:
            cur = self._conn.execute(
                "INSERT INTO ledger (key, effect, pid) VALUES (?, ?, ?)", (key, effect_name, os.getpid())
            )
            return int(cur.lastrowid or 0)

    def find(self, key: str) -> Any:
        """Reconcile: the receipt of the call made with ``key``, or NOT_APPLIED."""
        with self._lock:
            row = self._conn.execute("SELECT rowid FROM ledger WHERE key = ? ORDER BY rowid LIMIT 1", (key,)).fetchone()
        return NOT_APPLIED if row is None else {"receipt": row[0]}

    def counts(self) -> dict[str, int]:
        """How many times each effect was applied."""
        rows = self._conn.execute("SELECT effect, COUNT(*) FROM ledger GROUP BY effect").fetchall()
        return {name: n for name, n in rows}

    def reset(self) -> None:
        """Forget every applied call (a fresh downstream system)."""
        self._conn.execute("DELETE FROM ledger")

    def close(self) -> None:
        self._conn.close()


def die() -> None:
    """kill -9 of this process: nothing gets to clean up."""
    os.kill(os.getpid(), signal.SIGKILL)


def perform(store: Store, scope: str, ledger: Ledger, name: str, *, reconcile: bool, kill_at: str | None) -> str:
    """One effect through the journal; the line the worker prints for it."""
    if kill_at == "before_intent":
        die()
    try:
        with effect(store, scope, name, reconcile=ledger.find if reconcile else None) as fx:
            if fx.done:
                return f"{'reconciled' if fx.reconciled else 'skipped'}:{name}"
            receipt = ledger.apply(fx.key, name)
            if kill_at == "after_call":
                die()
            fx.record({"receipt": receipt})
            if kill_at == "after_outcome":
                die()
            return f"applied:{name}"
    except UnknownOutcomeError:
        return f"unknown:{name}"


@contextmanager
def reported(name: str) -> Iterator[None]:
    """Print ``unknown:<name>`` for an UnknownOutcomeError (which propagates: the run stops)."""
    try:
        yield
    except UnknownOutcomeError:
        print(f"unknown:{name}", flush=True)
        raise


# -- the LangGraph face: a compiled graph whose nodes charge through saver.effect --------


class PayState(TypedDict):
    receipts: Annotated[list[int], operator.add]


def pay_graph(saver: Checkpointer, ledger: Ledger, *, reconcile: bool, kill_at: str | None) -> Any:
    """``e1 -> e2 -> e3``: each node charges once through :func:`saver_effect` (kill in ``e2``)."""

    def node(name: str) -> Any:
        def charge(state: PayState, config: RunnableConfig) -> dict[str, list[int]]:
            if kill_at == "before_intent" and name == "e2":
                die()
            find = ledger.find if reconcile else None
            with reported(name), saver_effect(saver, config, "charge", reconcile=find) as fx:
                if fx.done:
                    print(f"{'reconciled' if fx.reconciled else 'skipped'}:{name}", flush=True)
                else:
                    receipt = ledger.apply(fx.key, name)
                    if kill_at == "after_call" and name == "e2":
                        die()
                    fx.record({"receipt": receipt})
                    if kill_at == "after_outcome" and name == "e2":
                        die()
                    print(f"applied:{name}", flush=True)
            return {"receipts": [fx.outcome["receipt"]]}

        return charge

    g = StateGraph(PayState)
    for name in EFFECTS:
        g.add_node(name, node(name))
    g.add_edge(START, "e1")
    g.add_edge("e1", "e2")
    g.add_edge("e2", "e3")
    g.add_edge("e3", END)
    return g.compile(checkpointer=saver)


def run_graph(backend: Backend, args: argparse.Namespace, ledger: Ledger) -> None:
    """Run (or resume) thread ``--scope`` of the pay graph; ``unknown:<node>`` if a node raised it."""
    saver = Checkpointer(backend).for_user(args.user)
    app = pay_graph(saver, ledger, reconcile=args.reconcile, kill_at=args.kill_at)
    config: RunnableConfig = {"configurable": {"thread_id": args.scope}}
    fresh = saver.get_tuple(config) is None
    try:
        app.invoke({"receipts": []} if fresh else None, config, durability="sync")
    except UnknownOutcomeError:
        pass  # the node reported it: the run stops there, nothing is guessed


# -- the Agent Framework face: a workflow whose executors charge through storage_effect ---


class Pay(Executor):
    """Charges once per run through the journal, then passes the receipts on."""

    def __init__(self, id: str, storage: Any, ledger: Ledger, run_id: str, reconcile: bool, kill: bool) -> None:
        super().__init__(id=id)
        self.storage, self.ledger, self.run_id = storage, ledger, run_id
        self.reconcile, self.kill = reconcile, kill

    @handler
    async def pay(self, receipts: list[int], ctx: WorkflowContext[list[int], list[int]]) -> None:
        find = self.ledger.find if self.reconcile else None
        with reported(self.id):
            fx = await self._charge(find)
        out = [*receipts, fx.outcome["receipt"]]
        if self.id == EFFECTS[-1]:
            await ctx.yield_output(out)
        else:
            await ctx.send_message(out)

    async def _charge(self, find: Any) -> Any:
        async with storage_effect(self.storage, self.run_id, self.id, "charge", reconcile=find) as fx:
            if fx.done:
                print(f"{'reconciled' if fx.reconciled else 'skipped'}:{self.id}", flush=True)
            else:
                receipt = self.ledger.apply(fx.key, self.id)
                if self.kill:
                    die()
                await fx.arecord({"receipt": receipt})
                print(f"applied:{self.id}", flush=True)
        return fx


async def run_workflow(backend: Backend, args: argparse.Namespace, ledger: Ledger) -> None:
    """Run (or resume from its latest checkpoint) workflow run ``--scope``; kill in ``e2`` after its call."""
    from adapters.agent_framework import IsolatedCheckpointStorage

    storage = IsolatedCheckpointStorage(backend, user=args.user)
    pays = [Pay(n, storage, ledger, args.scope, args.reconcile, args.kill_at == "after_call" and n == "e2")
            for n in EFFECTS]  # fmt: skip
    name = f"pay-{args.scope}"
    builder = WorkflowBuilder(name=name, start_executor=pays[0], checkpoint_storage=storage)
    workflow = builder.add_edge(pays[0], pays[1]).add_edge(pays[1], pays[2]).build()
    latest = await storage.get_latest(workflow_name=name)
    try:
        if latest is None:
            await workflow.run([])
        else:
            await workflow.run(checkpoint_id=latest.checkpoint_id)
    except Exception as exc:  # the framework may wrap what an executor raised
        cause: BaseException | None = exc
        while cause is not None and not isinstance(cause, UnknownOutcomeError):
            cause = cause.__cause__ or cause.__context__
        if cause is None:
            raise  # only the unknown outcome (already reported) ends the run quietly
    storage.raise_if_refused()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--face", choices=("store", "graph", "workflow"), default="store")
    parser.add_argument("--url", required=True)
    parser.add_argument("--ledger", required=True)
    parser.add_argument("--user", required=True)
    parser.add_argument("--scope", required=True, help="the scope, the graph's thread or the workflow's run id")
    parser.add_argument("--kill-at", choices=POINTS)
    parser.add_argument("--kill-effect", default="e2")
    parser.add_argument("--reconcile", action="store_true")
    args = parser.parse_args()
    backend = open_backend(args.url)
    ledger = Ledger(args.ledger)
    if args.face == "graph":
        run_graph(backend, args, ledger)
    elif args.face == "workflow":
        asyncio.run(run_workflow(backend, args, ledger))
    else:
        store = Store(backend).for_user(args.user)
        for name in EFFECTS:
            kill_at = args.kill_at if name == args.kill_effect else None
            print(perform(store, args.scope, ledger, name, reconcile=args.reconcile, kill_at=kill_at), flush=True)
    ledger.close()
    backend.close()


if __name__ == "__main__":
    main()
