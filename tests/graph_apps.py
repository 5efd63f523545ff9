"""Real LangGraph graphs used by the tests, the demo and crash subprocesses.

Every builder returns a compiled graph over the checkpointer it is given, so
the same graph runs in-process (``tests/test_graphs.py``) and in a fresh
process that resumes from a store URL (``tests/test_sigkill.py``)::

    python -m tests.graph_apps sigkill --url sqlite:///... --dir D --thread T --user U

The SIGKILL graph's side effects are counted in files of ``--dir``: one line
per node execution, so a test can tell which nodes ran again after a crash.
"""

from __future__ import annotations

import argparse
import operator
import os
import signal
import time
from pathlib import Path
from typing import Annotated, Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Send, interrupt
from typing_extensions import TypedDict

from checkpointers.fleet_demo import looping_graph
from checkpointers.savers import Checkpointer

__all__ = [
    "fanout_graph",
    "interrupt_graph",
    "loop_graph",
    "nested_graph",
    "open_saver",
    "read_count",
    "sigkill_graph",
]


def open_saver(url: str) -> Checkpointer:
    """Open our checkpointer on the store ``url`` names (any backend)."""
    return Checkpointer.from_url(url)


# --- a multi-step loop -------------------------------------------------------


class LoopState(TypedDict):
    count: int
    trail: Annotated[list[int], operator.add]


def loop_graph(checkpointer: BaseCheckpointSaver[Any], limit: int = 5) -> CompiledStateGraph:
    """``step`` runs until ``count`` reaches ``limit``, one superstep per run."""

    def step(state: LoopState) -> dict[str, Any]:
        return {"count": state["count"] + 1, "trail": [state["count"]]}

    return looping_graph(LoopState, step, limit, checkpointer)


# --- interrupt() then Command(resume=...) --------------------------------------


class AskState(TypedDict, total=False):
    question: str
    answer: str
    done: bool


def interrupt_graph(checkpointer: BaseCheckpointSaver[Any]) -> CompiledStateGraph:
    """``ask`` interrupts with the question; ``finish`` runs after the resume."""

    def ask(state: AskState) -> dict[str, Any]:
        return {"answer": interrupt({"question": state["question"]})}

    def finish(state: AskState) -> dict[str, Any]:
        return {"done": True}

    builder = StateGraph(AskState)
    builder.add_node("ask", ask)
    builder.add_node("finish", finish)
    builder.add_edge(START, "ask")
    builder.add_edge("ask", "finish")
    builder.add_edge("finish", END)
    return builder.compile(checkpointer=checkpointer)


# --- a two-level subgraph with an interrupt ------------------------------------


class TrailState(TypedDict):
    trail: list[str]


def _mark(label: str) -> Any:
    def node(state: TrailState) -> dict[str, Any]:
        return {"trail": [*state["trail"], label]}

    node.__name__ = label
    return node


def _chain(*nodes: tuple[str, Any]) -> StateGraph:
    """A graph running ``nodes`` one after another."""
    builder = StateGraph(TrailState)
    previous = START
    for name, node in nodes:
        builder.add_node(name, node)
        builder.add_edge(previous, name)
        previous = name
    builder.add_edge(previous, END)
    return builder


def nested_graph(checkpointer: BaseCheckpointSaver[Any]) -> CompiledStateGraph:
    """parent -> ``child`` subgraph -> ``grand`` subgraph, which interrupts.

    The interrupted task's namespace is ``child:<id>|grand:<id>``: both
    separators LangGraph uses appear in the ``checkpoint_ns`` the saver sees.
    """

    def grand_ask(state: TrailState) -> dict[str, Any]:
        answer = interrupt("grand asks")
        return {"trail": [*state["trail"], f"answer={answer}"]}

    grand = _chain(("grand_before", _mark("grand_before")), ("grand_ask", grand_ask))
    child = _chain(
        ("child_before", _mark("child_before")),
        ("grand", grand.compile()),
        ("child_after", _mark("child_after")),
    )
    parent = _chain(
        ("parent_before", _mark("parent_before")),
        ("child", child.compile()),
        ("parent_after", _mark("parent_after")),
    )
    return parent.compile(checkpointer=checkpointer)


NESTED_DONE = [
    "parent_before",
    "child_before",
    "grand_before",
    "answer={answer}",
    "child_after",
    "parent_after",
]


# --- parallel Send fan-out -----------------------------------------------------


class FanState(TypedDict):
    items: list[int]
    results: Annotated[list[int], operator.add]


class SquareInput(TypedDict):
    x: int


def fanout_graph(checkpointer: BaseCheckpointSaver[Any]) -> CompiledStateGraph:
    """One ``square`` task per item, all in one superstep, via ``Send``."""

    def fan(state: FanState) -> list[Send]:
        return [Send("square", {"x": x}) for x in state["items"]]

    def square(state: SquareInput) -> dict[str, Any]:
        return {"results": [state["x"] * state["x"]]}

    builder = StateGraph(FanState)
    builder.add_node("square", square)
    builder.add_conditional_edges(START, fan, ["square"])
    builder.add_edge("square", END)
    return builder.compile(checkpointer=checkpointer)


# --- SIGKILL mid-superstep -----------------------------------------------------


class PairState(TypedDict):
    results: Annotated[list[str], operator.add]


def _count(directory: Path, name: str) -> None:
    with open(directory / f"{name}.count", "a") as f:
        f.write(f"{os.getpid()}\n")
        f.flush()
        os.fsync(f.fileno())


def read_count(directory: Path, name: str) -> list[int]:
    """The pids that ran node ``name`` (one per execution), in order."""
    path = directory / f"{name}.count"
    return [int(line) for line in path.read_text().split()] if path.exists() else []


def _good_write_saved(reader: BaseCheckpointSaver[Any], config: RunnableConfig) -> bool:
    tup = reader.get_tuple(config)
    return tup is not None and any(
        channel == "results" and value == ["good"] for _, channel, value in tup.pending_writes or ()
    )


def sigkill_graph(
    checkpointer: BaseCheckpointSaver[Any], directory: Path, url: str, timeout: float = 30.0
) -> CompiledStateGraph:
    """``good`` and ``killer`` run in one superstep, then ``join``.

    On its first run (no ``killed`` marker in ``directory``) ``killer`` waits
    until ``good``'s writes are visible in the store through a *separate*
    connection opened from ``url``, then SIGKILLs its own process. Later runs
    of ``killer`` return normally.
    """

    def good(state: PairState) -> dict[str, Any]:
        _count(directory, "good")
        return {"results": ["good"]}

    def killer(state: PairState, config: RunnableConfig) -> dict[str, Any]:
        _count(directory, "killer")
        marker = directory / "killed"
        if not marker.exists():
            conf = config["configurable"]
            probe: RunnableConfig = {
                "configurable": {"thread_id": conf["thread_id"], "checkpoint_ns": ""}
            }
            if "user_id" in conf:
                probe["configurable"]["user_id"] = conf["user_id"]
            reader = open_saver(url)
            deadline = time.monotonic() + timeout
            while not _good_write_saved(reader, probe):
                if time.monotonic() > deadline:
                    raise TimeoutError("node 'good' never saved its writes")
                time.sleep(0.01)
            marker.touch()
            os.kill(os.getpid(), signal.SIGKILL)
        return {"results": ["killer"]}

    def join(state: PairState) -> dict[str, Any]:
        _count(directory, "join")
        return {"results": ["join"]}

    builder = StateGraph(PairState)
    builder.add_node("good", good)
    builder.add_node("killer", killer)
    builder.add_node("join", join)
    builder.add_edge(START, "good")
    builder.add_edge(START, "killer")
    builder.add_edge(["good", "killer"], "join")
    builder.add_edge("join", END)
    return builder.compile(checkpointer=checkpointer)


def _main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.graph_apps")
    sub = parser.add_subparsers(dest="app", required=True)
    kill = sub.add_parser("sigkill", help="run (or resume) the SIGKILL graph")
    kill.add_argument("--url", required=True)
    kill.add_argument("--dir", required=True, type=Path)
    kill.add_argument("--thread", required=True)
    kill.add_argument("--user", required=True)
    kill.add_argument("--durability", default="async", choices=["sync", "async"])
    kill.add_argument("--resume", action="store_true")
    args = parser.parse_args(argv)

    saver = open_saver(args.url)
    graph = sigkill_graph(saver, args.dir, args.url)
    config: RunnableConfig = {"configurable": {"thread_id": args.thread, "user_id": args.user}}
    out = graph.invoke(
        None if args.resume else {"results": []}, config, durability=args.durability
    )
    print(",".join(out["results"]))


if __name__ == "__main__":
    _main()
