"""The real LangGraph graphs the benchmarks run: (a) a growing channel, (d) a big channel once."""

from __future__ import annotations

import operator
import random
import time
from typing import Annotated, Any, TypedDict

from .harness import Session
from .shape import CHUNK

__all__ = ["big_graph", "growing_graph", "run_config", "run_graph"]

BIG = random.Random(2).randbytes(25_000).hex()  # 50 KB, incompressible


class GrowingState(TypedDict):
    log: Annotated[str, operator.add]
    step: int


class BigState(TypedDict):
    big: str
    counter: int


def growing_graph(checkpointer: Any, steps: int) -> Any:
    """A loop of ``steps`` supersteps; each appends ~1 KB to the ``log`` channel."""
    from langgraph.graph import END, START, StateGraph

    def work(state: GrowingState) -> dict[str, Any]:
        return {"log": CHUNK, "step": state["step"] + 1}

    builder = StateGraph(GrowingState)
    builder.add_node("work", work)
    builder.add_edge(START, "work")
    builder.add_conditional_edges("work", lambda s: "work" if s["step"] < steps else END)
    return builder.compile(checkpointer=checkpointer)


def big_graph(checkpointer: Any, steps: int) -> Any:
    """``init`` writes a 50 KB channel once, then ``tick`` increments a counter ``steps`` times."""
    from langgraph.graph import END, START, StateGraph

    def init(state: BigState) -> dict[str, Any]:
        return {"big": BIG, "counter": 0}

    def tick(state: BigState) -> dict[str, Any]:
        return {"counter": state["counter"] + 1}

    builder = StateGraph(BigState)
    builder.add_node("init", init)
    builder.add_node("tick", tick)
    builder.add_edge(START, "init")
    builder.add_edge("init", "tick")
    builder.add_conditional_edges("tick", lambda s: "tick" if s["counter"] < steps else END)
    return builder.compile(checkpointer=checkpointer)


def run_config(thread_id: str, steps: int) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread_id}, "recursion_limit": steps + 10}


def run_graph(
    s: Session,
    graph: Any,
    inputs: list[tuple[dict[str, Any], dict[str, Any]]],
    budget: float = float("inf"),
) -> tuple[int, float]:
    """Invoke (or ainvoke) ``graph`` per ``(input, config)`` until ``budget`` s are spent.

    Returns ``(runs done, seconds spent)``; at least one run is done.
    """

    def work(_: Any) -> tuple[int, float]:
        t = time.perf_counter()
        for done, (value, config) in enumerate(inputs, 1):
            graph.invoke(value, config)
            if time.perf_counter() - t > budget:
                return done, time.perf_counter() - t
        return len(inputs), time.perf_counter() - t

    async def awork(_: Any) -> tuple[int, float]:
        t = time.perf_counter()
        for done, (value, config) in enumerate(inputs, 1):
            await graph.ainvoke(value, config)
            if time.perf_counter() - t > budget:
                return done, time.perf_counter() - t
        return len(inputs), time.perf_counter() - t

    return s.call(work, awork)
