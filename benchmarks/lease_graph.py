"""What a thread lease costs a LangGraph run: steps/s with a lease held against without, and renewals.

For each backend (memory, SQLite on a file, Redis on ``--redis``), one
compiled graph of ``--steps`` supersteps (one node, a counter and a list
channel) runs on a fresh thread per run, in three settings, interleaved
round by round (the order rotates, so drift and other load hit all three):

* ``allow``: ``Checkpointer(unleased="allow")``, no lease: the plain saver;
* ``refuse``: the default ``unleased="refuse"``, no lease: each write first
  reads the thread's lease record (absent), to refuse writes to a thread
  another worker holds;
* ``lease``: inside ``with saver.lease(thread, ...)``: every write carries
  the lease record's condition in the same backend write (no extra call);
  the acquire and the release are counted in the run's time.

Reported: steps/s (the best round: this machine is shared, and the rounds of
one setting do the same work), the ratio of ``lease`` to ``allow`` and to ``refuse`` (target:
at least 0.9x), backend calls per step (a counting wrapper, one extra run),
and renewal writes per minute: a lease of ``--ttl`` held idle for
``--hold`` seconds (renewed every ttl/3), counted, and what that gives at a
production ttl of 30 s (6 per minute per held thread).

    .venv/bin/python -m benchmarks.lease_graph [--steps 20] [--rounds 15] [--redis URL]
"""

from __future__ import annotations

import argparse
import contextlib
import operator
import time
import uuid
from typing import Annotated, Any

from langgraph.graph import END, START, StateGraph
from typing_extensions import TypedDict

from benchmarks.effects_cost import Counting, backends
from checkpointers.backends import Backend
from checkpointers.savers import Checkpointer

SETTINGS = ("allow", "refuse", "lease")


class State(TypedDict):
    count: int
    trail: Annotated[list[int], operator.add]


def graph(saver: Checkpointer, steps: int) -> Any:
    """``step`` runs ``steps`` times, one superstep each."""

    def step(state: State) -> dict[str, Any]:
        return {"count": state["count"] + 1, "trail": [state["count"]]}

    builder = StateGraph(State)
    builder.add_node("step", step)
    builder.add_edge(START, "step")
    builder.add_conditional_edges("step", lambda s: "step" if s["count"] < steps else END, ["step", END])
    return builder.compile(checkpointer=saver)


def one_run(saver: Checkpointer, setting: str, steps: int) -> float:
    """Seconds for one run of the graph on a fresh thread in ``setting``."""
    thread = uuid.uuid4().hex
    g = graph(saver, steps)
    config = {"configurable": {"thread_id": thread}, "recursion_limit": steps + 10}
    start = time.perf_counter()
    held = saver.lease(thread, owner="bench", ttl=600) if setting == "lease" else contextlib.nullcontext()
    with held:
        g.invoke({"count": 0, "trail": []}, config)
    return time.perf_counter() - start


def savers_for(backend: Backend) -> dict[str, Checkpointer]:
    user = f"bench-{uuid.uuid4().hex[:8]}"
    return {
        s: Checkpointer(backend, unleased="allow" if s == "allow" else "refuse").for_user(user) for s in SETTINGS
    }


def steps_per_second(backend: Backend, steps: int, rounds: int) -> dict[str, float]:
    """Best steps/s of each setting over ``rounds`` interleaved rounds (the least disturbed by other load)."""
    savers = savers_for(backend)
    for s in SETTINGS:  # warm-up: imports, compiled graph caches, connections
        one_run(savers[s], s, steps)
    times: dict[str, list[float]] = {s: [] for s in SETTINGS}
    for r in range(rounds):
        for s in SETTINGS[r % 3 :] + SETTINGS[: r % 3]:
            times[s].append(one_run(savers[s], s, steps))
    return {s: steps / min(t) for s, t in times.items()}


def calls_per_step(backend: Backend, steps: int) -> dict[str, str]:
    """Backend calls per step of one run in each setting."""
    out = {}
    for s in SETTINGS:
        counting = Counting(backend)
        saver = Checkpointer(counting, unleased="allow" if s == "allow" else "refuse").for_user(uuid.uuid4().hex)  # type: ignore[arg-type]
        one_run(saver, s, steps)
        out[s] = ", ".join(f"{k} {v / steps:.2f}" for k, v in sorted(counting.calls.items()))
    return out


def renewals_per_minute(backend: Backend, ttl: float, hold: float) -> float:
    """Renewal writes per minute of one idle lease of ``ttl`` held for ``hold`` seconds."""
    saver = Checkpointer(backend).for_user(uuid.uuid4().hex)
    start = time.monotonic()
    with saver.lease("idle", owner="bench", ttl=ttl) as held:
        time.sleep(hold)
    return held.renewals / (time.monotonic() - start) * 60


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="supersteps per run")
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds (runs per setting)")
    parser.add_argument("--ttl", type=float, default=0.6, help="ttl of the idle lease for the renewal count")
    parser.add_argument("--hold", type=float, default=3.0, help="seconds the idle lease is held")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0", help="Redis URL ('' to skip)")
    args = parser.parse_args(argv)
    print(f"{'backend':8} {'allow':>8} {'refuse':>8} {'lease':>8} {'lease/allow':>12} {'lease/refuse':>13}  (steps/s)")
    with backends(args.redis or None) as found:
        for name, backend in found:
            rate = steps_per_second(backend, args.steps, args.rounds)
            ratio_a, ratio_r = rate["lease"] / rate["allow"], rate["lease"] / rate["refuse"]
            print(
                f"{name:8} {rate['allow']:8.0f} {rate['refuse']:8.0f} {rate['lease']:8.0f} "
                f"{ratio_a:11.2f}x {ratio_r:12.2f}x"
            )
            for s, calls in calls_per_step(backend, args.steps).items():
                print(f"{'':8} calls per step, {s:6}: {calls}")
            per_min = renewals_per_minute(backend, args.ttl, args.hold)
            print(
                f"{'':8} renewals: {per_min:.0f}/min at ttl {args.ttl:g} s (expected {180 / args.ttl:.0f}); "
                f"at ttl 30 s: {180 / 30:.0f}/min per held thread"
            )


if __name__ == "__main__":
    main()
