"""LangGraph isolation: two users of one store never see or change each other's threads.

The checks take ``saver_for``: a callable returning a LangGraph
``BaseCheckpointSaver`` that is *the same store seen as user X*. For our savers
that is ``Checkpointer(backend).for_user``; for another saver, whatever binds
it to a tenant. Every method is exercised, through the sync and the async API
(drawn per example): ``put``, ``put_writes``, ``get_tuple``, ``list`` (by
thread, by namespace, and ``list(None)``), ``delete_thread``,
``delete_for_runs``, ``copy_thread`` and ``prune``. Both users use the *same*
thread ids, namespaces, checkpoint ids and task ids, as if one guessed the
other's. A saver that does not implement one of the optional methods
(``NotImplementedError``) is not failed for it; the check's note names it.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from hypothesis import strategies as st

from .properties import run_property
from .strategies import distinct_pairs, namespaces, thread_ids, user_pairs

__all__ = ["LANGGRAPH_CHECKS", "check_langgraph_isolation", "SaverFor"]

#: ``saver_for(user)`` returns a saver bound to ``user`` over the shared store.
SaverFor = Callable[[str], Any]
_OPTIONAL = ("delete_for_runs", "copy_thread", "prune")


class _Lg:
    """One saver, called through its sync methods (on a thread) or its async ones."""

    def __init__(self, saver: Any, sync: bool, skipped: set[str]) -> None:
        self.saver, self.sync, self.skipped = saver, sync, skipped

    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        try:
            if self.sync:
                return await asyncio.to_thread(getattr(self.saver, method), *args, **kwargs)
            return await getattr(self.saver, "a" + method)(*args, **kwargs)
        except NotImplementedError:
            if method not in _OPTIONAL:
                raise
            self.skipped.add(method)
            return None

    async def list(self, config: dict[str, Any] | None) -> list[Any]:
        if self.sync:
            return await asyncio.to_thread(lambda: list(self.saver.list(config)))
        return [t async for t in self.saver.alist(config)]


def _config(thread: str, ns: str | None = "", checkpoint_id: str | None = None) -> dict[str, Any]:
    """A config; ``ns=None`` leaves the namespace out (``list`` then spans every one)."""
    conf: dict[str, Any] = {"thread_id": thread}
    if ns is not None:
        conf["checkpoint_ns"] = ns
    if checkpoint_id is not None:
        conf["checkpoint_id"] = checkpoint_id
    return {"configurable": conf}


def _checkpoint(checkpoint_id: str, value: str, version: Any) -> dict[str, Any]:
    return {
        "v": 1,
        "id": checkpoint_id,
        "ts": datetime.now(timezone.utc).isoformat(),
        "channel_values": {"ch": value},
        "channel_versions": {"ch": version},
        "versions_seen": {},
        "pending_sends": [],
        "updated_channels": None,
    }


def _seen(tuples: list[Any]) -> list[tuple[str, str, str, Any, Any]]:
    """What a user can observe of its checkpoints, for before/after comparisons."""
    return sorted(
        (
            t.config["configurable"]["thread_id"],
            t.config["configurable"].get("checkpoint_ns", ""),
            t.checkpoint["id"],
            repr(t.checkpoint["channel_values"]),
            repr(sorted(t.pending_writes or [], key=repr)),
        )
        for t in tuples
    )


async def _scenario(
    saver_for: SaverFor, users: tuple[str, str], threads: tuple[str, str], ns: str, sync: bool,
    skipped: set[str],
) -> None:
    from langgraph.checkpoint.base.id import uuid6

    tag = f"cf{uuid.uuid4().hex[:8]}-"
    t, t2 = threads
    copy_to = f"{t}-copy{tag}"
    ids = [str(uuid6(clock_seq=i)) for i in range(3)]
    views = [_Lg(saver_for(tag + u), sync, skipped) for u in users]
    runs = [f"run-{tag}{i}" for i in (0, 1)]

    for i, lg in enumerate(views):
        version = None
        parent = _config(t, ns)
        for j, cid in enumerate(ids[:2]):
            version = lg.saver.get_next_version(version, None)  # a new version per value
            parent = await lg.call(
                "put", parent, _checkpoint(cid, f"user{i}-{j}", version),
                {"source": "loop", "step": j, "parents": {}, "run_id": runs[i], "owner": i},
                {"ch": version},
            )
        await lg.call("put_writes", parent, [("ch", f"write-of-user{i}")], "task-1", "")
        await lg.call(
            "put", _config(t2), _checkpoint(ids[2], f"user{i}-t2", version),
            {"source": "input", "step": -1, "parents": {}, "run_id": runs[i], "owner": i},
            {"ch": version},
        )

    for i, lg in enumerate(views):
        who = f"user {users[i]!r}"
        latest = await lg.call("get_tuple", _config(t, ns))
        assert latest is not None, f"{who}: get_tuple lost its own checkpoint on {t!r}/{ns!r}"
        assert latest.checkpoint["id"] == ids[1], f"{who}: latest is {latest.checkpoint['id']}"
        assert latest.checkpoint["channel_values"] == {"ch": f"user{i}-1"}, f"{who} sees {latest.checkpoint}"
        assert [w[2] for w in latest.pending_writes] == [f"write-of-user{i}"], (
            f"{who}: pending writes {latest.pending_writes}"
        )
        first = await lg.call("get_tuple", _config(t, ns, ids[0]))
        assert first.checkpoint["channel_values"] == {"ch": f"user{i}-0"}, f"{who}: by id -> {first.checkpoint}"
        for config, want in (
            (None, 3), (_config(t, None), 2), (_config(t, ns), 2), (_config(t2), 1),
        ):
            got = await lg.list(config)
            owners = {tp.metadata.get("owner") for tp in got}
            assert len(got) == want and owners == {i}, (
                f"{who}: list({config}) returned {len(got)} checkpoints of owners {owners}, want {want} own"
            )

    a, b = views
    before = _seen(await a.list(None))
    await b.call("delete_for_runs", [runs[0]])
    await b.call("copy_thread", t, copy_to)
    await b.call("prune", [t], strategy="delete")
    await b.call("delete_thread", t2)
    assert await a.list(_config(copy_to, None)) == [], f"B's copy_thread copied into A's {copy_to!r}"
    assert _seen(await a.list(None)) == before, "user B's delete/copy/prune changed user A's checkpoints"
    if "copy_thread" not in skipped:
        copied = await b.list(_config(copy_to, None))
        assert {tp.metadata.get("owner") for tp in copied} <= {1}, f"B's copy holds {copied}"
    for lg in views:
        for thread in (t, t2, copy_to):
            await lg.call("delete_thread", thread)
    assert await a.list(None) == [], "delete_thread left checkpoints behind"


async def check_langgraph_isolation(saver_for: SaverFor) -> str:
    """Hostile users/threads/namespaces: every saver method stays inside its user."""
    skipped: set[str] = set()

    async def body(users: tuple[str, str], threads: tuple[str, str], ns: str, sync: bool) -> None:
        await _scenario(saver_for, users, threads, ns, sync, skipped)

    await run_property(
        body,
        {
            "users": user_pairs(),
            "threads": distinct_pairs(thread_ids()),
            "ns": namespaces(),
            "sync": st.booleans(),
        },
    )
    return f"not implemented by this saver (not checked): {', '.join(sorted(skipped))}" if skipped else ""


LANGGRAPH_CHECKS = [check_langgraph_isolation]
