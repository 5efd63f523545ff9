"""Thread leases of the LangGraph saver: ``saver.lease``, fenced writes, the recovery scan.

In-process tests use real compiled graphs over real backends and an
injectable clock (:class:`tests.lease_helpers.FakeClock`) to expire leases
without waiting. The cross-process tests run ``python -m checkpointers.fleet_demo
worker`` processes (the relay graph, one step per superstep) against one store:
SIGSTOP of a holder past its ttl, two workers started at once, kill -9 of
the holder and recovery by a fresh process.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from checkpointers import LeaseHeldError, LeaseLostError
from checkpointers._flows import run
from checkpointers.backends import Backend
from checkpointers.fleet_demo import finish, relay_graph, spawn, wait_for
from checkpointers.leases import LeaseSite, read_flow
from checkpointers.savers import Checkpointer, MemoryCheckpointer
from tests.graph_apps import loop_graph, open_saver
from tests.lease_helpers import FakeClock
from tests.test_sigkill import store_url

ROOT = Path(__file__).resolve().parent.parent
#: The SIGSTOP test runs on SQLite and S3 over HTTP (Redis, PostgreSQL under --deep), the others on SQLite
#: (Redis too under --deep): a worker process starts in 2-3 s on this machine.
DEEP = pytest.mark.deep


def cfg(thread: str) -> Any:
    return {"configurable": {"thread_id": thread}}


def one_chain(saver: Checkpointer, thread: str) -> list[Any]:
    """The thread's checkpoints oldest first, after checking no checkpoint has two children."""
    tuples = list(saver.list(cfg(thread)))
    parents = Counter(t.parent_config["configurable"]["checkpoint_id"] for t in tuples if t.parent_config)
    assert all(n == 1 for n in parents.values()), f"forked history: {parents}"
    assert sum(1 for t in tuples if t.parent_config is None) == 1
    return list(reversed(tuples))


@pytest.fixture(params=["memory", "sqlite", "redis"])
def lease_backend(request: pytest.FixtureRequest) -> Backend:
    return request.getfixturevalue(f"{request.param}_backend")  # type: ignore[no-any-return]


def savers(backend: Backend, clock: FakeClock, user: str = "alice") -> tuple[Checkpointer, Checkpointer]:
    """Two workers' savers (as two processes would have) on one backend and one clock."""
    return (
        Checkpointer(backend, clock=clock).for_user(user),
        Checkpointer(backend, clock=clock).for_user(user),
    )


# -- in process ------------------------------------------------------------------


def test_second_worker_is_refused_before_any_node(lease_backend: Backend, tmp_path: Path) -> None:
    a, b = savers(lease_backend, FakeClock())
    graph_a, graph_b = relay_graph(a, tmp_path, "A", 3), relay_graph(b, tmp_path, "B", 3)
    with a.lease("t", owner="A", ttl=60) as held:
        with pytest.raises(LeaseHeldError) as refused, b.lease("t", owner="B", ttl=60):
            graph_b.invoke({"count": 0, "trail": []}, cfg("t"))
        assert refused.value.owner == "A"  # type: ignore[attr-defined]
        with pytest.raises(LeaseHeldError):  # a write outside any lease block: refused by default
            graph_b.invoke({"count": 0, "trail": []}, cfg("t"), durability="sync")
        out = graph_a.invoke({"count": 0, "trail": []}, cfg("t"))
        assert held.token > 0
    assert out["trail"] == [["A", 1], ["A", 2], ["A", 3]]
    assert (tmp_path / "exec").read_text().split("\n")[:-1] == ["A 1", "A 2", "A 3"]


def test_takeover_fences_the_stale_holder(lease_backend: Backend, tmp_path: Path) -> None:
    clock = FakeClock()
    a, b = savers(lease_backend, clock)
    graph_a, graph_b = relay_graph(a, tmp_path, "A", 4), relay_graph(b, tmp_path, "B", 4)
    with pytest.raises(LeaseLostError), a.lease("t", owner="A", ttl=10) as held_a:
        graph_a.invoke({"count": 0, "trail": []}, cfg("t"), interrupt_after=["step"])
        graph_a.invoke(None, cfg("t"), interrupt_after=["step"])
        stale = graph_a.get_state(cfg("t")).config  # where A stands when it "pauses" past its ttl
        clock.advance(11)
        assert [i.scope for i in b.expired_leases()] == ["t"]
        with b.lease("t", owner="B", ttl=10) as held_b:
            assert held_b.token > held_a.token
            out = graph_b.invoke(None, cfg("t"))
        # A wakes and goes on from where it was: its step-3 writes (LangGraph's background
        # put_writes) and checkpoint would fork the history; they are fenced out.
        graph_a.invoke(None, stale, durability="async")
    assert out["trail"] == [["A", 1], ["A", 2], ["B", 3], ["B", 4]]
    chain = one_chain(b, "t")
    assert [t.checkpoint["channel_values"].get("trail") for t in chain][-1] == out["trail"]
    assert b.get_tuple(cfg("t")).checkpoint["id"] == chain[-1].checkpoint["id"]


def test_unleased_allow_writes_without_looking(lease_backend: Backend, tmp_path: Path) -> None:
    clock = FakeClock()
    holder = Checkpointer(lease_backend, clock=clock).for_user("u")
    loose = Checkpointer(lease_backend, clock=clock, unleased="allow").for_user("u")
    with holder.lease("t", owner="A", ttl=60):
        assert loop_graph(loose, limit=2).invoke({"count": 0, "trail": []}, cfg("t"))["count"] == 2


def pause_renewals(held: Any) -> None:
    """Stop a holder's renewal thread (what SIGSTOP does to it)."""
    held._stop.set()
    held._thread.join()


def resume_renewals(held: Any) -> None:
    """Start its renewal loop again (SIGCONT)."""
    held._stop.clear()
    held._thread = threading.Thread(target=held._renew_loop, daemon=True)
    held._thread.start()


def test_renewal_extends_the_stored_expiry(lease_backend: Backend) -> None:
    saver = Checkpointer(lease_backend).for_user("u")
    site = LeaseSite(saver.integrity, saver._partition(None, "t"), "t")
    with saver.lease("t", owner="A", ttl=0.3) as held:
        first = held.lease.expires_at
        wait_for(lambda: held.renewals >= 2, "two renewals")
        stored = run(read_flow(site), lease_backend)
        assert stored is not None and stored.token == held.token and stored.expires_ms / 1000 > first
    assert saver.expired_leases() == []


def test_a_renewal_that_finds_a_takeover_fences_the_next_write(lease_backend: Backend) -> None:
    clock = FakeClock()
    a, b = savers(lease_backend, clock)
    writes: list[object] = []
    with pytest.raises(LeaseLostError), a.lease("t", owner="A", ttl=0.3) as held:
        pause_renewals(held)
        clock.advance(1)
        with b.lease("t", owner="B", ttl=30):
            resume_renewals(held)
            wait_for(lambda: held.lost is not None, "A's renewal to find B")
            original = lease_backend.write
            lease_backend.write = lambda *args: writes.append(args) or original(*args)  # type: ignore[method-assign]
            try:
                loop_graph(a, limit=1).invoke({"count": 0, "trail": []}, cfg("t"))
            finally:
                del lease_backend.write
    assert writes == []  # refused before any I/O of the write


def test_leases_are_per_user_and_go_with_the_thread(lease_backend: Backend) -> None:
    clock = FakeClock()
    saver = Checkpointer(lease_backend, clock=clock)
    alice, bob = saver.for_user("alice"), saver.for_user("bob")
    abandoned = alice.lease("t", owner="A", ttl=5)
    abandoned.__enter__()  # a holder that crashes: never released
    abandoned._stop.set()
    with bob.lease("t", owner="B", ttl=5):  # same thread id, other user: its own lease
        loop_graph(bob, limit=1).invoke({"count": 0, "trail": []}, cfg("t"))
    loop_graph(alice, limit=1).invoke({"count": 0, "trail": []}, cfg("t"))  # this saver holds alice's lease
    clock.advance(6)
    assert [i.scope for i in alice.expired_leases()] == ["t"]
    assert bob.expired_leases() == []
    alice.copy_thread("t", "t2")
    assert run(read_flow(LeaseSite(saver.integrity, alice._partition(None, "t2"), "t2")), lease_backend) is None
    saver.leases.drop(abandoned.site.partition, abandoned)
    alice.delete_thread("t")
    assert alice.expired_leases() == []
    with alice.lease("t", owner="C", ttl=5) as again:
        assert again.token > abandoned.token  # the clock floor keeps tokens rising across the delete


def test_async_lease_renews_on_the_loop(lease_backend: Backend, tmp_path: Path) -> None:
    async def main() -> None:
        a = Checkpointer(lease_backend).for_user("u")
        b = Checkpointer(lease_backend).for_user("u")
        async with a.alease("t", owner="A", ttl=0.3) as held:
            with pytest.raises(LeaseHeldError):
                async with b.alease("t", owner="B", ttl=5):
                    pass
            out = await relay_graph(a, tmp_path, "A", 2).ainvoke({"count": 0, "trail": []}, cfg("t"))
            while held.renewals < 2:
                await asyncio.sleep(0.02)
        assert out["count"] == 2
        assert await b.aexpired_leases() == []  # released on exit

    asyncio.run(main())


def test_one_lease_block_per_thread_per_saver() -> None:
    saver = MemoryCheckpointer().for_user("u")
    with saver.lease("t", owner="A", ttl=5), pytest.raises(LeaseHeldError):
        with saver.for_user("u").lease("t", owner="A", ttl=5):
            pass


def test_retention_options_reach_the_backend(tmp_path: Path, redis_url: str) -> None:
    from checkpointers.savers import RedisCheckpointer, SqliteCheckpointer

    made = [
        MemoryCheckpointer(ttl=3600, refresh_on_read=True),
        SqliteCheckpointer(tmp_path / "r.db", ttl=3600, refresh_on_read=True, user="u"),
        RedisCheckpointer(redis_url, ttl=3600, refresh_on_read=True, prefix=f"t-{uuid.uuid4().hex[:8]}"),
        Checkpointer.from_url(f"sqlite:///{tmp_path}/u.db", ttl=3600, refresh_on_read=True),
    ]
    for saver in made:
        retention = saver.backend.retention
        assert (retention.ttl, retention.refresh_on_read) == (3600, True), saver
        saver.close()
    assert made[1].user == "u"  # the saver's own options still reach the saver
    assert MemoryCheckpointer().backend.retention.ttl is None


# -- across processes ---------------------------------------------------------------


def executions(d: Path) -> list[str]:
    return (d / "exec").read_text().splitlines()


@pytest.fixture
def fleet(backend: Backend, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Checkpointer]]:
    url = store_url(backend, request)
    saver = open_saver(url).for_user("fleet")
    yield url, saver
    saver.close()


@pytest.mark.parametrize(
    "backend_name", ["sqlite", "s3_http", pytest.param("redis", marks=DEEP), pytest.param("postgres", marks=DEEP)]
)
def test_sigstop_holder_is_fenced_after_takeover(fleet: tuple[str, Checkpointer], tmp_path: Path) -> None:
    url, saver = fleet
    thread = f"t-{uuid.uuid4().hex[:8]}"
    a = spawn(url, tmp_path, thread, "A", "--ttl", "2", "--pause-at", "3")
    try:
        wait_for(lambda: (tmp_path / "at-3").exists(), "A in step 3")
        os.kill(a.pid, signal.SIGSTOP)
        wait_for(lambda: [i for i in saver.expired_leases() if i.scope == thread], "A's lease to expire")
        rc_b, b = finish(spawn(url, tmp_path, thread, "B", "--ttl", "2"))
    finally:
        os.kill(a.pid, signal.SIGCONT)
    rc_a, got_a = finish(a)
    assert (rc_b, b["status"], rc_a, got_a["status"]) == (0, "done", 3, "lost")
    assert b["token"] > got_a["token"]
    final = [["A", 1], ["A", 2], ["B", 3], ["B", 4], ["B", 5]]
    assert b["trail"] == final
    chain = one_chain(saver, thread)
    trails = [t.checkpoint["channel_values"].get("trail", []) for t in chain]
    assert trails[-1] == final and all(final[: len(tr)] == tr for tr in trails)
    assert executions(tmp_path) == ["A 1", "A 2", "A 3", "B 3", "B 4", "B 5"]


@pytest.mark.parametrize("backend_name", ["sqlite", pytest.param("redis", marks=DEEP)])
def test_two_workers_at_once_exactly_one_runs(fleet: tuple[str, Checkpointer], tmp_path: Path) -> None:
    url, saver = fleet
    thread = f"t-{uuid.uuid4().hex[:8]}"
    procs = [spawn(url, tmp_path, thread, o, "--go", "--pause-at", "1", steps=2) for o in ("A", "B")]
    wait_for(lambda: all((tmp_path / f"ready-{o}").exists() for o in "AB"), "both workers ready")
    (tmp_path / "go").touch()
    results = sorted((finish(p) for p in procs), key=lambda r: r[0])
    (rc_win, win), (rc_lose, lose) = results
    assert (rc_win, win["status"], rc_lose, lose["status"]) == (0, "done", 4, "held")
    assert lose["token"] is None
    assert executions(tmp_path) == [f"{win['owner']} 1", f"{win['owner']} 2"]
    assert len(one_chain(saver, thread)) == 4  # input, then step 1 and 2 of one worker


@pytest.mark.parametrize("backend_name", ["sqlite", pytest.param("redis", marks=DEEP)])
def test_kill_9_then_a_fresh_process_recovers(fleet: tuple[str, Checkpointer], tmp_path: Path) -> None:
    url, saver = fleet
    thread = f"t-{uuid.uuid4().hex[:8]}"
    a = spawn(url, tmp_path, thread, "A", "--ttl", "2", "--pause-at", "3")
    wait_for(lambda: (tmp_path / "at-3").exists(), "A in step 3")
    os.kill(a.pid, signal.SIGKILL)
    a.communicate(timeout=30)
    wait_for(lambda: [i for i in saver.expired_leases() if i.scope == thread], "A's lease to expire")
    rc, b = finish(spawn(url, tmp_path, thread, "B", "--recover"))
    assert (rc, b["status"]) == (0, "done")
    assert b["trail"] == [["A", 1], ["A", 2], ["B", 3], ["B", 4], ["B", 5]]
    assert executions(tmp_path) == ["A 1", "A 2", "A 3", "B 3", "B 4", "B 5"]  # saved steps did not run again
    one_chain(saver, thread)


# -- Agent Framework: a workflow run on IsolatedCheckpointStorage ------------------------------

COUNTDOWN = 6


def af_chain(checkpoints: list[Any]) -> None:
    """No checkpoint is the previous one of two others (one chain of saves)."""
    previous = Counter(c.previous_checkpoint_id for c in checkpoints if c.previous_checkpoint_id)
    assert all(n == 1 for n in previous.values()), f"forked run: {previous}"


def test_agent_framework_run_lease_fences_the_stale_worker(lease_backend: Backend) -> None:
    from adapters.agent_framework import IsolatedCheckpointStorage

    async def main() -> None:
        clock = FakeClock()
        a = IsolatedCheckpointStorage(lease_backend, user="alice", clock=clock)
        b = IsolatedCheckpointStorage(lease_backend, user="alice", clock=clock)
        name = f"wf-{uuid.uuid4().hex[:8]}"
        with pytest.raises(LeaseLostError):  # on exit: A's release finds B's lease
            async with a.lease("run-1", owner="A", ttl=10) as held_a:
                await a_then_b(a, b, held_a, name)

    asyncio.run(main())


async def a_then_b(a: Any, b: Any, held_a: Any, name: str) -> None:
    """A's run stops mid-way, B takes it over after A's ttl and finishes it, A's later saves are refused."""
    from adapters.agent_framework import IsolatedCheckpointStorage
    from tests.af_workflows import CrashError, countdown_workflow

    with pytest.raises(LeaseHeldError):  # before any executor runs
        async with b.lease("run-1", owner="B", ttl=10):
            pass
    with pytest.raises(CrashError):  # A stops mid-run (stands for a pause past its ttl)
        await countdown_workflow(name, a, crash_at=3).run(COUNTDOWN)
    stale = await a.get_latest(workflow_name=name)
    a.leases.clock.advance(11)
    assert [i.scope for i in await b.aexpired_leases()] == ["run-1"]
    assert IsolatedCheckpointStorage(a.backend, user="bob").expired_leases() == []
    async with b.lease("run-1", owner="B", ttl=10) as held_b:
        assert held_b.token > held_a.token
        latest = await b.get_latest(workflow_name=name)
        outputs = (await countdown_workflow(name, b).run(checkpoint_id=latest.checkpoint_id)).get_outputs()
    assert outputs == [3, 2, 1, 0]
    saved = len(await b.list_checkpoint_ids(workflow_name=name))
    # A wakes and goes on from where it was: its saves are refused (logged by the framework).
    await countdown_workflow(name, a).run(checkpoint_id=stale.checkpoint_id)
    with pytest.raises(Exception) as refused:
        a.raise_if_refused()
    assert isinstance(refused.value.__cause__, LeaseLostError)
    assert len(await b.list_checkpoint_ids(workflow_name=name)) == saved
    af_chain(await b.list_checkpoints(workflow_name=name))
