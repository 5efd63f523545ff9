"""Agent Framework isolation: ``CheckpointStorage`` bound to one user.

The check takes ``storage_for``: a callable returning an ``agent_framework``
``CheckpointStorage`` that is *the same store seen as user X* (for ours,
``IsolatedCheckpointStorage(backend, user=X)``). Two hostile users save
checkpoints of the same hostile ``workflow_name`` (shared by every user of a
workflow) under the same checkpoint ids, then ``get_latest``,
``list_checkpoints``, ``list_checkpoint_ids``, ``load`` and ``delete`` must
only ever touch the caller's own.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from .properties import run_property
from .strategies import thread_ids, user_pairs

__all__ = ["AGENT_FRAMEWORK_CHECKS", "StorageFor", "check_agent_framework_isolation"]

#: ``storage_for(user)`` returns a CheckpointStorage bound to ``user``.
StorageFor = Callable[[str], Any]


async def _scenario(storage_for: StorageFor, users: tuple[str, str], workflow: str) -> None:
    from agent_framework import WorkflowCheckpoint, WorkflowCheckpointException

    tag = f"cf{uuid.uuid4().hex[:8]}-"
    ids = [str(uuid.uuid4()) for _ in range(2)]
    stores = [storage_for(tag + u) for u in users]
    for i, storage in enumerate(stores):
        previous = None
        for j, cid in enumerate(ids):
            cp = WorkflowCheckpoint(
                workflow_name=workflow, graph_signature_hash="conformance", checkpoint_id=cid,
                previous_checkpoint_id=previous, state={"owner": i, "step": j}, iteration_count=j,
            )
            assert await storage.save(cp) == cid
            previous = cid

    def owners(cps: list[Any]) -> set[Any]:
        return {cp.state.get("owner") for cp in cps}

    for i, storage in enumerate(stores):
        who = f"user {users[i]!r}"
        latest = await storage.get_latest(workflow_name=workflow)
        assert latest is not None and latest.checkpoint_id == ids[1], f"{who}: get_latest -> {latest}"
        assert latest.state == {"owner": i, "step": 1}, f"{who}: get_latest returned {latest.state}"
        listed = await storage.list_checkpoints(workflow_name=workflow)
        assert len(listed) == 2 and owners(listed) == {i}, f"{who}: list_checkpoints owners {owners(listed)}"
        assert sorted(await storage.list_checkpoint_ids(workflow_name=workflow)) == sorted(ids), who
        loaded = await storage.load(ids[0])
        assert loaded.state == {"owner": i, "step": 0}, f"{who}: load({ids[0]}) -> {loaded.state}"

    a, b = stores
    before = sorted((cp.checkpoint_id, repr(cp.state)) for cp in await a.list_checkpoints(workflow_name=workflow))
    for cid in ids:
        assert await b.delete(cid) is True, "B could not delete its own checkpoint"
        assert await b.delete(cid) is False, "delete of an absent checkpoint returned True"
    assert await b.get_latest(workflow_name=workflow) is None, "B still sees a checkpoint after deleting its own"
    assert await b.list_checkpoint_ids(workflow_name=workflow) == [], "B lists A's checkpoint ids"
    try:
        got = await b.load(ids[0])
    except WorkflowCheckpointException:
        pass
    else:
        raise AssertionError(f"user {users[1]!r} loaded user {users[0]!r}'s checkpoint: {got.state}")
    after = sorted((cp.checkpoint_id, repr(cp.state)) for cp in await a.list_checkpoints(workflow_name=workflow))
    assert after == before, "user B's delete changed user A's checkpoints"
    for cid in ids:
        await a.delete(cid)


async def check_agent_framework_isolation(storage_for: StorageFor) -> None:
    """Hostile users, one shared hostile workflow name and guessed ids: no crossing."""

    async def body(users: tuple[str, str], workflow: str) -> None:
        await _scenario(storage_for, users, workflow)

    await run_property(
        body, {"users": user_pairs(), "workflow": thread_ids()}
    )


AGENT_FRAMEWORK_CHECKS = [check_agent_framework_isolation]
