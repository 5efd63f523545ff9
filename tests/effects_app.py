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
import os
import signal
import sqlite3
from pathlib import Path
from typing import Any

from checkpointers import Store
from checkpointers.backends import open_backend
from checkpointers.effects import NOT_APPLIED, UnknownOutcomeError, effect

EFFECTS = ("e1", "e2", "e3")
POINTS = ("before_intent", "after_call", "after_outcome")


class Ledger:
    """The downstream system: one row per applied call, no deduplication."""

    def __init__(self, path: str | Path) -> None:
        self._conn = sqlite3.connect(str(path), isolation_level=None, timeout=30)
        self._conn.execute("CREATE TABLE IF NOT EXISTS ledger (key TEXT, effect TEXT, pid INTEGER)")

    def apply(self, key: str, effect_name: str) -> int:
        """Perform the effect; return its row id (its "receipt")."""
        cur = self._conn.execute(
            "INSERT INTO ledger (key, effect, pid) VALUES (?, ?, ?)", (key, effect_name, os.getpid())
        )
        return int(cur.lastrowid or 0)

    def find(self, key: str) -> Any:
        """Reconcile: the receipt of the call made with ``key``, or NOT_APPLIED."""
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", required=True)
    parser.add_argument("--ledger", required=True)
    parser.add_argument("--user", required=True)
    parser.add_argument("--scope", required=True)
    parser.add_argument("--kill-at", choices=POINTS)
    parser.add_argument("--kill-effect", default="e2")
    parser.add_argument("--reconcile", action="store_true")
    args = parser.parse_args()
    backend = open_backend(args.url)
    store = Store(backend).for_user(args.user)
    ledger = Ledger(args.ledger)
    for name in EFFECTS:
        kill_at = args.kill_at if name == args.kill_effect else None
        print(perform(store, args.scope, ledger, name, reconcile=args.reconcile, kill_at=kill_at), flush=True)
    ledger.close()
    backend.close()


if __name__ == "__main__":
    main()
