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


# -- crafted pickled leaves: stored bytes never import a module nor run code ------------------------
#
# Each record below is written straight into the backend, sealed and indexed as ``save`` would,
# with one pickled leaf crafted by hand. Every read (load, get_latest, list_checkpoints) must raise
# CorruptCheckpointError (also a WorkflowCheckpointException); no marker file may appear and no
# module may be imported. The logic is the same on every backend, so the many crafted cases run
# on memory and SQLite, and the main ones once more on Redis and S3.

import base64
import collections
import datetime
import decimal
import enum
import importlib.util
import pickle
import pickletools
import struct
import typing
from collections.abc import Callable

from agent_framework import Content, Message
from agent_framework._workflows._checkpoint_encoding import decode_checkpoint_value, encode_checkpoint_value
from agent_framework._workflows._runner_context import WorkflowMessage

from checkpointers.backends.base import Mode

CRAFTED_BACKENDS = pytest.mark.parametrize("backend_name", ["memory", "sqlite"])
_HASH_MODULUS = sys.hash_info.modulus


def _str_op(text: str) -> bytes:
    """SHORT_BINUNICODE / BINUNICODE pushing ``text``."""
    raw = text.encode()
    return b"\x8c" + bytes([len(raw)]) + raw if len(raw) < 256 else b"X" + struct.pack("<I", len(raw)) + raw


def _global_op(module: str, name: str) -> bytes:
    """STACK_GLOBAL of ``module:name`` from two string operands."""
    return _str_op(module) + _str_op(name) + b"\x93"


def _int_op(value: int) -> bytes:
    raw = pickle.encode_long(value)
    return b"\x8a" + bytes([len(raw)]) + raw


def _pickle(body: bytes) -> bytes:
    return b"\x80\x05" + body + b"."


def _shared_dag(levels: int, *, tuples: bool) -> bytes:
    """Leaves on the stack ``x_levels`` where ``x_k = (x_k-1, x_k-1)`` (2**levels objects, ~6 bytes per level)."""
    if tuples:
        body = b")\x940" + b"".join(b"h" + bytes([k, ord("h"), k]) + b"\x86\x940" for k in range(levels))
    else:
        body = b"]\x940" + b"".join(b"]\x94(h" + bytes([k, ord("h"), k]) + b"e0" for k in range(levels))
    return body + b"h" + bytes([levels])


def _crafted_put(
    storage: IsolatedCheckpointStorage, workflow: str, checkpoint_id: str, pickled: bytes, type_key: str
) -> Put:
    """A sealed, indexed record of a real checkpoint whose state holds one crafted pickled leaf."""
    checkpoint = synthetic_checkpoint(workflow, checkpoint_id=checkpoint_id)
    encoded = encode_checkpoint_value(checkpoint.to_dict())
    encoded["state"]["crafted"] = {"k": [{"__pickled__": base64.b64encode(pickled).decode(), "__type__": type_key}]}
    data = json.dumps(encoded).encode()
    tags = storage._tags(checkpoint)
    return storage.integrity.put(
        storage.partition, _record_name(checkpoint_id), data, etag="e", tags=tags, mode=Mode.APPEND
    )


async def _assert_every_read_refuses(
    backend: Backend, storage: IsolatedCheckpointStorage, pickled: bytes, *, type_key: str = "builtins:object",
    match: str | None = None,
) -> None:
    workflow, checkpoint_id = new_name("wf"), new_name("crafted")
    put = _crafted_put(storage, workflow, checkpoint_id, pickled, type_key)
    assert (await backend.awrite(storage.partition, [put])).conflict is None
    assert await storage.list_checkpoint_ids(workflow_name=workflow) == [checkpoint_id]  # found by the index
    for read in (
        lambda: storage.load(checkpoint_id),
        lambda: storage.get_latest(workflow_name=workflow),
        lambda: storage.list_checkpoints(workflow_name=workflow),
    ):
        with pytest.raises(CorruptCheckpointError, match=match) as caught:
            await read()
        assert isinstance(caught.value, WorkflowCheckpointException) and isinstance(caught.value, CorruptItemError)
        assert caught.value.key == checkpoint_id


@CRAFTED_BACKENDS
@pytest.mark.parametrize(
    "payload",
    [
        # STACK_GLOBAL os.system, called by REDUCE
        lambda cmd: _pickle(_global_op("os", "system") + _str_op(cmd) + b"\x85R"),
        # the same under its real module name
        lambda cmd: _pickle(_global_op("posix", "system") + _str_op(cmd) + b"\x85R"),
        # protocol 0: GLOBAL and INST (a legacy call opcode)
        lambda cmd: b"cos\nsystem\n(S'" + cmd.encode() + b"'\ntR.",
        lambda cmd: b"(S'" + cmd.encode() + b"'\nios\nsystem\n.",
        # module and name computed at unpickling time, not literal strings
        lambda cmd: _pickle(
            _global_op("builtins", "str") + b"C\x02os" + _str_op("ascii") + b"\x86R" + _str_op("system")
            + b"\x93" + _str_op(cmd) + b"\x85R"
        ),
    ],
    ids=["stack-global", "posix", "proto0-global", "proto0-inst", "computed-name"],
)
async def test_a_crafted_leaf_reducing_to_os_system_never_runs(
    backend: Backend, payload: Callable[[str], bytes], tmp_path: Path
) -> None:
    marker = tmp_path / "pwned"
    for allowed in ([], ["os:system", "posix:system"]):  # even allowing it by name does not make it a class
        storage = storage_for(backend, allowed_checkpoint_types=allowed)
        await _assert_every_read_refuses(backend, storage, payload(f"touch {marker}"))
        assert not marker.exists()


def _module_touching(directory: Path, dotted: str, marker: Path) -> None:
    """Write module ``dotted`` (and its packages) under ``directory``; importing it touches ``marker``."""
    parts = dotted.split(".")
    for depth in range(1, len(parts)):
        package = directory.joinpath(*parts[:depth])
        package.mkdir(exist_ok=True)
        (package / "__init__.py").write_text(f"open({str(marker) + '.package'!r}, 'w').close()\n")
    module = directory.joinpath(*parts[:-1], parts[-1] + ".py")
    module.write_text(f"open({str(marker)!r}, 'w').close()\n\nclass Thing:\n    pass\n")


@CRAFTED_BACKENDS
@pytest.mark.parametrize(
    "module_name",
    [
        "checkpoint_evil_{}",  # a type the storage allows by name, in a module nobody imported
        "agent_framework_orchestrations.evil_{}",  # the framework's blanket prefix, from anywhere on sys.path
    ],
    ids=["allowed-type", "framework-prefix"],
)
async def test_a_crafted_leaf_never_imports_a_module(
    backend: Backend, module_name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dotted = module_name.format(uuid.uuid4().hex[:8])
    top = dotted.split(".")[0]
    if top != dotted and (top in sys.modules or importlib.util.find_spec(top) is not None):
        pytest.skip(f"{top} is installed here")
    marker = tmp_path / "imported"
    _module_touching(tmp_path, dotted, marker)
    monkeypatch.syspath_prepend(str(tmp_path))
    key = f"{dotted}:Thing"
    storage = storage_for(backend, allowed_checkpoint_types=[key])
    for body in (_global_op(dotted, "Thing"), _global_op(dotted, "Thing") + b")\x81"):
        await _assert_every_read_refuses(backend, storage, _pickle(body), type_key=key, match="is not imported")
    assert dotted not in sys.modules and top not in sys.modules
    assert not marker.exists() and not marker.with_name("imported.package").exists()


@CRAFTED_BACKENDS
async def test_a_crafted_leaf_never_reaches_a_lazy_module_getattr(backend: Backend) -> None:
    # agent_framework.<integration> namespaces import another package from their module __getattr__.
    lazy = "agent_framework.hyperlight"
    if lazy in sys.modules:
        pytest.skip(f"{lazy} is already imported")
    storage = storage_for(backend)
    await _assert_every_read_refuses(backend, storage, _pickle(_global_op(lazy, "HyperlightCodeActTool")))
    assert lazy not in sys.modules


@CRAFTED_BACKENDS
@pytest.mark.parametrize(
    "body",
    [
        # getattr(FileCheckpointStorage, "save").__globals__["os"].system(...)
        _global_op("builtins", "getattr")
        + _global_op("builtins", "getattr")
        + _global_op("agent_framework._workflows._checkpoint", "FileCheckpointStorage")
        + _str_op("save") + b"\x86R" + _str_op("__globals__") + b"\x86R",
        # object.__subclasses__() -> os._wrap_close.__init__.__globals__["system"]
        _global_op("builtins", "getattr") + _global_op("builtins", "object") + _str_op("__subclasses__") + b"\x86R)R",
        # type(cls) / cls.__class__: the metaclass
        _global_op("builtins", "getattr") + _global_op("agent_framework._types", "Message") + _str_op("__class__") + b"\x86R",
        # a module reached through a class attribute
        _global_op("builtins", "getattr") + _global_op("agent_framework._types", "Message") + _str_op("__module__") + b"\x86R",
        # the Python 2 spelling of getattr
        b"c__builtin__\ngetattr\n" + _global_op("builtins", "object") + _str_op("__subclasses__") + b"\x86R",
    ],
    ids=["function-globals", "subclasses", "metaclass", "module", "py2-getattr"],
)
async def test_a_getattr_traversal_never_reaches_os_system(backend: Backend, body: bytes, tmp_path: Path) -> None:
    storage = storage_for(backend)
    await _assert_every_read_refuses(backend, storage, _pickle(body), match="getattr|special attribute|reads")


@CRAFTED_BACKENDS
@pytest.mark.parametrize(
    ("body", "match"),
    [
        # a base outside the allowlist
        (
            _global_op("copyreg", "_reconstructor") + _global_op("agent_framework._types", "Message")
            + _global_op("os", "_wrap_close") + b"N\x87R",
            "'os:_wrap_close', which is not an allowed type",
        ),
        # an allowed base the class does not derive from
        (
            _global_op("copyreg", "_reconstructor") + _global_op("agent_framework._types", "Message")
            + _global_op("builtins", "dict") + b"}\x87R",
            "the base must be object or a built-in base",
        ),
        # object.__new__ of an enum: a forged member that bypasses the enum's lookup
        (
            _global_op("copyreg", "_reconstructor")
            + _global_op("agent_framework._workflows._runner_context", "MessageType")
            + _global_op("builtins", "object") + b"N\x87R",
            "to bypass",
        ),
        # bytes.__new__(bytes, 10**9): a gigabyte from a few bytes
        (
            _global_op("copyreg", "_reconstructor") + _global_op("builtins", "bytes") + _global_op("builtins", "bytes")
            + _int_op(10**9) + b"\x87R",
            "a size allocates",
        ),
    ],
    ids=["foreign-base", "unrelated-base", "enum-bypass", "allocating-base"],
)
async def test_a_copyreg_reconstructor_outside_what_the_pickler_writes(
    backend: Backend, body: bytes, match: str
) -> None:
    storage = storage_for(backend)
    await _assert_every_read_refuses(backend, storage, _pickle(body), match=match)


BEYOND_THE_FRAMEWORK: list[tuple[str, Callable[[Path], bytes], str]] = [
    # (b) calls, attribute writes and hooks the framework's own checks let through
    (
        "init-with-side-effects",  # FileCheckpointStorage(path).__init__ creates the directory
        lambda tmp: _global_op("agent_framework._workflows._checkpoint", "FileCheckpointStorage")
        + _str_op(str(tmp / "made")) + b"\x85R",
        "the pickler never writes",
    ),
    (
        "class-attribute",  # BUILD on a class object: WorkflowMessage.__eq__ = int, process-wide
        lambda tmp: _global_op("agent_framework._workflows._runner_context", "WorkflowMessage")
        + b"N}" + _str_op("__eq__") + _global_op("builtins", "int") + b"s\x86b",
        "not a new object",
    ),
    (
        "dunder-through-setstate",  # Content.__setstate__ assigning __class__
        lambda tmp: _global_op("agent_framework._types", "Content") + b")\x81}" + _str_op("__class__")
        + _global_op("agent_framework._types", "Message") + b"sb",
        "special attribute '__class__'",
    ),
    (
        "property-setter",  # a state key that names a property runs its setter
        lambda tmp: _global_op("agent_framework._types", "Message") + b")\x81}" + _str_op("text") + _str_op("x")
        + b"sb",
        "runs a descriptor",
    ),
    (
        "class-creation",  # type(name, bases, namespace) runs metaclasses and __init_subclass__
        lambda tmp: _global_op("builtins", "type") + _str_op("X")
        + _global_op("agent_framework._types", "Message") + b"\x85}\x87R",
        "creates a class",
    ),
    (
        "enum-creation",  # the functional Enum API
        lambda tmp: _global_op("agent_framework._workflows._runner_context", "MessageType") + _str_op("X")
        + _str_op("A B") + b"\x86R",
        "creates an enum",
    ),
    (
        "defaultdict-factory",  # a factory called later, on any missing key
        lambda tmp: _global_op("collections", "defaultdict")
        + _global_op("agent_framework._workflows._checkpoint", "FileCheckpointStorage") + b"\x85R",
        "default factory",
    ),
    ("persistent-id", lambda tmp: b"P1\n", "opcode PERSID"),
    ("extension-code", lambda tmp: b"\x82\x01", "opcode EXT1"),
    ("legacy-obj", lambda tmp: b"(" + _global_op("builtins", "object") + b"o", "opcode OBJ"),
    ("out-of-band-buffer", lambda tmp: b"\x97", "opcode NEXT_BUFFER"),
    # (c) memory and CPU at almost no cost in stored bytes
    ("bytes-of-size", lambda tmp: _global_op("builtins", "bytes") + _int_op(10**9) + b"\x85R", "a size allocates"),
    ("new-bytes-of-size", lambda tmp: _global_op("builtins", "bytes") + _int_op(10**9) + b"\x85\x81", "a size"),
    (
        "list-of-range",
        lambda tmp: _global_op("builtins", "list") + _global_op("builtins", "range") + _int_op(10**12)
        + b"\x85R\x85R",
        "passes a range",
    ),
    ("memo-slot", lambda tmp: b"Nr" + struct.pack("<I", 2**27), "out of sequence"),
    (
        "colliding-int-keys",  # unequal ints with one hash: inserting n of them costs n**2
        lambda tmp: b"\x8f(" + b"".join(_int_op(k * _HASH_MODULUS) for k in range(1, 200)) + b"\x90",
        "distinct keys with one hash",
    ),
    (
        "colliding-complex-keys",
        lambda tmp: _global_op("builtins", "complex") + b"\x940\x8f("
        + b"".join(
            b"h\x00G" + struct.pack(">d", float(7 - 1_000_003 * k)) + b"G" + struct.pack(">d", float(k)) + b"\x86R"
            for k in range(200)
        )
        + b"\x90",
        "distinct keys with one hash",
    ),
    ("deep-tuple-key", lambda tmp: b"}" + b")" + b"\x85" * 5000 + b"Ns", "nests deeper"),
    ("shared-tuple-dag-key", lambda tmp: b"\x8f(" + _shared_dag(60, tuples=True) + b"\x90", "far more objects"),
    (
        "str-of-shared-dag",
        lambda tmp: _global_op("builtins", "str") + _shared_dag(60, tuples=True) + b"\x85R",
        "from a non-literal",
    ),
    (
        "exception-logging-shared-dag",  # AgentFrameworkException.__init__ logs its message at a stored level
        lambda tmp: _global_op("agent_framework.exceptions", "AgentFrameworkException")
        + _shared_dag(60, tuples=False) + b"NK2\x87R",
        "expand to more objects",
    ),
]


@CRAFTED_BACKENDS
@pytest.mark.parametrize(("body", "match"), [pytest.param(b, m, id=n) for n, b, m in BEYOND_THE_FRAMEWORK])
async def test_a_crafted_leaf_beyond_the_frameworks_checks_is_refused(
    backend: Backend, body: Callable[[Path], bytes], match: str, tmp_path: Path
) -> None:
    storage = storage_for(backend)
    eq_before = WorkflowMessage.__dict__.get("__eq__")
    await _assert_every_read_refuses(backend, storage, _pickle(body(tmp_path)), match=match)
    assert not (tmp_path / "made").exists()
    assert WorkflowMessage.__dict__.get("__eq__") is eq_before


@pytest.mark.parametrize("backend_name", ["redis", "s3"])
async def test_a_crafted_leaves_on_redis_and_s3(
    backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "pwned"
    storage = storage_for(backend)
    await _assert_every_read_refuses(
        backend, storage, _pickle(_global_op("os", "system") + _str_op(f"touch {marker}") + b"\x85R")
    )
    dotted = f"checkpoint_evil_{uuid.uuid4().hex[:8]}"
    _module_touching(tmp_path, dotted, marker)
    monkeypatch.syspath_prepend(str(tmp_path))
    allowing = storage_for(backend, allowed_checkpoint_types=[f"{dotted}:Thing"])
    await _assert_every_read_refuses(
        backend, allowing, _pickle(_global_op(dotted, "Thing")), type_key=f"{dotted}:Thing", match="is not imported"
    )
    await _assert_every_read_refuses(
        backend, storage, _pickle(b"\x8f(" + _shared_dag(60, tuples=True) + b"\x90"), match="far more objects"
    )
    assert not marker.exists() and dotted not in sys.modules


@CRAFTED_BACKENDS
async def test_a_json_nested_too_deep_is_corrupt_not_a_recursion_error(backend: Backend) -> None:
    storage = storage_for(backend)
    checkpoint_id = "deep-" + uuid.uuid4().hex
    checkpoint = synthetic_checkpoint("wf", checkpoint_id=checkpoint_id)
    data = b'{"state": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    put = storage.integrity.put(
        storage.partition, _record_name(checkpoint_id), data, etag="e", tags=storage._tags(checkpoint), mode=Mode.APPEND
    )
    await backend.awrite(storage.partition, [put])
    with pytest.raises(CorruptCheckpointError):
        await storage.load(checkpoint_id)


# Values of every kind the checks must still let through, saved by the framework's own encoder.


class _Colour(enum.Enum):
    RED = 1
    BLUE = "b"


class _Point(typing.NamedTuple):
    x: int
    y: int


@dataclasses.dataclass(frozen=True)
class _Frozen:
    a: int
    b: tuple[int, ...] = ()


@dataclasses.dataclass(slots=True)
class _Slotted:
    a: int
    b: list[int]


@dataclasses.dataclass
class _Node:
    name: str
    parent: _Node | None = None
    children: list[_Node] = dataclasses.field(default_factory=list)


LEGIT_TYPES = [f"{t.__module__}:{t.__qualname__}" for t in (_Colour, _Point, _Frozen, _Slotted, _Node, Question)]


def _legit_values() -> dict[str, Any]:
    root = _Node("root")
    root.children.append(_Node("child", parent=root))  # a cycle
    looped: list[Any] = []
    looped.append(looped)
    return {
        "when": datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.timezone(datetime.timedelta(hours=2))),
        "day": datetime.date(2026, 1, 2),
        "span": datetime.timedelta(days=3, seconds=4),
        "ids": {uuid.UUID(int=i) for i in range(5)},
        "by_uuid": collections.OrderedDict((uuid.UUID(int=i), i) for i in range(3)),
        "amount": decimal.Decimal("12.50"),
        "nan": decimal.Decimal("NaN"),
        "numbers": (1, 2.5, 3 + 4j, 2**100, -(2**70), True, None),
        "sets": [frozenset({1, "a", (2, 3)}), {4, 5}, set(range(300))],
        "bytes": (b"raw", bytearray(b"mutable")),
        "ranges": (range(1, 10, 2), slice(1, 5)),
        "collections": [
            collections.defaultdict(list, {"k": [1]}),
            collections.deque([1, 2], maxlen=3),
            collections.Counter("hello"),
        ],
        "types": [int, type(None), _Point],
        "reserved": {"__pickled__": 1, "__type__": 2},
        "colliding_str_keys": {1: "a", "1": "b"},
        "enums": [_Colour.RED, _Colour.BLUE],
        # (in tuples: the framework's JSON layer turns a plain dict's keys into strings)
        "named_keys": ({_Point(1, 2): "p", _Point(3, 4): "q"},),
        "frozen_keys": ({_Frozen(1, (2,)): "f", _Frozen(2): "g"},),
        "slotted": _Slotted(1, [2]),
        "graph": root,
        "looped": (looped,),  # in a tuple: the framework's JSON layer would recurse into a bare list
        "messages": [Message(role="user", contents=[Content.from_text(f"message {i}")]) for i in range(3)],
        "question": Question("approve?", 3, ["a"]),
    }


@CRAFTED_BACKENDS
async def test_a_values_of_every_kind_still_round_trip(backend: Backend) -> None:
    storage = storage_for(backend, allowed_checkpoint_types=LEGIT_TYPES)
    checkpoint = synthetic_checkpoint("wf")
    checkpoint.state = _legit_values()
    await storage.save(checkpoint)
    for loaded in (
        await storage.load(checkpoint.checkpoint_id),
        await storage.get_latest(workflow_name="wf"),
        (await storage.list_checkpoints(workflow_name="wf"))[0],
    ):
        assert loaded is not None
        state = loaded.state
        # What the framework's own encoding gives back (1.19 turns an OrderedDict's UUID keys into strings).
        reference = decode_checkpoint_value(encode_checkpoint_value(_legit_values()))
        for key, value in _legit_values().items():
            if key == "graph":
                assert state[key].children[0].parent is state[key]
            elif key == "looped":
                assert state[key][0][0] is state[key][0]
            elif key == "nan":
                assert state[key].is_nan()
            elif key == "messages":
                assert [m.text for m in state[key]] == [m.text for m in value]
            else:
                assert state[key] == value or state[key] == reference[key], key


@CRAFTED_BACKENDS
async def test_a_checkpoint_the_checks_would_refuse_is_refused_at_save(backend: Backend) -> None:
    storage = storage_for(backend, allowed_checkpoint_types=LEGIT_TYPES)
    # Keys whose hash cannot be checked (frozen dataclasses) beyond the bound: refused at save, not at resume.
    checkpoint = synthetic_checkpoint("wf", metadata={"many": frozenset(_Frozen(i) for i in range(300))})
    with pytest.raises(WorkflowCheckpointException, match="hash cannot be checked"):
        await storage.save(checkpoint)
    assert await storage.list_checkpoint_ids(workflow_name="wf") == []
    assert storage.refused_saves == 1


def test_a_the_checks_read_opcodes_exactly_as_pickletools_does() -> None:
    from adapters._pickle_guard import _opcodes

    values: list[Any] = [*_legit_values().values(), _legit_values()]
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        for value in values:
            try:
                data = pickle.dumps(value, protocol=protocol)
            except (pickle.PicklingError, TypeError, AttributeError):
                continue  # not picklable at this protocol
            expected = [(ord(op.code), arg, pos) for op, arg, pos in pickletools.genops(data)]
            assert list(_opcodes(data)) == expected
    for truncated in (b"\x80\x05\x8c\x05abc", b"\x80", b"\x80\x05N", b"\xff."):
        with pytest.raises(ValueError):
            list(_opcodes(truncated))
