"""The fleet demo: ``python -m checkpointers demo --fleet``: one writer per thread, with leases.

Two scenarios on one store (a SQLite file in a temporary directory, or
``--url``), each with real worker processes running a real LangGraph graph
(the *relay*: one step per superstep, each step appending ``[worker, n]``)
under ``saver.lease(thread, owner=..., ttl=...)``:

* **crashed**: worker A is ``kill -9``-ed in the middle of step 3. After its
  ttl, B and C start at the same moment, both find the thread in
  ``saver.expired_leases()`` and race for it: one takes the lease (a higher
  fencing token) and resumes from A's last checkpoint, the other gets
  ``LeaseHeldError`` before running any step.
* **paused**: worker A is ``SIGSTOP``-ped in the middle of step 3 (a GC pause,
  a frozen pod). B and C race as above; the winner finishes the run. Then A
  is ``SIGCONT``-ed: its next write raises ``LeaseLostError`` and lands
  nothing.

The report shows who won, every worker's token and outcome, and checks the
thread's history: one chain (no checkpoint with two children), the final
trail exact, and no step whose writes were saved run twice.

``python -m checkpointers.fleet_demo worker ...`` is one worker (what the
demo spawns; the tests use it too): it prints one JSON line and exits 0 when
it finished the run, 3 on ``LeaseLostError``, 4 on ``LeaseHeldError``, 5 when
``--recover`` finds the thread not abandoned.
"""

from __future__ import annotations

import argparse
import json
import operator
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from typing_extensions import TypedDict

from .errors import LeaseHeldError, LeaseLostError
from .savers import Checkpointer

__all__ = ["looping_graph", "main", "relay_graph", "run_relay"]

#: Exit codes of a worker, by outcome.
EXIT = {"done": 0, "lost": 3, "held": 4, "not-expired": 5}
USER = "fleet"
OUTCOMES = {
    "done": "won: finished the run",
    "held": "lost the race: LeaseHeldError, ran no step",
    "not-expired": "lost the race: the scan no longer listed the thread (taken), ran no step",
    "lost": "LeaseLostError: its write landed nothing",
    "killed": "killed in step 3",
}


class RelayState(TypedDict):
    count: int
    trail: Annotated[list[list[Any]], operator.add]


def relay_graph(
    checkpointer: BaseCheckpointSaver[Any], directory: Path, owner: str, steps: int, pause_at: int = 0
) -> CompiledStateGraph[Any, Any, Any, Any]:
    """``step`` runs ``steps`` times; each run appends ``[owner, n]`` and logs ``owner n`` to ``directory/exec``.

    At step ``pause_at`` (1-based; 0: never) it touches ``directory/at-<n>``
    and sleeps 0.5 s before returning, so the demo (or a test) can SIGSTOP or
    SIGKILL the process in the middle of that step, its writes not yet saved.
    """

    def step(state: RelayState) -> dict[str, Any]:
        n = state["count"] + 1
        with open(directory / "exec", "a") as f:
            f.write(f"{owner} {n}\n")
        if n == pause_at:
            (directory / f"at-{n}").touch()
            time.sleep(0.5)
        return {"count": n, "trail": [[owner, n]]}

    return looping_graph(RelayState, step, steps, checkpointer)


def looping_graph(
    state: type[Any], step: Callable[..., Any], limit: int, checkpointer: BaseCheckpointSaver[Any]
) -> CompiledStateGraph[Any, Any, Any, Any]:
    """A compiled graph running node ``step`` until the state's ``count`` reaches ``limit``, one superstep each."""

    def route(values: Any) -> str:
        return "step" if values["count"] < limit else END

    builder = StateGraph(state)
    builder.add_node("step", step)
    builder.add_edge(START, "step")
    builder.add_conditional_edges("step", route, ["step", END])
    return builder.compile(checkpointer=checkpointer)


def run_relay(
    saver: Checkpointer, directory: Path, thread: str, owner: str, ttl: float, steps: int, pause_at: int = 0
) -> dict[str, Any]:
    """Run (or resume) the relay on ``thread`` under ``saver.lease``; what happened, as a dict.

    ``status`` is ``done`` (with ``trail``), ``lost`` or ``held``; ``token`` is
    the fencing token this run held (None if it never got the lease).
    """
    graph = relay_graph(saver, directory, owner, steps, pause_at)
    config: RunnableConfig = {"configurable": {"thread_id": thread}}
    token = None
    try:
        with saver.lease(thread, owner=owner, ttl=ttl) as held:
            token = held.token
            started = graph.get_state(config).values
            out = graph.invoke(None if started else {"count": 0, "trail": []}, config, durability="sync")
    except LeaseLostError as exc:
        return {"status": "lost", "owner": owner, "token": token, "error": str(exc)}
    except LeaseHeldError as exc:
        return {"status": "held", "owner": owner, "token": token, "error": str(exc)}
    return {"status": "done", "owner": owner, "token": token, "trail": out["trail"]}


def _worker(args: argparse.Namespace) -> int:
    saver = Checkpointer.from_url(args.url).for_user(args.user)
    if args.go:  # a start line: wait until every worker of the race may go
        (args.dir / f"ready-{args.owner}").touch()
        while not (args.dir / "go").exists():
            time.sleep(0.005)
    if args.recover:  # take the thread only if the recovery scan lists it as abandoned
        found = [info.scope for info in saver.expired_leases()]
        if args.thread not in found:
            print(json.dumps({"status": "not-expired", "owner": args.owner, "expired": found}), flush=True)
            return EXIT["not-expired"]
    result = run_relay(saver, args.dir, args.thread, args.owner, args.ttl, args.steps, args.pause_at)
    print(json.dumps(result), flush=True)
    return EXIT[result["status"]]


def spawn(url: str, d: Path, thread: str, owner: str, *extra: str, steps: int = 5) -> subprocess.Popen[str]:
    """Start one worker process (see the module docstring)."""
    cmd = [
        sys.executable, "-m", "checkpointers.fleet_demo", "worker", "--url", url, "--dir", str(d),
        "--thread", thread, "--user", USER, "--owner", owner, "--steps", str(steps), *extra,
    ]  # fmt: skip
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen[str], timeout: float = 120) -> tuple[int, dict[str, Any]]:
    """Wait for a worker: its exit code and the JSON line it printed."""
    out, err = proc.communicate(timeout=timeout)
    lines = out.strip().splitlines()
    if not lines:
        raise RuntimeError(f"worker printed nothing (exit {proc.returncode}): {err[-2000:]}")
    return proc.returncode, json.loads(lines[-1])


def wait_for(check: Callable[[], object], what: str, timeout: float = 60.0) -> Any:
    """Poll ``check`` until it returns something truthy, else TimeoutError naming ``what``."""
    deadline = time.monotonic() + timeout
    while not (found := check()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.02)
    return found


def race(
    url: str, d: Path, thread: str, owners: tuple[str, ...], *extra: str, steps: int = 5
) -> list[tuple[int, dict[str, Any]]]:
    """Start ``owners`` at the same moment on ``thread`` (a start line); their outcomes."""
    procs = [spawn(url, d, thread, o, "--go", *extra, steps=steps) for o in owners]
    wait_for(lambda: all((d / f"ready-{o}").exists() for o in owners), "every worker at the start line")
    (d / "go").touch()
    return [finish(p) for p in procs]


def history(saver: Checkpointer, thread: str) -> dict[str, Any]:
    """The thread's checkpoints: how many, the forks (parents with two children), the final trail."""
    tuples = list(saver.list({"configurable": {"thread_id": thread}}))
    children = Counter(t.parent_config["configurable"]["checkpoint_id"] for t in tuples if t.parent_config)
    forks = sorted(cid for cid, n in children.items() if n > 1)
    final = tuples[0].checkpoint["channel_values"].get("trail", []) if tuples else []
    return {"checkpoints": len(tuples), "forks": forks, "trail": final}


def scenario(kind: str, url: str, d: Path, saver: Checkpointer, ttl: float, steps: int) -> dict[str, Any]:
    """One scenario (``crashed`` or ``paused``): A stopped in step 3, B and C race for the thread."""
    d.mkdir(parents=True)
    thread = f"{kind}-{uuid.uuid4().hex[:6]}"
    a = spawn(url, d, thread, "A", "--ttl", str(ttl), "--pause-at", "3", steps=steps)
    wait_for(lambda: (d / "at-3").exists(), "worker A in step 3")
    os.kill(a.pid, signal.SIGKILL if kind == "crashed" else signal.SIGSTOP)
    a_token = None
    try:
        wait_for(lambda: thread in [i.scope for i in saver.expired_leases()], "A's lease to expire", 10 * ttl + 30)
        expired = [i for i in saver.expired_leases() if i.scope == thread][0]
        a_token = expired.token
        outcomes = race(url, d, thread, ("B", "C"), "--recover", "--ttl", str(ttl), steps=steps)
    finally:
        if kind == "paused":
            os.kill(a.pid, signal.SIGCONT)
    a_outcome = {"status": "killed", "owner": "A", "token": a_token}
    if kind == "paused":
        a_outcome = finish(a)[1]
        a_outcome["token"] = a_outcome["token"] or a_token
    else:
        a.communicate()
    runs = (d / "exec").read_text().split()
    return {
        "kind": kind,
        "thread": thread,
        "workers": [a_outcome, *(o for _, o in outcomes)],
        "history": history(saver, thread),
        "executions": [f"{runs[i]} {runs[i + 1]}" for i in range(0, len(runs), 2)],
        "steps": steps,
    }


def check(result: dict[str, Any]) -> list[str]:
    """What is wrong with a scenario's outcome (empty: all as the contract says)."""
    workers, h, steps = result["workers"], result["history"], result["steps"]
    winners = [w for w in workers[1:] if w["status"] == "done"]
    problems = []
    losers = [w for w in workers[1:] if w["status"] in ("held", "not-expired")]
    if len(winners) != 1 or len(losers) != 1:
        problems.append(f"expected one winner and one loser, got {[w['status'] for w in workers[1:]]}")
    if result["kind"] == "paused" and workers[0]["status"] != "lost":
        problems.append(f"A after SIGCONT: expected LeaseLostError, got {workers[0]['status']}")
    if h["forks"]:
        problems.append(f"forked history at {h['forks']}")
    if winners:
        w = winners[0]["owner"]
        expected = [["A", 1], ["A", 2]] + [[w, n] for n in range(3, steps + 1)]
        if h["trail"] != expected:
            problems.append(f"final trail {h['trail']} != {expected}")
        if result["executions"] != ["A 1", "A 2", "A 3"] + [f"{w} {n}" for n in range(3, steps + 1)]:
            problems.append(f"steps ran {result['executions']}")
        if winners[0]["token"] <= workers[0]["token"]:
            problems.append("the winner's token is not above A's")
    return problems


def report(results: list[dict[str, Any]]) -> int:
    """Print the report; 0 when every scenario went as the contract says, else 1."""
    bad = 0
    for r in results:
        title = "crashed holder (kill -9)" if r["kind"] == "crashed" else "paused holder (SIGSTOP, then SIGCONT)"
        print(f"\n== {title}: thread {r['thread']!r}")
        for w in r["workers"]:
            outcome = OUTCOMES[w["status"]]
            print(f"   worker {w['owner']}: token {w['token']}  {outcome}")
        h = r["history"]
        fork = "no fork" if not h["forks"] else f"FORKED at {h['forks']}"
        print(f"   history: {h['checkpoints']} checkpoints, one chain ({fork}); final trail {h['trail']}")
        print(f"   steps run: {', '.join(r['executions'])}")
        problems = check(r)
        bad += bool(problems)
        print("   OK" if not problems else "   PROBLEMS: " + "; ".join(problems))
    return 1 if bad else 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m checkpointers demo --fleet",
        description="One writer per thread: two workers race for a crashed and for a paused holder's thread.",
    )
    parser.add_argument("--url", help="store URL (default: a SQLite file in a temporary directory)")
    parser.add_argument("--ttl", type=float, default=2.0, help="lease ttl in seconds")
    parser.add_argument("--steps", type=int, default=5, help="steps of the relay graph")
    sub = parser.add_subparsers(dest="command")
    w = sub.add_parser("worker", help="one worker (spawned by the demo)")
    w.add_argument("--url", required=True)
    w.add_argument("--dir", required=True, type=Path)
    w.add_argument("--thread", required=True)
    w.add_argument("--user", default=USER)
    w.add_argument("--owner", required=True)
    w.add_argument("--ttl", type=float, default=2.0)
    w.add_argument("--steps", type=int, default=5)
    w.add_argument("--pause-at", type=int, default=0)
    w.add_argument("--go", action="store_true", help="wait for DIR/go before taking the lease")
    w.add_argument("--recover", action="store_true", help="run only if expired_leases() lists the thread")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the demo (or, with ``worker``, one worker); the exit code."""
    args = _parser().parse_args(argv)
    if args.command == "worker":
        return _worker(args)
    with tempfile.TemporaryDirectory(prefix="fleet-demo-") as tmp:
        url = args.url or f"sqlite:///{tmp}/fleet.db"
        print(f"fleet demo on {url.split('?')[0]}: lease ttl {args.ttl:g} s, relay of {args.steps} steps")
        with Checkpointer.from_url(url) as saver:
            view = saver.for_user(USER)
            results = [scenario(k, url, Path(tmp) / k, view, args.ttl, args.steps) for k in ("crashed", "paused")]
            return report(results)


if __name__ == "__main__":
    raise SystemExit(main())
