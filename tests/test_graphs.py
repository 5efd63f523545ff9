"""Real compiled LangGraph graphs through our checkpointer, on every backend.

Each test gets ``Checkpointer(backend).for_user(<fresh user>)``: a bound view,
so configs carry only a thread id, as most LangGraph users write them. The
tests that need the unbound form (user from ``configurable.user_id``) build it
from the same backend.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from typing import Any

import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.types import Command

from checkpointers.backends import Backend
from tests.graph_apps import (
    NESTED_DONE,
    fanout_graph,
    interrupt_graph,
    loop_graph,
    nested_graph,
)

from checkpointers.errors import IsolationError
from checkpointers.savers import Checkpointer


@pytest.fixture
def base(backend: Backend) -> Checkpointer:
    """The unbound checkpointer over this test's backend."""
    return Checkpointer(backend)


@pytest.fixture
def saver(base: Checkpointer) -> Checkpointer:
    """A checkpointer bound to a fresh user."""
    return base.for_user(f"u-{uuid.uuid4().hex}")


def thread(**extra: Any) -> RunnableConfig:
    """A config naming a fresh thread (plus any extra configurable keys)."""
    return {"configurable": {"thread_id": f"t-{uuid.uuid4().hex[:8]}", **extra}}


def test_multi_step_loop(saver: Any) -> None:
    graph = loop_graph(saver, limit=5)
    config = thread()
    assert graph.invoke({"count": 0, "trail": []}, config) == {
        "count": 5,
        "trail": [0, 1, 2, 3, 4],
    }
    state = graph.get_state(config)
    assert state.values == {"count": 5, "trail": [0, 1, 2, 3, 4]}
    assert state.next == ()
    assert state.config["configurable"]["thread_id"] == config["configurable"]["thread_id"]
    assert state.metadata["step"] == 5
    # Running again on the same thread continues from the stored state.
    assert graph.invoke({"count": 3}, config)["trail"] == [0, 1, 2, 3, 4, 3, 4]


def test_interrupt_then_resume(saver: Any) -> None:
    graph = interrupt_graph(saver)
    config = thread()
    out = graph.invoke({"question": "6 x 7?"}, config)
    [intr] = out["__interrupt__"]
    assert intr.value == {"question": "6 x 7?"}

    state = graph.get_state(config)
    assert state.next == ("ask",)
    assert [i.value for t in state.tasks for i in t.interrupts] == [{"question": "6 x 7?"}]

    out = graph.invoke(Command(resume="42"), config)
    assert out == {"question": "6 x 7?", "answer": "42", "done": True}
    assert graph.get_state(config).next == ()


def _nested_snapshots(graph: Any, config: RunnableConfig) -> tuple[Any, Any, Any]:
    """The parent, child and grandchild snapshots of an interrupted nested run."""
    parent = graph.get_state(config, subgraphs=True)
    assert parent.next == ("child",)
    [child_task] = parent.tasks
    child = child_task.state
    assert child is not None and child.next == ("grand",)
    [grand_task] = child.tasks
    grand = grand_task.state
    assert grand is not None and grand.next == ("grand_ask",)
    return parent, child, grand


def _run_nested(graph: Any, config: RunnableConfig, durability: str) -> None:
    out = graph.invoke({"trail": []}, config, durability=durability)
    assert [i.value for i in out["__interrupt__"]] == ["grand asks"]

    parent, child, grand = _nested_snapshots(graph, config)
    assert parent.values == {"trail": ["parent_before"]}
    assert child.values == {"trail": ["parent_before", "child_before"]}
    assert grand.values == {"trail": ["parent_before", "child_before", "grand_before"]}
    ns = grand.config["configurable"]["checkpoint_ns"]
    assert ns.startswith("child:") and "|grand:" in ns, ns
    assert [i.value for i in grand.tasks[0].interrupts] == ["grand asks"]

    out = graph.invoke(Command(resume="yes"), config, durability=durability)
    assert out == {"trail": [s.format(answer="yes") for s in NESTED_DONE]}
    assert graph.get_state(config, subgraphs=True).next == ()


@pytest.mark.parametrize("durability", ["sync", "async", "exit"])
def test_nested_subgraph_interrupt(saver: Any, durability: str) -> None:
    """Bound view: the config carries only the thread id, also in sub-configs."""
    _run_nested(nested_graph(saver), thread(), durability)


def test_nested_subgraph_user_from_config(base: Any) -> None:
    """Unbound saver: the user comes from ``configurable.user_id``.

    ``get_state(subgraphs=True)`` rebuilds sub-configs without custom keys, so
    the caller names the user for those reads with ``acting_for``; the run
    itself carries ``user_id`` everywhere. Inside the first user's
    ``acting_for`` block a config naming another user is refused, as by a
    bound view; outside it, that user sees nothing on the same thread id.
    """
    graph = nested_graph(base)
    user = f"alice-{uuid.uuid4().hex[:6]}"
    config = thread(user_id=user)
    other: RunnableConfig = {"configurable": {**config["configurable"], "user_id": user + "2"}}
    with base.acting_for(user):
        _run_nested(graph, config, "sync")
        with pytest.raises(IsolationError):
            graph.get_state(other, subgraphs=True)
        with pytest.raises(IsolationError):
            list(graph.get_state_history(other))
    assert graph.get_state(other, subgraphs=True).values == {}
    assert list(graph.get_state_history(other)) == []
    # Outside the block the sub-configs fall back to the anonymous space: nothing there.
    bare: RunnableConfig = {"configurable": {"thread_id": config["configurable"]["thread_id"]}}
    assert graph.get_state(bare, subgraphs=True).values == {}


def test_send_fanout(saver: Any) -> None:
    graph = fanout_graph(saver)
    config = thread()
    out = graph.invoke({"items": [1, 2, 3, 4, 5, 6], "results": []}, config)
    assert sorted(out["results"]) == [1, 4, 9, 16, 25, 36]
    state = graph.get_state(config)
    assert sorted(state.values["results"]) == [1, 4, 9, 16, 25, 36]
    # The fan-out superstep's checkpoint held six pending Send packets.
    steps = {s.metadata["step"]: s for s in graph.get_state_history(config)}
    assert len(steps[0].tasks) == 6
    assert {t.name for t in steps[0].tasks} == {"square"}


def test_state_history(saver: Any) -> None:
    graph = loop_graph(saver, limit=3)
    config = thread()
    graph.invoke({"count": 0, "trail": []}, config)
    history = list(graph.get_state_history(config))
    assert [s.metadata["step"] for s in history] == [3, 2, 1, 0, -1]
    assert [s.values.get("count") for s in history] == [3, 2, 1, 0, None]
    assert [s.metadata["source"] for s in history] == ["loop"] * 4 + ["input"]
    for newer, older in zip(history, history[1:]):
        assert newer.parent_config["configurable"]["checkpoint_id"] == (
            older.config["configurable"]["checkpoint_id"]
        )
    assert [s.metadata["step"] for s in graph.get_state_history(config, limit=2)] == [3, 2]
    before = history[1].config
    assert [s.metadata["step"] for s in graph.get_state_history(config, before=before)] == [
        1,
        0,
        -1,
    ]
    assert [s.metadata["step"] for s in graph.get_state_history(config, filter={"step": 1})] == [1]


def test_update_state_fork_and_time_travel(saver: Any) -> None:
    graph = loop_graph(saver, limit=5)
    config = thread()
    graph.invoke({"count": 0, "trail": []}, config)
    by_count = {s.values.get("count"): s for s in graph.get_state_history(config)}

    # Fork: change the past, then continue from the fork.
    old = by_count[1]
    fork_config = graph.update_state(old.config, {"count": 3})
    assert fork_config["configurable"]["thread_id"] == config["configurable"]["thread_id"]
    fork = graph.get_state(fork_config)
    assert fork.parent_config["configurable"]["checkpoint_id"] == (
        old.config["configurable"]["checkpoint_id"]
    )
    assert fork.values == {"count": 3, "trail": [0]}
    assert graph.invoke(None, fork_config) == {"count": 5, "trail": [0, 3, 4]}
    assert graph.get_state(config).values == {"count": 5, "trail": [0, 3, 4]}

    # Time travel: replay from an older checkpoint of the original branch.
    past = by_count[2]
    assert graph.invoke(None, past.config) == {"count": 5, "trail": [0, 1, 2, 3, 4]}
    latest = graph.get_state(config)
    assert latest.values == {"count": 5, "trail": [0, 1, 2, 3, 4]}
    replayed = [s for s in graph.get_state_history(config) if s.parent_config]
    children_of_past = [
        s
        for s in replayed
        if s.parent_config["configurable"]["checkpoint_id"]
        == past.config["configurable"]["checkpoint_id"]
    ]
    assert len(children_of_past) == 2  # the original step and the replayed one
    # The original branch is still intact.
    assert graph.get_state(by_count[4].config).values == {"count": 4, "trail": [0, 1, 2, 3]}


async def test_ainvoke_and_astream(saver: Any) -> None:
    graph = loop_graph(saver, limit=4)
    config = thread()
    assert await graph.ainvoke({"count": 0, "trail": []}, config) == {
        "count": 4,
        "trail": [0, 1, 2, 3],
    }
    assert (await graph.aget_state(config)).values["count"] == 4
    assert [s.metadata["step"] async for s in graph.aget_state_history(config)] == [
        4,
        3,
        2,
        1,
        0,
        -1,
    ]

    config2 = thread()
    counts = [
        chunk["count"]
        async for chunk in graph.astream({"count": 1, "trail": []}, config2, stream_mode="values")
    ]
    assert counts == [1, 2, 3, 4]

    igraph = interrupt_graph(saver)
    config3 = thread()
    out = await igraph.ainvoke({"question": "q"}, config3)
    assert out["__interrupt__"][0].value == {"question": "q"}
    assert (await igraph.ainvoke(Command(resume="a"), config3))["answer"] == "a"


def test_sync_methods_inside_running_loop(saver: Any) -> None:
    """Sync saver calls and ``invoke`` from a thread whose event loop is running."""
    results: dict[str, Any] = {}

    async def main() -> None:
        graph = loop_graph(saver, limit=3)
        config = thread()
        results["out"] = graph.invoke({"count": 0, "trail": []}, config)
        tup = saver.get_tuple(config)
        results["step"] = tup.metadata["step"]
        results["listed"] = len(list(saver.list(config)))
        results["state"] = graph.get_state(config).values

    worker = threading.Thread(target=lambda: asyncio.run(main()), daemon=True)
    worker.start()
    worker.join(timeout=30)
    assert not worker.is_alive(), "sync saver methods deadlocked inside a running event loop"
    assert results == {
        "out": {"count": 3, "trail": [0, 1, 2]},
        "step": 3,
        "listed": 5,
        "state": {"count": 3, "trail": [0, 1, 2]},
    }


def test_two_users_same_thread(base: Any) -> None:
    tid = f"t-{uuid.uuid4().hex[:8]}"
    alice = loop_graph(base.for_user("alice"), limit=3)
    alice2 = loop_graph(base.for_user("alice2"), limit=5)
    config: RunnableConfig = {"configurable": {"thread_id": tid}}

    alice.invoke({"count": 0, "trail": []}, config)
    assert alice2.get_state(config).values == {}
    assert list(alice2.get_state_history(config)) == []

    alice2.invoke({"count": 1, "trail": []}, config)
    assert alice.get_state(config).values == {"count": 3, "trail": [0, 1, 2]}
    assert alice2.get_state(config).values == {"count": 5, "trail": [1, 2, 3, 4]}
    assert len(list(alice.get_state_history(config))) == 5
    assert len(list(alice2.get_state_history(config))) == 6

    # The same two users named through configurable.user_id on the unbound saver.
    unbound = loop_graph(base, limit=3)
    as_alice: RunnableConfig = {"configurable": {"thread_id": tid, "user_id": "alice"}}
    as_bob: RunnableConfig = {"configurable": {"thread_id": tid, "user_id": "bob"}}
    assert unbound.get_state(as_alice).values == {"count": 3, "trail": [0, 1, 2]}
    assert unbound.get_state(as_bob).values == {}
    # Time travel with another user's checkpoint id finds nothing to resume.
    foreign = alice.get_state(config).config["configurable"]["checkpoint_id"]
    assert unbound.get_state(
        {"configurable": {"thread_id": tid, "user_id": "bob", "checkpoint_id": foreign}}
    ).values == {}
