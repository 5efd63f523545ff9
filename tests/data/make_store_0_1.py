"""Writes ``tests/data/store-0.1.db``: a SQLite store as checkpointers 0.1 (commit a9eed74) wrote it.

Records written before seals existed carry a bare SHA-256 digest;
``tests/test_adversarial.py`` checks that today's code reads all of this store
without an integrity key, and refuses it with one unless ``accept_unsealed=True``.
This module is also imported by that test for the graph and the expected
contents (:data:`EXPECTED`), so the two cannot drift apart.

How the committed file was made (run with the 0.1 library, not today's)::

    git worktree add /tmp/old a9eed74
    PYTHONPATH=/tmp/old .venv/bin/python tests/data/make_store_0_1.py tests/data/store-0.1.db
    git worktree remove /tmp/old

Everything is deterministic except the SQLite file's own bytes (etags are random).
"""

from __future__ import annotations

import asyncio
import operator
import sqlite3
import sys
from pathlib import Path
from typing import Annotated, Any, TypedDict

USER, OTHER = "alice", "bob"
SCOPE = "runs/r1"
DIRECT_THREAD, GRAPH_THREAD = "direct-thread", "graph-thread"
#: Checkpoint ids of the direct thread: uuid6-shaped strings that sort by time, as LangGraph's do.
CHECKPOINT_IDS = [f"1f0a0000-0000-6000-8000-00000000000{i}" for i in range(3)]
BIG = "x" * 5000  # over the saver's inline limit: stored as a blob
AF_WORKFLOW = "wf-0.1"
AF_IDS = ["af-0.1-first", "af-0.1-second"]
TS = "2025-06-01T12:00:00+00:00"

EXPECTED: dict[str, Any] = {
    "items": {  # key -> (value, tags)
        "plan": ({"todo": 2}, {"kind": "plan"}),
        "raw": (b"\x00\xffraw", {"kind": "raw", "owner": "alice"}),
        "cursor": (7, {}),
        "steps/1": ({"fetched": 10}, {}),
        "steps/2": ({"fetched": 20}, {"kind": "step"}),
    },
    "other_items": {"plan": ({"todo": "bob's"}, {"kind": "plan"})},
    "direct": {
        # checkpoint id -> channel values
        CHECKPOINT_IDS[0]: {"n": 0, "big": BIG},
        CHECKPOINT_IDS[1]: {"n": 1, "big": BIG},
        CHECKPOINT_IDS[2]: {"n": 2, "big": BIG, "note": "small"},
    },
    "direct_writes": [  # on the latest checkpoint, in LangGraph's order
        ("task-a", "n", 3),
        ("task-a", "note", "written"),
        ("task-b", "__error__", "boom"),
    ],
    "graph_final": {"n": 3, "log": ["start", "step", "step", "step"]},
}


class GraphState(TypedDict):
    n: int
    log: Annotated[list[str], operator.add]
    big: str


def build_graph(checkpointer: Any) -> Any:
    """A loop that counts ``n`` up to 3, appending to ``log``; ``big`` makes one blob."""
    from langgraph.graph import END, START, StateGraph

    def start(state: GraphState) -> dict[str, Any]:
        return {"log": ["start"], "big": BIG}

    def step(state: GraphState) -> dict[str, Any]:
        return {"n": state["n"] + 1, "log": ["step"]}

    builder = StateGraph(GraphState)
    builder.add_node("start", start)
    builder.add_node("step", step)
    builder.add_edge(START, "start")
    builder.add_edge("start", "step")
    builder.add_conditional_edges("step", lambda s: END if s["n"] >= 3 else "step")
    return builder.compile(checkpointer=checkpointer)


def _version(n: int) -> str:
    return f"{n:032}.0"


def _checkpoint(cid: str, values: dict[str, Any], versions: dict[str, str]) -> dict[str, Any]:
    return {
        "v": 4,
        "id": cid,
        "ts": TS,
        "channel_values": values,
        "channel_versions": versions,
        "versions_seen": {},
        "updated_channels": sorted(values),
    }


def write_store(path: str) -> None:
    from agent_framework import WorkflowCheckpoint

    from adapters.agent_framework import IsolatedCheckpointStorage
    from checkpointers import Store
    from checkpointers.backends.sqlite import SqliteBackend
    from checkpointers.savers import Checkpointer

    with SqliteBackend(path) as backend:
        store = Store(backend).for_user(USER)
        plan = store.create_item(SCOPE, "plan", {"todo": 3}, tags={"kind": "plan"})
        store.set_item(SCOPE, "plan", {"todo": 2}, tags={"kind": "plan"}, if_match=plan.etag)
        store.set_item(SCOPE, "raw", b"\x00\xffraw", tags={"kind": "raw", "owner": "alice"})
        store.append_step(SCOPE, "1", {"fetched": 10})
        with store.batch(SCOPE) as batch:
            batch.append_step("2", {"fetched": 20}, tags={"kind": "step"}).set("cursor", 7)
        Store(backend).for_user(OTHER).set_item(SCOPE, "plan", {"todo": "bob's"}, tags={"kind": "plan"})

        saver = Checkpointer(backend).for_user(USER)
        config: dict[str, Any] = {"configurable": {"thread_id": DIRECT_THREAD, "checkpoint_ns": ""}}
        for i, cid in enumerate(CHECKPOINT_IDS):
            values = EXPECTED["direct"][cid]
            versions = {"n": _version(i + 1), "big": _version(1), **({"note": _version(1)} if "note" in values else {})}
            changed = {ch: versions[ch] for ch in (["n", "big"] if i == 0 else ["n", "note"] if i == 2 else ["n"])}
            metadata = {"source": "loop", "step": i, "run_id": "run-0.1", "parents": {}}
            config = saver.put(config, _checkpoint(cid, values, versions), metadata, changed)
        saver.put_writes(config, [("n", 3), ("note", "written")], "task-a", "path-a")
        saver.put_writes(config, [("__error__", "boom")], "task-b", "path-b")

        graph = build_graph(saver)
        graph.invoke({"n": 0, "log": []}, {"configurable": {"thread_id": GRAPH_THREAD}})

        async def af() -> None:
            storage = IsolatedCheckpointStorage(backend, user=USER)
            previous = None
            for i, cid in enumerate(AF_IDS):
                await storage.save(
                    WorkflowCheckpoint(
                        workflow_name=AF_WORKFLOW,
                        graph_signature_hash="0" * 64,
                        checkpoint_id=cid,
                        previous_checkpoint_id=previous,
                        timestamp=TS,
                        iteration_count=i,
                        state={"n": i, "owner": USER},
                    )
                )
                previous = cid
            await backend.aclose()  # the async connections belong to this event loop

        asyncio.run(af())
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=DELETE")  # one self-contained file, no -wal beside it
    conn.execute("VACUUM")
    conn.close()


if __name__ == "__main__":
    out = Path(sys.argv[1])
    if out.exists():
        sys.exit(f"{out} exists; remove it first")
    write_store(str(out))
    print(f"wrote {out} ({out.stat().st_size:,} bytes)")
