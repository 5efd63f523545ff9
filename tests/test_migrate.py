"""``checkpointers migrate`` from LangGraph's own savers, then a resume under ours.

A real compiled graph runs to an ``interrupt()`` on ``SqliteSaver`` (a file),
``PostgresSaver`` (the local server, a throwaway schema) and the plain-Redis
saver (the test Redis, a throwaway prefix). The thread is migrated with the
command line into our SQLite and our Redis checkpointers, then resumed with
``Command(resume=...)`` on both sides: the final state, the result and the
length of ``get_state_history`` must be the same, and every checkpoint id
from before the migration is kept.
"""

from __future__ import annotations

import operator
import os
import sqlite3
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Annotated, Any

import pytest
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Command, interrupt
from typing_extensions import TypedDict

from checkpointers.cli import main
from checkpointers.savers import Checkpointer
from tests.graph_apps import nested_graph

USER = "alice"
THREAD = "thread-1"


class WorkState(TypedDict, total=False):
    n: int
    notes: Annotated[list[str], operator.add]
    answer: str


def work_graph(checkpointer: BaseCheckpointSaver[Any]) -> CompiledStateGraph:
    """Three ``work`` steps (one writes a 4 KiB note: a blob of its own), then ``ask`` interrupts, then ``finish``."""

    def work(state: WorkState) -> dict[str, Any]:
        n = state.get("n", 0) + 1
        return {"n": n, "notes": [f"step {n}" + ("x" * 4096 if n == 2 else "")]}

    def ask(state: WorkState) -> dict[str, Any]:
        return {"answer": interrupt({"question": f"after {state['n']} steps?"})}

    def finish(state: WorkState) -> dict[str, Any]:
        return {"notes": [f"answered {state['answer']}"]}

    builder = StateGraph(WorkState)
    builder.add_node("work", work)
    builder.add_node("ask", ask)
    builder.add_node("finish", finish)
    builder.add_edge(START, "work")
    builder.add_conditional_edges("work", lambda s: "work" if s["n"] < 3 else "ask", ["work", "ask"])
    builder.add_edge("ask", "finish")
    builder.add_edge("finish", END)
    return builder.compile(checkpointer=checkpointer)


GRAPHS: dict[str, tuple[Callable[[BaseCheckpointSaver[Any]], CompiledStateGraph], dict[str, Any]]] = {
    "loop+interrupt": (work_graph, {"n": 0}),
    "nested subgraphs": (nested_graph, {"trail": []}),
}
CONFIG: Any = {"configurable": {"thread_id": THREAD}}


# -- the sources: LangGraph's savers ------------------------------------------------


@contextmanager
def sqlite_saver(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[BaseCheckpointSaver[Any], str]]:
    from langgraph.checkpoint.sqlite import SqliteSaver

    path = tmp_path / "langgraph.db"
    conn = sqlite3.connect(path, check_same_thread=False)
    try:
        yield SqliteSaver(conn), f"langgraph+sqlite:///{path}"
    finally:
        conn.close()


@contextmanager
def postgres_saver(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[BaseCheckpointSaver[Any], str]]:
    import psycopg
    from langgraph.checkpoint.postgres import PostgresSaver
    from psycopg.rows import dict_row

    url = _postgres_url()
    schema = f"cli_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(f"CREATE SCHEMA {schema}")
        scoped = f"{url}{'&' if '?' in url else '?'}options=-csearch_path%3D{schema}"
        try:
            with psycopg.connect(scoped, autocommit=True, prepare_threshold=0, row_factory=dict_row) as conn:
                saver = PostgresSaver(conn)  # type: ignore[arg-type]
                saver.setup()
                yield saver, "langgraph+" + scoped
        finally:
            admin.execute(f"DROP SCHEMA {schema} CASCADE")


@contextmanager
def plainredis_saver(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[BaseCheckpointSaver[Any], str]]:
    import redis
    from langgraph_checkpoint_plainredis import RedisSaver

    url = request.getfixturevalue("redis_url")
    prefix = f"lgcli{uuid.uuid4().hex[:10]}"
    client = redis.Redis.from_url(url)
    try:
        yield (
            RedisSaver(client, prefix=prefix),
            url.replace("redis://", "langgraph+plainredis://", 1) + f"?prefix={prefix}",
        )
    finally:
        _delete_keys(client, f"{prefix}:*")
        client.close()


def _postgres_url() -> str:
    """``POSTGRES_URL``, else the local server (database ``test``); skip (fail under CI) without one."""
    import psycopg

    url = os.environ.get("POSTGRES_URL") or "postgresql://postgres@127.0.0.1:5432/test"
    try:
        psycopg.connect(url, connect_timeout=3).close()
    except psycopg.Error as exc:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"PostgreSQL is required under CI=true: {exc}", pytrace=False)
        pytest.skip(f"no PostgreSQL at {url} (set POSTGRES_URL): {exc}")
    return url


SOURCES: dict[str, Callable[..., AbstractContextManager[tuple[BaseCheckpointSaver[Any], str]]]] = {
    "SqliteSaver": sqlite_saver,
    "PostgresSaver": postgres_saver,
    "plainredis": plainredis_saver,
}


def _delete_keys(client: Any, pattern: str) -> None:
    keys = list(client.scan_iter(match=pattern, count=500))
    if keys:
        client.delete(*keys)


# -- the destinations: ours ---------------------------------------------------------


@pytest.fixture(params=["sqlite", "redis"])
def destination(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'ours.db'}"
        return
    import redis

    url = request.getfixturevalue("redis_url")
    prefix = f"cli{uuid.uuid4().hex[:10]}"
    yield f"{url}?prefix={prefix}"
    client = redis.Redis.from_url(url)
    _delete_keys(client, f"{prefix}*")
    client.close()


def finish(graph: CompiledStateGraph) -> tuple[Any, Any, list[str]]:
    """Resume the interrupted thread; the result, the final values and every checkpoint id of its history."""
    result = graph.invoke(Command(resume="yes"), CONFIG)
    history = [s.config["configurable"]["checkpoint_id"] for s in graph.get_state_history(CONFIG)]
    return result, graph.get_state(CONFIG).values, history


@pytest.mark.parametrize("graph_name", list(GRAPHS))
@pytest.mark.parametrize("source_name", list(SOURCES))
def test_migrated_thread_resumes_like_the_original(
    source_name: str, graph_name: str, destination: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    build, start = GRAPHS[graph_name]
    with SOURCES[source_name](tmp_path, request) as (theirs, src_url):
        graph = build(theirs)
        graph.invoke(start, CONFIG)
        assert graph.get_state(CONFIG).interrupts, "the run must stop at its interrupt"
        before = [s.config["configurable"]["checkpoint_id"] for s in graph.get_state_history(CONFIG)]

        assert main(["migrate", src_url, destination, "--user", USER, "--quiet"]) == 0

        reference = finish(graph)
    with Checkpointer.from_url(destination) as ours:
        migrated = build(ours.for_user(USER))
        assert [s.config["configurable"]["checkpoint_id"] for s in migrated.get_state_history(CONFIG)] == before
        result, values, history = finish(migrated)
        assert ours.for_user("someone-else").get_tuple(CONFIG) is None  # --user owns the thread
    assert (result, values) == reference[:2]
    assert len(history) == len(reference[2])
    assert history[-len(before) :] == before  # the migrated checkpoints, ids kept, under the new ones


def test_migrate_twice_changes_nothing_and_keeps_task_paths(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Running a migration again writes nothing new; the writes keep task id, task path and index."""
    from langgraph.checkpoint.sqlite import SqliteSaver

    path = tmp_path / "langgraph.db"
    with sqlite3.connect(path, check_same_thread=False) as conn:
        work_graph(SqliteSaver(conn)).invoke({"n": 0}, CONFIG)
        stored = sorted(conn.execute("SELECT checkpoint_id, task_id, task_path, idx, channel FROM writes").fetchall())
    dst = f"sqlite:///{tmp_path / 'ours.db'}"
    for _ in range(2):
        assert main(["migrate", f"langgraph+sqlite:///{path}", dst, "--user", USER, "--quiet", "--json"]) == 0
    with Checkpointer.from_url(dst) as ours:
        from checkpointers.cli._inspect import task_writes
        from checkpointers.cli._scan import thread_partitions

        (p,) = thread_partitions(ours.backend, USER)
        moved = sorted(
            (t.config["configurable"]["checkpoint_id"], task, path_, idx, channel)
            for t in ours.for_user(USER).list(CONFIG)
            for path_, task, idx, channel, _ in task_writes(ours, p, "", t.config["configurable"]["checkpoint_id"])
        )
        assert main(["verify", dst, "--user", USER, "--json", "--quiet"]) == 0
    assert moved == stored
    assert any(row[2] for row in stored), "the graph's writes carry task paths"
