"""What one journaled side effect costs: backend calls and time per effect.

For each backend (memory, SQLite on a file, Redis on ``--redis``), N effects
of one scope, each ``with effect(...) as fx: fx.record(...)`` (a new effect:
the intent, then the outcome), in four settings:

* ``allow``: ``Store(unleased="allow")``, no lease read;
* ``refuse``: the default ``unleased="refuse"`` (each write first reads the
  lease record, to refuse writes to a scope another owner holds);
* ``lease``: under a lease (each write carries the lease record's condition);
* ``done``: re-entering effects that are done (the caller skips the call);

and, for scale, ``set_item`` of a value of the same size (``refuse``); then
the LangGraph face, ``saver_effect`` with a task's config (``saver``: the
saver's default unleased policy, ``saver-lease``: inside ``saver.lease``). Counts
are backend calls (``get``/``write``/``list``) per effect, from a counting
wrapper; times are wall-clock means per effect, the best of 5 rounds of
``n/5`` (this machine: 2 cores, shared), so compare rows, not machines.

    .venv/bin/python -m benchmarks.effects_cost [-n 500] [--redis redis://127.0.0.1:6379/0]
"""

from __future__ import annotations

import argparse
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from checkpointers import Store
from checkpointers.backends import Backend, MemoryBackend
from checkpointers.effects import effect, saver_effect
from checkpointers.savers import Checkpointer

OUTCOME = {"receipt": "r-0001", "amount": 100, "currency": "EUR"}


class Counting:
    """A backend wrapper that counts the calls the flows make."""

    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name in ("get", "write", "list", "many", "partitions", "drop"):

            def counted(*args: Any, **kwargs: Any) -> Any:
                self.calls[name] += 1
                return attr(*args, **kwargs)

            return counted
        return attr


@contextmanager
def backends(redis_url: str | None) -> Iterator[list[tuple[str, Backend]]]:
    from checkpointers.backends.sqlite import SqliteBackend

    with tempfile.TemporaryDirectory() as tmp:
        found: list[tuple[str, Backend]] = [
            ("memory", MemoryBackend()),
            ("sqlite", SqliteBackend(Path(tmp) / "state.db")),
        ]
        if redis_url:
            from checkpointers.backends.redis import RedisBackend

            found.append(("redis", RedisBackend.from_url(redis_url, prefix=f"bench-{uuid.uuid4().hex[:8]}")))
        try:
            yield found
        finally:
            for _, b in found:
                b.close()


def _store_workload(counting: Counting, setting: str, n: int) -> Callable[[int], None]:
    """One effect (or set_item) of the Store face per call, for ``setting``."""
    unleased = "allow" if setting == "allow" else "refuse"
    store = Store(counting, unleased=unleased).for_user(f"bench-{uuid.uuid4().hex}")  # type: ignore[arg-type]
    scope = f"runs/{uuid.uuid4().hex[:8]}"
    lease = store.acquire_lease(scope, "bench", ttl=600) if setting == "lease" else None
    if setting == "done":
        for i in range(n):
            with effect(store, scope, f"e{i}") as fx:
                fx.record(OUTCOME)

        def done(i: int) -> None:
            with effect(store, scope, f"e{i}") as fx:
                assert fx.done

        return done
    if setting == "set_item":

        def set_item(i: int) -> None:
            store.set_item(scope, f"k{i}", OUTCOME)

        return set_item

    def new(i: int) -> None:
        with effect(store, scope, f"e{i}", lease=lease) as fx:
            fx.record(OUTCOME)

    return new


def _saver_workload(counting: Counting, setting: str, stack: ExitStack) -> Callable[[int], None]:
    """One effect of the LangGraph face (``saver_effect``, a task's config) per call; ``saver-lease``: leased."""
    saver = Checkpointer(counting).for_user(f"bench-{uuid.uuid4().hex}")  # type: ignore[arg-type]
    thread = f"t-{uuid.uuid4().hex[:8]}"
    if setting == "saver-lease":
        stack.enter_context(saver.lease(thread, owner="bench", ttl=600))

    def one(i: int) -> None:
        config = {"configurable": {"thread_id": thread, "__pregel_task_id": f"task-{i}"}}
        with saver_effect(saver, config, "charge") as fx:
            fx.record(OUTCOME)

    return one


def measure(backend: Backend, setting: str, n: int) -> tuple[float, dict[str, float]]:
    """Mean seconds and backend calls per effect for one setting."""
    counting = Counting(backend)
    with ExitStack() as stack:
        if setting.startswith("saver"):
            one = _saver_workload(counting, setting, stack)
        else:
            one = _store_workload(counting, setting, n)
        return best_round(counting, one, n)


def best_round(
    counting: Counting, one: Callable[[int], object], n: int, rounds: int = 5
) -> tuple[float, dict[str, float]]:
    """Mean seconds per ``one(i)`` over the best of ``rounds`` rounds of ``n/rounds``, and calls per op.

    The best round is the one least disturbed by other load on a shared
    machine; ``counting`` is cleared first, so the counts are of these calls only.
    """
    counting.calls.clear()
    means = []
    for r in range(rounds):
        start = time.perf_counter()
        for i in range(r * n // rounds, (r + 1) * n // rounds):
            one(i)
        means.append((time.perf_counter() - start) / (n // rounds))
    return min(means), {k: v / n for k, v in sorted(counting.calls.items())}


def print_rows(
    found: list[tuple[str, Backend]],
    settings: tuple[str, ...],
    measure_one: Callable[[Backend, str], tuple[float, dict[str, float]]],
    unit: str,
) -> None:
    """One line per backend and setting: time per op and backend calls per op."""
    width = max(len(s) for s in settings)
    print(f"{'backend':8} {'setting':{width}} {unit:>10}  backend calls per op")
    for name, backend in found:
        for setting in settings:
            seconds, calls = measure_one(backend, setting)
            shown = ", ".join(f"{k} {v:g}" for k, v in calls.items())
            print(f"{name:8} {setting:{width}} {seconds * 1e6:10.0f}  {shown}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=500, help="effects per setting")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0", help="Redis URL ('' to skip)")
    args = parser.parse_args()
    settings = ("allow", "refuse", "lease", "done", "set_item", "saver", "saver-lease")
    with backends(args.redis or None) as found:
        print_rows(found, settings, lambda b, s: measure(b, s, args.n), "us/effect")


if __name__ == "__main__":
    main()
