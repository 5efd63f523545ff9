"""The Agent Framework face: real ``agent_framework`` workflows on every backend.

The executors live in :mod:`tests.af_workflows` (importable, so a resumed
process restores the same graph signature).
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
import logging
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agent_framework")

from agent_framework import CheckpointStorage, WorkflowCheckpointException  # noqa: E402

from adapters.agent_framework import (  # noqa: E402
    TAG_WORKFLOW,
    CheckpointSaveRefusedError,
    CorruptCheckpointError,
    InvalidCheckpointIdError,
    IsolatedCheckpointStorage,
    RefusedSave,
    _record_name,
)
from checkpointers._flows import make_put  # noqa: E402
from checkpointers.backends import Backend, MemoryBackend  # noqa: E402
from checkpointers.backends.base import Put  # noqa: E402
from checkpointers.errors import (  # noqa: E402
    CorruptItemError,
    InvalidNameError,
    IsolationError,
    ItemTooLargeError,
    StepMismatchError,
)
from tests.af_workflows import (  # noqa: E402
    COUNTDOWN_FROM,
    QUESTION_TYPE,
    CrashError,
    Question,
    ask_workflow,
    countdown_workflow,
    fan_workflow,
    synthetic_checkpoint,
)

ROOT = Path(__file__).resolve().parent.parent
FULL_COUNTDOWN = list(range(COUNTDOWN_FROM, -1, -1))


def new_name(kind: str) -> str:
    return f"{kind}-{uuid.uuid4().hex[:8]}"


def storage_for(backend: Backend, user: str | None = None, **options: Any) -> IsolatedCheckpointStorage:
    return IsolatedCheckpointStorage(backend, user=user or new_name("user"), **options)


async def crash_then_resume(storage: IsolatedCheckpointStorage, name: str, crash_at: int) -> tuple[list, list]:
    """Run the countdown until it crashes at ``crash_at``; resume a fresh instance from get_latest."""
    before: list[int] = []
    with pytest.raises(CrashError):
        async for event in countdown_workflow(name, storage, crash_at=crash_at).run(COUNTDOWN_FROM, stream=True):
            if event.type == "output":
                before.append(event.data)
    latest = await storage.get_latest(workflow_name=name)
    assert latest is not None
    fresh = countdown_workflow(name, storage)
    after = (await fresh.run(checkpoint_id=latest.checkpoint_id)).get_outputs()
    assert fresh.executors["decrement"].handled == len(FULL_COUNTDOWN)  # executor state restored
    return before, after


# -- the protocol ---------------------------------------------------------------


def test_implements_the_framework_protocol_exactly() -> None:
    for name, member in vars(CheckpointStorage).items():
        if name.startswith("_") or not inspect.iscoroutinefunction(member):
            continue
        ours = getattr(IsolatedCheckpointStorage, name)
        assert inspect.iscoroutinefunction(ours), name
        theirs_params = [(p.name, p.kind) for p in inspect.signature(member).parameters.values()]
        ours_params = [(p.name, p.kind) for p in inspect.signature(ours).parameters.values()]
        assert ours_params == theirs_params, name


def test_user_binding_is_required() -> None:
    backend = MemoryBackend()
    with pytest.raises(IsolationError, match="user="):
        IsolatedCheckpointStorage(backend)
    with pytest.raises(IsolationError):
        IsolatedCheckpointStorage(backend, user="")
    with pytest.raises(ValueError, match="anonymous"):
        IsolatedCheckpointStorage(backend, user="alice", user_isolation=False)
    with pytest.raises(InvalidNameError):
        IsolatedCheckpointStorage(backend, user=42)  # type: ignore[arg-type]
    assert IsolatedCheckpointStorage(backend, user_isolation=False).user == ""


async def test_opens_a_backend_from_a_url() -> None:
    async with IsolatedCheckpointStorage("memory://", user="alice") as storage:
        checkpoint = synthetic_checkpoint("wf")
        await storage.save(checkpoint)
        assert (await storage.load(checkpoint.checkpoint_id)).state == checkpoint.state
        assert storage.backend.kind == "memory"
    async with IsolatedCheckpointStorage.from_url("memory://", user="bob") as other:
        assert other.user == "bob" and await other.list_checkpoint_ids(workflow_name="wf") == []


# -- real workflows, every backend ----------------------------------------------


async def test_countdown_resumes_from_latest_with_every_output_once(backend: Backend) -> None:
    storage, name = storage_for(backend), new_name("countdown")
    before, after = await crash_then_resume(storage, name, crash_at=7)
    assert before and after
    assert before + after == FULL_COUNTDOWN
    assert storage.refused_saves == 0

    # One checkpoint per superstep (plus entry checkpoints), chained parent -> child
    # in save order, across the crash and the resume.
    ids = await storage.list_checkpoint_ids(workflow_name=name)
    checkpoints = await storage.list_checkpoints(workflow_name=name)
    assert [c.checkpoint_id for c in checkpoints] == ids
    assert len(ids) >= 2 * len(FULL_COUNTDOWN)
    assert len(set(ids)) == len(ids)
    assert (await storage.get_latest(workflow_name=name)).checkpoint_id == ids[-1]  # type: ignore[union-attr]
    assert [c.previous_checkpoint_id for c in checkpoints] == [None] + ids[:-1]


async def test_fan_out_fan_in_resumes_from_every_checkpoint(backend: Backend) -> None:
    expected = (await fan_workflow(new_name("reference")).run(3)).get_outputs()
    assert len(expected) == 1

    storage, name = storage_for(backend), new_name("fan")
    assert (await fan_workflow(name, storage).run(3)).get_outputs() == expected
    checkpoints = await storage.list_checkpoints(workflow_name=name)
    assert len(checkpoints) >= 4  # entry + split + workers + slow branch (+ gather)
    # Every checkpoint before the output was produced resumes to the same result,
    # including the one holding a half-filled fan-in buffer.
    resumable = [c for c in checkpoints if c.iteration_count < checkpoints[-1].iteration_count]
    assert len(resumable) >= 3
    for checkpoint in resumable:
        fresh = fan_workflow(name, storage)
        outputs = (await fresh.run(checkpoint_id=checkpoint.checkpoint_id)).get_outputs()
        assert outputs == expected, checkpoint.iteration_count


async def test_request_for_input_resumes_from_checkpoint(backend: Backend) -> None:
    storage = storage_for(backend, allowed_checkpoint_types=[QUESTION_TYPE])
    name = new_name("ask")
    paused = await ask_workflow(name, storage).run(4)
    assert paused.get_outputs() == []
    (request,) = paused.get_request_info_events()
    assert request.data == Question("approve 4?", 4)

    latest = await storage.get_latest(workflow_name=name)
    assert latest is not None
    assert list(latest.pending_request_info_events) == [request.request_id]

    # A fresh instance (as after a restart) restores the pending request and answers it.
    fresh = ask_workflow(name, storage)
    done = await fresh.run(checkpoint_id=latest.checkpoint_id, responses={request.request_id: "yes"})
    assert done.get_outputs() == ["4:yes"]
    assert storage.refused_saves == 0


async def test_users_never_touch_each_others_checkpoints(backend: Backend) -> None:
    name = new_name("shared-name")  # one workflow definition, run by two users
    alice = storage_for(backend, user="alice")
    bob = alice.for_user("bob")

    async def run_for(storage: IsolatedCheckpointStorage, crash_at: int) -> list[int]:
        before, after = await crash_then_resume(storage, name, crash_at)
        return before + after

    assert await asyncio.gather(run_for(alice, 12), run_for(bob, 5)) == [FULL_COUNTDOWN] * 2

    ids_a = await alice.list_checkpoint_ids(workflow_name=name)
    ids_b = await bob.list_checkpoint_ids(workflow_name=name)
    assert ids_a and ids_b and not set(ids_a) & set(ids_b)
    assert [c.checkpoint_id for c in await alice.list_checkpoints(workflow_name=name)] == ids_a
    assert [c.checkpoint_id for c in await bob.list_checkpoints(workflow_name=name)] == ids_b
    assert (await alice.get_latest(workflow_name=name)).checkpoint_id == ids_a[-1]  # type: ignore[union-attr]
    assert (await bob.get_latest(workflow_name=name)).checkpoint_id == ids_b[-1]  # type: ignore[union-attr]

    # Guessing (here: knowing) the other user's ids finds nothing.
    for stranger, foreign in ((alice, ids_b), (bob, ids_a)):
        for checkpoint_id in (foreign[0], foreign[-1]):
            with pytest.raises(WorkflowCheckpointException, match="No checkpoint found"):
                await stranger.load(checkpoint_id)
            assert await stranger.delete(checkpoint_id) is False
    assert await alice.list_checkpoint_ids(workflow_name=name) == ids_a
    assert await bob.list_checkpoint_ids(workflow_name=name) == ids_b

    # The same id in two users' spaces is two checkpoints, not a mismatch.
    theirs = await bob.load(ids_b[0])
    mine = dataclasses.replace(theirs, state={"owner": "alice"})
    assert await alice.save(mine) == theirs.checkpoint_id
    assert (await alice.load(theirs.checkpoint_id)).state == {"owner": "alice"}
    assert (await bob.load(theirs.checkpoint_id)).state == theirs.state

    # The anonymous space is a space of its own; a second view of alice is alice.
    anonymous = IsolatedCheckpointStorage(backend, user_isolation=False)
    assert await anonymous.list_checkpoint_ids(workflow_name=name) == []
    assert await anonymous.get_latest(workflow_name=name) is None
    assert await IsolatedCheckpointStorage(backend, user="alice").list_checkpoint_ids(
        workflow_name=name
    ) == ids_a + [theirs.checkpoint_id]

    # Deleting only deletes one's own.
    assert await alice.delete(ids_a[-1]) is True
    assert await alice.delete(ids_a[-1]) is False
    assert ids_a[-1] not in await alice.list_checkpoint_ids(workflow_name=name)
    assert await bob.list_checkpoint_ids(workflow_name=name) == ids_b


async def test_sigkill_mid_run_then_a_fresh_process_resumes(tmp_path: Path) -> None:
    pytest.importorskip("checkpointers.backends.sqlite", reason="sqlite backend not implemented yet")
    from checkpointers.backends.sqlite import SqliteBackend

    db, user, name = tmp_path / "state.db", "alice", new_name("killed")

    def child(*args: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        return subprocess.run(
            [sys.executable, "-m", "tests.af_workflows", *args],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
        )

    def outputs(proc: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
        return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]

    killed = child("run", str(db), user, name, "9")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    before = [line["output"] for line in outputs(killed)]
    assert before == list(range(COUNTDOWN_FROM, 9, -1))

    with SqliteBackend(db) as backend:
        storage = IsolatedCheckpointStorage(backend, user=user)
        latest = await storage.get_latest(workflow_name=name)
        assert latest is not None

    resumed = child("resume", str(db), user, name)
    assert resumed.returncode == 0, resumed.stderr
    lines = outputs(resumed)
    assert lines[0] == {"resumed_from": latest.checkpoint_id}
    after = [line["output"] for line in lines if "output" in line]
    assert before + after == FULL_COUNTDOWN
    assert lines[-1] == {"handled": len(FULL_COUNTDOWN)}


# -- item rules: append-only, latest order, corruption ------------------------------


async def test_same_id_is_append_only(backend: Backend) -> None:
    storage = storage_for(backend)
    checkpoint = synthetic_checkpoint("wf", iteration=1)
    assert await storage.save(checkpoint) == checkpoint.checkpoint_id
    assert await storage.save(checkpoint) == checkpoint.checkpoint_id  # identical: no-op
    changed = dataclasses.replace(checkpoint, state={"n": 2})
    with pytest.raises(StepMismatchError):
        await storage.save(changed)
    assert await storage.list_checkpoint_ids(workflow_name="wf") == [checkpoint.checkpoint_id]
    assert (await storage.load(checkpoint.checkpoint_id)).state == checkpoint.state
    assert storage.refused_saves == 1


async def test_concurrent_deletes_have_one_winner(backend: Backend) -> None:
    storage = storage_for(backend)
    for i in range(3):
        checkpoint = synthetic_checkpoint("wf", iteration=i)
        await storage.save(checkpoint)
        done = await asyncio.gather(*(storage.delete(checkpoint.checkpoint_id) for _ in range(4)))
        assert sorted(done) == [False, False, False, True], done
    assert await storage.list_checkpoint_ids(workflow_name="wf") == []


async def test_latest_is_the_last_saved_not_the_largest_timestamp(backend: Backend) -> None:
    storage = storage_for(backend)
    instant = "2025-01-01T00:00:00+00:00"
    parent = synthetic_checkpoint("wf", iteration=1, timestamp=instant)
    child = synthetic_checkpoint(
        "wf", iteration=2, timestamp=instant, previous_checkpoint_id=parent.checkpoint_id
    )
    await storage.save(parent)
    await storage.save(child)
    assert (await storage.get_latest(workflow_name="wf")).checkpoint_id == child.checkpoint_id  # type: ignore[union-attr]

    # A clock that went backwards does not make the grandchild older,
    # and re-saving the parent (an identical no-op) does not make it newer.
    grandchild = synthetic_checkpoint(
        "wf", iteration=3, timestamp="2020-01-01T00:00:00+00:00",
        previous_checkpoint_id=child.checkpoint_id,
    )
    await storage.save(grandchild)
    await storage.save(parent)
    latest = await storage.get_latest(workflow_name="wf")
    assert latest is not None and latest.checkpoint_id == grandchild.checkpoint_id
    assert await storage.list_checkpoint_ids(workflow_name="wf") == [
        parent.checkpoint_id, child.checkpoint_id, grandchild.checkpoint_id,
    ]
    # Another workflow's checkpoints are not in this workflow's index.
    await storage.save(synthetic_checkpoint("other"))
    assert (await storage.get_latest(workflow_name="wf")).checkpoint_id == grandchild.checkpoint_id  # type: ignore[union-attr]


def _forged(storage: IsolatedCheckpointStorage, checkpoint_id: str, value: bytes, *, bad_digest: bool) -> Put:
    """A record written behind the storage's back, indexed like a real checkpoint."""
    tags = {TAG_WORKFLOW: "wf", "id": checkpoint_id}
    put = make_put(_record_name(checkpoint_id), value, tags=tags)
    return dataclasses.replace(put, digest="0" * 64) if bad_digest else put


@pytest.mark.parametrize("bad_digest", [False, True], ids=["undecodable", "digest-mismatch"])
async def test_corrupt_newest_checkpoint_is_never_skipped(backend: Backend, bad_digest: bool) -> None:
    storage = storage_for(backend)
    good = synthetic_checkpoint("wf")
    await storage.save(good)
    bad_id = "forged-" + uuid.uuid4().hex
    value = json.dumps({"checkpoint_id": bad_id}).encode() if not bad_digest else b"{}"
    result = await backend.awrite(storage.partition, [_forged(storage, bad_id, value, bad_digest=bad_digest)])
    assert result.conflict is None

    with pytest.raises(CorruptItemError) as caught:
        await storage.get_latest(workflow_name="wf")
    assert isinstance(caught.value, WorkflowCheckpointException) and caught.value.key == bad_id
    with pytest.raises(CorruptCheckpointError):
        await storage.load(bad_id)
    with pytest.raises(CorruptCheckpointError):
        await storage.list_checkpoints(workflow_name="wf")
    # The index still lists it, and deleting it makes the older one latest again.
    assert await storage.list_checkpoint_ids(workflow_name="wf") == [good.checkpoint_id, bad_id]
    assert await storage.delete(bad_id) is True
    assert (await storage.get_latest(workflow_name="wf")).checkpoint_id == good.checkpoint_id  # type: ignore[union-attr]


# -- bad input: clear errors, store unchanged ---------------------------------------


async def test_oversized_checkpoint_is_refused_before_writing(backend: Backend) -> None:
    storage = storage_for(backend, max_item_bytes=2048)
    small = synthetic_checkpoint("wf", state_bytes=100)
    await storage.save(small)
    big = synthetic_checkpoint("wf", state_bytes=4096)
    with pytest.raises(ItemTooLargeError) as caught:
        await storage.save(big)
    assert caught.value.key == big.checkpoint_id and caught.value.size > 2048
    assert caught.value.limit == 2048 and big.checkpoint_id in str(caught.value)
    assert await storage.list_checkpoint_ids(workflow_name="wf") == [small.checkpoint_id]
    with pytest.raises(WorkflowCheckpointException):
        await storage.load(big.checkpoint_id)
    assert storage.refused_saves == 1 and storage.refusals[0].checkpoint_id == big.checkpoint_id


async def test_type_outside_the_allowlist_is_refused_at_save(backend: Backend) -> None:
    strict = storage_for(backend)
    checkpoint = synthetic_checkpoint("wf", metadata={"question": Question("why?", 1)})
    with pytest.raises(WorkflowCheckpointException, match=QUESTION_TYPE):
        await strict.save(checkpoint)
    assert await strict.list_checkpoint_ids(workflow_name="wf") == []

    allowing = IsolatedCheckpointStorage(backend, user=strict.user, allowed_checkpoint_types=[QUESTION_TYPE])
    await allowing.save(checkpoint)
    assert (await allowing.load(checkpoint.checkpoint_id)).metadata == {"question": Question("why?", 1)}
    # Loading it without the type allowed is refused too (and reported as corrupt, not returned).
    with pytest.raises(CorruptCheckpointError, match=QUESTION_TYPE):
        await strict.load(checkpoint.checkpoint_id)


@pytest.mark.parametrize(
    "bad_id",
    ["", "x" * 257, "a\x00b", "tab\there", "\ud800", 42, None],
    ids=["empty", "too-long", "nul", "control", "surrogate", "int", "none"],
)
async def test_invalid_checkpoint_ids_are_refused(backend: Backend, bad_id: Any) -> None:
    storage = storage_for(backend)
    checkpoint = synthetic_checkpoint("wf", checkpoint_id=bad_id)
    for call in (storage.save(checkpoint), storage.load(bad_id), storage.delete(bad_id)):
        with pytest.raises(InvalidCheckpointIdError) as caught:
            await call
        assert isinstance(caught.value, ValueError) and isinstance(caught.value, WorkflowCheckpointException)
    assert await storage.list_checkpoint_ids(workflow_name="wf") == []


async def test_path_like_ids_and_names_are_plain_names(backend: Backend) -> None:
    storage = storage_for(backend)
    odd = ["../../etc/passwd", "a/b", "*", "c/_x", "é" * 256, "%2F"]
    workflow_name = "wf/../*?" + "n" * 300  # longer than a tag value: indexed by digest
    for checkpoint_id in odd:
        await storage.save(synthetic_checkpoint(workflow_name, checkpoint_id=checkpoint_id))
    assert await storage.list_checkpoint_ids(workflow_name=workflow_name) == odd
    for checkpoint_id in odd:
        assert (await storage.load(checkpoint_id)).checkpoint_id == checkpoint_id
    assert await storage.list_checkpoint_ids(workflow_name="wf") == []


# -- refusals made visible through real runs ----------------------------------------


async def test_refused_saves_are_logged_counted_and_can_fail_the_run(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[RefusedSave] = []
    storage = storage_for(backend, max_item_bytes=2048, on_refused=seen.append)
    name = new_name("ballast")
    with caplog.at_level(logging.ERROR, logger="adapters.agent_framework"):
        result = await countdown_workflow(name, storage, ballast=4096).run(COUNTDOWN_FROM)
    # The framework's runner swallowed every refusal: the run itself "succeeded".
    assert result.get_outputs() == FULL_COUNTDOWN
    assert await storage.list_checkpoint_ids(workflow_name=name) == []
    assert storage.refused_saves >= len(FULL_COUNTDOWN) and len(seen) == storage.refused_saves
    errors = [r for r in caplog.records if r.levelno == logging.ERROR and r.name == "adapters.agent_framework"]
    assert len(errors) == storage.refused_saves
    assert seen[0].checkpoint_id in errors[0].getMessage() and "ItemTooLargeError" in errors[0].getMessage()

    with pytest.raises(CheckpointSaveRefusedError) as caught:
        storage.raise_if_refused()
    assert isinstance(caught.value, WorkflowCheckpointException)
    assert isinstance(caught.value.__cause__, ItemTooLargeError)
    assert len(caught.value.refusals) == storage.refused_saves
    storage.raise_if_refused()  # cleared once raised


async def test_refused_type_would_resume_from_an_older_checkpoint(backend: Backend) -> None:
    storage, name = storage_for(backend), new_name("ask")  # Question not allowed
    paused = await ask_workflow(name, storage).run(5)
    assert len(paused.get_request_info_events()) == 1
    latest = await storage.get_latest(workflow_name=name)
    # The checkpoint holding the pending request was refused; latest is older and has none.
    assert latest is not None and latest.pending_request_info_events == {}
    assert storage.refused_saves >= 1
    with pytest.raises(CheckpointSaveRefusedError, match=QUESTION_TYPE):
        storage.raise_if_refused()


async def test_a_failing_on_refused_callback_does_not_hide_the_refusal(caplog: pytest.LogCaptureFixture) -> None:
    def explode(refusal: RefusedSave) -> None:
        raise RuntimeError("callback broke")

    storage = IsolatedCheckpointStorage(MemoryBackend(), user="alice", max_item_bytes=64, on_refused=explode)
    checkpoint = synthetic_checkpoint("wf", state_bytes=100)
    with caplog.at_level(logging.ERROR, logger="adapters.agent_framework"):
        with pytest.raises(ItemTooLargeError):
            await storage.save(checkpoint)
    assert storage.refused_saves == 1
    assert any("on_refused callback failed" in r.getMessage() for r in caplog.records)
    assert storage.for_user("bob").max_item_bytes == 64  # a view keeps the settings
