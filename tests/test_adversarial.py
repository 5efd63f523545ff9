"""Adversarial tests (issue 12): a hostile caller, a hostile writer of the storage, a careless caller.

Every test runs on every backend (the shared ``backend`` fixture) and
through the faces a caller sees: Store items, the LangGraph saver (sync and
async) and the Agent Framework storage.

a. **Hostile configs.** A view bound to alice (``for_user``, also with
   ``require_user=True``) and a ``with saver.acting_for("alice")`` block are
   authoritative: a config naming another user raises ``IsolationError``
   before any I/O (a spy on the backend sees no call), on every method, and
   no record changes for anyone.
b. **Crafted payloads** written straight into the backend, with a correct
   content digest and a valid unkeyed seal (anyone who can write the storage
   can compute both): msgpack extensions naming ``os.system`` (every
   constructor kind, nested in a dict and inside allowed types), pickle
   frames, json frames; for the Agent Framework, pickled leaves whose
   ``__reduce__`` calls ``os.system`` under lying type markers. Each read
   raises ``CorruptItemError`` (``DisallowedTypeError`` naming the type) and
   the marker file the payload would create never appears.
c. **Records copied, spliced and damaged at the storage level**, with and
   without ``integrity_key``: copies between users, threads, scopes and
   names, forged and added tags, swapped values, unkeyed seals recomputed by
   an attacker under a key, key rotation.
d. **Bad input**: each case raises the library error (also the builtin
   Python code expects) before any I/O, and nothing is written.
e. **A store written by 0.1** (``tests/data/store-0.1.db``, made by
   ``tests/data/make_store_0_1.py`` with commit a9eed74) is read in full
   without a key, and refused with one unless ``accept_unsealed=True``.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import importlib.util
import inspect
import json
import math
import os
import pickle
import shutil
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

import ormsgpack
import pytest
from langgraph.checkpoint.base.id import uuid6
from langgraph.checkpoint.serde import jsonplus

from checkpointers import Store
from checkpointers._flows import make_put, new_etag
from checkpointers._integrity import ENV_VAR, Integrity
from checkpointers._names import Partition
from checkpointers._names import encode_component as enc
from checkpointers._saver_flows import ckpt_name, writes_prefix
from checkpointers.backends import Backend
from checkpointers.backends.base import ListQuery, Put, Record
from checkpointers.conformance.adversarial import AGENT_FRAMEWORK_ADVERSARIAL_CHECKS, LANGGRAPH_ADVERSARIAL_CHECKS
from checkpointers.conformance.runner import saver_binder, storage_binder
from checkpointers.errors import (
    CheckpointerError,
    CorruptItemError,
    DisallowedTypeError,
    InvalidArgumentError,
    IsolationError,
    StepMismatchError,
    UnserializableValueError,
)
from checkpointers.savers import Checkpointer
from checkpointers.store import _name as item_name

DATA = Path(__file__).parent / "data"
SCOPE = "runs/r1"
TS = "2025-01-01T00:00:00+00:00"
OLD_KEY = "old-integrity-key-0123456789abcdef"
NEW_KEY = "new-integrity-key-0123456789abcdef"
#: Integrity settings a test runs under: no key (unkeyed seals) and an HMAC key.
KEYS = [pytest.param(None, id="unkeyed"), pytest.param(NEW_KEY, id="keyed")]
SPACES = ("items", "langgraph", "agent_framework")
_IO_METHODS = ("get", "write", "list", "partitions", "drop", "many")


@pytest.fixture(autouse=True)
def _no_key_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)


# -- helpers --------------------------------------------------------------------


def sealing(key: Any) -> dict[str, Any]:
    """The keyword arguments of a test's integrity setting: none (unkeyed seals) or ``integrity_key=``.

    Without a key nothing is passed (the environment variable is cleared for
    every test), so the unkeyed cases also run against the library before
    seals existed, where they must fail.
    """
    return {} if key is None else {"integrity_key": key}


@contextmanager
def io_spy(backend: Backend) -> Iterator[list[str]]:
    """Record every call of the backend's operations (sync and async) inside the block."""
    calls: list[str] = []
    patched = []
    for name in _IO_METHODS + tuple("a" + n for n in _IO_METHODS):
        original = getattr(backend, name)
        if inspect.iscoroutinefunction(original):

            async def spy(*args: Any, _n: str = name, _o: Any = original, **kwargs: Any) -> Any:
                calls.append(_n)
                return await _o(*args, **kwargs)

        else:

            def spy(*args: Any, _n: str = name, _o: Any = original, **kwargs: Any) -> Any:  # type: ignore[misc]
                calls.append(_n)
                return _o(*args, **kwargs)

        setattr(backend, name, spy)
        patched.append(name)
    try:
        yield calls
    finally:
        for name in patched:
            backend.__dict__.pop(name, None)


def snapshot(
    backend: Backend, users: list[str], spaces: tuple[str, ...] = SPACES
) -> dict[tuple[str, str, str], list[tuple[Any, ...]]]:
    """Every record of ``users`` in ``spaces``: name, digest, etag, seq, tags."""
    out: dict[tuple[str, str, str], list[tuple[Any, ...]]] = {}
    for user in users:
        for space in spaces:
            for name in sorted(backend.partitions(user, space)):
                recs = backend.list(Partition(user, space, name), ListQuery())
                out[(user, space, name)] = sorted(
                    (r.name, r.digest, r.etag, r.seq, tuple(sorted(r.tags.items()))) for r in recs
                )
    return out


def copy_put(record: Record, *, name: str | None = None, **changes: Any) -> Put:
    """A raw copy of ``record`` (value, digest, etag, tags as stored), optionally renamed or altered."""
    put = Put(name or record.name, record.value, record.digest, record.etag, dict(record.tags))
    return dataclasses.replace(put, **changes)


def raw(backend: Backend, p: Partition, name: str) -> Record:
    (record,) = backend.get(p, [name])
    assert record is not None, (p, name)
    return record


def raw_write(backend: Backend, p: Partition, puts: list[Put]) -> None:
    result = backend.write(p, puts)
    assert result.conflict is None, result


def attacker_put(p: Partition, name: str, value: bytes, tags: dict[str, str] | None = None) -> Put:
    """What someone with write access to the storage but no key writes: a valid digest and unkeyed seal."""
    tags = tags or {}
    sha = hashlib.sha256(value).hexdigest()
    return Put(name, value, Integrity([]).seal(p, name, tags, sha), new_etag(), tags)


async def outcome(call: Callable[[], Any]) -> Any:
    """Call, await if needed, drain generators: the value (lists for listings)."""
    result = call()
    if inspect.isawaitable(result):
        result = await result
    if inspect.isasyncgen(result):
        return [x async for x in result]
    if inspect.isgenerator(result):
        return list(result)
    return result


async def refused(case: str, call: Callable[[], Any], error: type[BaseException] = CorruptItemError) -> Any:
    """Expect ``error`` from ``call``; fail naming ``case`` with what happened instead."""
    try:
        got = await outcome(call)
    except error as exc:
        return exc
    except Exception as exc:
        raise AssertionError(f"{case}: raised {type(exc).__name__}: {exc}, not {error.__name__}") from exc
    raise AssertionError(f"{case}: returned {got!r:.300} instead of raising {error.__name__}")


# -- LangGraph helpers ----------------------------------------------------------


def cfg(thread: Any, *, cid: str | None = None, user: Any = None, ns: Any = "") -> dict[str, Any]:
    conf: dict[str, Any] = {"thread_id": thread, "checkpoint_ns": ns}
    if cid is not None:
        conf["checkpoint_id"] = cid
    if user is not None:
        conf["user_id"] = user
    return {"configurable": conf}


def checkpoint(cid: str, values: dict[str, Any], versions: dict[str, str]) -> dict[str, Any]:
    return {
        "v": 4,
        "id": cid,
        "ts": TS,
        "channel_values": values,
        "channel_versions": versions,
        "versions_seen": {},
        "updated_channels": sorted(values),
    }


def fill(saver: Checkpointer, thread: str, owner: str, *, big: bool = False) -> list[str]:
    """Two checkpoints (the second with pending writes) of ``owner`` on ``thread``; their ids.

    ``big`` adds a channel over the inline limit, so the thread has a blob.
    """
    ids = [str(uuid6()) for _ in range(2)]
    config = cfg(thread)
    for j, cid in enumerate(ids):
        values: dict[str, Any] = {"ch": f"{owner}-{j}"}
        versions = {"ch": f"{j + 1:032}.0"}
        if big:
            values["big"] = owner * (3000 // max(len(owner), 1) + 1)
            versions["big"] = f"{1:032}.0"
        new = versions if j == 0 else {"ch": versions["ch"]}
        metadata = {"source": "loop", "step": j, "run_id": f"run-{owner}", "owner": owner}
        config = saver.put(config, checkpoint(cid, values, versions), metadata, new)
    saver.put_writes(config, [("ch", f"write-of-{owner}")], "task-1", "")
    return ids


def values_of(found: Any) -> Any:
    return None if found is None else found.checkpoint["channel_values"]


def frame(kind: str, data: bytes) -> bytes:
    """A saver record's bytes: a length-prefixed serializer type name, then the payload."""
    return bytes([len(kind)]) + kind.encode() + data


def record_payload(cid: str, **fields: Any) -> dict[str, Any]:
    """The layout of a checkpoint record (format 3), without channel values unless given."""
    payload = {
        "v": 3,
        "ns": "",
        "id": cid,
        "parent": None,
        "checkpoint": {
            "v": 4,
            "id": cid,
            "ts": TS,
            "channel_versions": fields.pop("versions", {}),
            "versions_seen": {},
            "updated_channels": None,
        },
        "metadata": {"source": "input", "step": -1},
        "blobs": {},
        "inline": {},
    }
    payload.update(fields)
    return payload


class Call:
    """Pickles as the call ``fn(*args)``: what a ``__reduce__`` exploit looks like."""

    def __init__(self, fn: Any, *args: Any) -> None:
        self.fn, self.args = fn, args

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return self.fn, self.args


def ext(code: int, *fields: Any) -> ormsgpack.Ext:
    return ormsgpack.Ext(code, ormsgpack.packb(list(fields)))


def evil_ext(variant: str, command: str) -> ormsgpack.Ext:
    """A msgpack extension that makes a permissive decoder run ``os.system(command)``."""
    single = ext(jsonplus.EXT_CONSTRUCTOR_SINGLE_ARG, "os", "system", command)
    return {
        "single_arg": lambda: single,
        "pos_args": lambda: ext(jsonplus.EXT_CONSTRUCTOR_POS_ARGS, "os", "system", [command]),
        "kw_args": lambda: ext(jsonplus.EXT_CONSTRUCTOR_KW_ARGS, "os", "system", {"command": command}),
        "pydantic_v1": lambda: ext(jsonplus.EXT_PYDANTIC_V1, "os", "system", {"command": command}),
        "pydantic_v2": lambda: ext(jsonplus.EXT_PYDANTIC_V2, "os", "system", {"command": command}),
        "method": lambda: ext(jsonplus.EXT_METHOD_SINGLE_ARG, "os", "system", command, "__call__"),
        "inside_deque": lambda: ext(jsonplus.EXT_CONSTRUCTOR_POS_ARGS, "collections", "deque", [[single]]),
        "inside_message": lambda: ext(
            jsonplus.EXT_CONSTRUCTOR_KW_ARGS,
            "langchain_core.messages.human",
            "HumanMessage",
            {"content": "hi", "additional_kwargs": {"x": single}},
        ),
        "inside_delta_snapshot": lambda: ormsgpack.Ext(jsonplus.EXT_DELTA_SNAPSHOT, ormsgpack.packb({"x": single})),
    }[variant]()


#: Payloads that name ``os.system`` in a msgpack extension: DisallowedTypeError.
NAMED_TYPE_PAYLOADS = [
    "single_arg",
    "pos_args",
    "kw_args",
    "pydantic_v1",
    "pydantic_v2",
    "method",
    "inside_deque",
    "inside_message",
    "inside_delta_snapshot",
]
#: Frames the saver never decodes: CorruptItemError.
FRAME_PAYLOADS = ["pickle", "json_lc_constructor", "json_plain"]
PLACEMENTS = ["record", "inline", "blob", "write"]


def evil_frames(payload: str, command: str, cid: str) -> dict[str, bytes]:
    """The crafted bytes of a checkpoint record, a channel value and a writes record."""
    if payload == "pickle":
        f = frame("pickle", pickle.dumps(Call(os.system, command)))
        return {"record": f, "value": f, "write": f}
    if payload == "json_lc_constructor":
        lc = {"lc": 2, "type": "constructor", "id": ["os", "system"], "args": [command]}
        f = frame("json", json.dumps(lc).encode())
        return {"record": f, "value": f, "write": f}
    if payload == "json_plain":  # a well-formed record and values, as json frames
        return {
            "record": frame("json", json.dumps(record_payload(cid)).encode()),
            "value": frame("json", b'{"y": 1}'),
            "write": frame("json", json.dumps({"task_id": "task", "task_path": "", "w": [[0, "ch", 1]]}).encode()),
        }
    evil = evil_ext(payload, command)
    meta = {"source": "input", "step": -1, "x": {"y": evil}}
    return {
        "record": frame("msgpack", ormsgpack.packb(record_payload(cid, metadata=meta))),
        "value": frame("msgpack", ormsgpack.packb({"y": [evil]})),
        "write": frame("msgpack", ormsgpack.packb({"task_id": "task", "task_path": "", "w": [[0, "ch", {"y": evil}]]})),
    }


def crafted_puts(p: Partition, placement: str, frames: dict[str, bytes], cid: str) -> list[Put]:
    """Records that put the crafted bytes at ``placement`` of a checkpoint ``cid`` in thread ``p``."""
    name = ckpt_name("", cid)

    def clean(**fields: Any) -> bytes:
        return frame("msgpack", ormsgpack.packb(record_payload(cid, **fields)))

    versions = {"ch": f"{1:032}.0"}
    if placement == "record":
        return [attacker_put(p, name, frames["record"])]
    if placement == "inline":
        return [attacker_put(p, name, clean(inline={"ch": frames["value"]}, versions=versions))]
    if placement == "blob":
        sha = hashlib.sha256(frames["value"]).hexdigest()
        return [
            attacker_put(p, "b/" + sha, frames["value"]),
            attacker_put(p, name, clean(blobs={"ch": sha}, versions=versions)),
        ]
    assert placement == "write"
    writes = writes_prefix("", cid) + enc("task") + "/0"
    return [attacker_put(p, name, clean()), attacker_put(p, writes, frames["write"])]


#: Backends fast enough to take every read path of every case; the others (one
#: request costs milliseconds) take one sync and one async path: the bytes they
#: return are decoded by the same code whatever the path.
THOROUGH = {"memory", "sqlite", "redis"}


def saver_reads(
    saver: Checkpointer, thread: str, cid: str, backend_name: str = "memory"
) -> list[tuple[str, Callable[[], Any]]]:
    """The read paths over one thread, sync and async (two of them on a slow backend)."""
    latest, by_id = cfg(thread), cfg(thread, cid=cid)
    reads: list[tuple[str, Callable[[], Any]]] = [
        ("get_tuple", lambda: saver.get_tuple(latest)),
        ("get_tuple(checkpoint_id)", lambda: saver.get_tuple(by_id)),
        ("list", lambda: saver.list(latest)),
        ("list(limit=1)", lambda: saver.list(cfg(thread, ns=None), limit=1)),
        ("aget_tuple", lambda: saver.aget_tuple(latest)),
        ("aget_tuple(checkpoint_id)", lambda: saver.aget_tuple(by_id)),
        ("alist", lambda: saver.alist(latest)),
    ]
    return reads if backend_name in THOROUGH else [reads[0], reads[-2]]


# -- Agent Framework helpers ----------------------------------------------------


def af_storage(backend: Backend, user: str, key: Any = None, **options: Any) -> Any:
    from adapters.agent_framework import IsolatedCheckpointStorage

    return IsolatedCheckpointStorage(backend, user=user, **sealing(key), **options)


def af_checkpoint(workflow: str, owner: str, **fields: Any) -> Any:
    from tests.af_workflows import synthetic_checkpoint

    return synthetic_checkpoint(workflow, metadata={"owner": owner}, **fields)


def af_name(checkpoint_id: str) -> str:
    from adapters.agent_framework import _record_name

    return _record_name(checkpoint_id)


def af_reads(storage: Any, workflow: str, checkpoint_id: str) -> list[tuple[str, Callable[[], Any]]]:
    return [
        ("load", lambda: storage.load(checkpoint_id)),
        ("get_latest", lambda: storage.get_latest(workflow_name=workflow)),
        ("list_checkpoints", lambda: storage.list_checkpoints(workflow_name=workflow)),
    ]


# == a. hostile configs against bound views and acting_for ============================

#: User ids a config may name that are not alice (the anonymous user, a near twin, not a str).
HOSTILE_USERS = ["bob", "", "alice ", "Alice", 7]
VIEWS = ["for_user", "for_user(require_user=True)", "acting_for", "for_user inside acting_for(bob)"]


def bound(saver: Checkpointer, view: str) -> tuple[Checkpointer, AbstractContextManager[Any]]:
    """The saver to call as alice and the context to call it in."""
    if view == "acting_for":
        return saver, saver.acting_for("alice")
    if view == "for_user inside acting_for(bob)":  # the view keeps its own user
        return saver.for_user("alice"), saver.acting_for("bob")
    return saver.for_user("alice"), nullcontext()


def hostile_calls(target: Checkpointer, user: Any, bob_cid: str, sync: bool) -> list[tuple[str, Callable[[], Any]]]:
    h = cfg("t", user=user)
    at_bob = cfg("t", user=user, cid=bob_cid)
    new = checkpoint(str(uuid6()), {"ch": "forged"}, {"ch": f"{9:032}.0"})
    meta = {"source": "update", "step": 9}
    prefix = "" if sync else "a"
    calls: list[tuple[str, Callable[[], Any]]] = [
        ("get_tuple", lambda: getattr(target, prefix + "get_tuple")(h)),
        ("get_tuple(checkpoint_id)", lambda: getattr(target, prefix + "get_tuple")(at_bob)),
        ("list", lambda: getattr(target, prefix + "list")(h)),
        ("list(limit)", lambda: getattr(target, prefix + "list")(h, limit=1)),
        ("list(every thread)", lambda: getattr(target, prefix + "list")({"configurable": {"user_id": user}})),
        ("put", lambda: getattr(target, prefix + "put")(h, new, meta, {"ch": new["channel_versions"]["ch"]})),
        ("put(parent)", lambda: getattr(target, prefix + "put")(at_bob, new, meta, {})),
        ("put_writes", lambda: getattr(target, prefix + "put_writes")(at_bob, [("ch", "forged")], "task-x", "")),
        ("put_writes(special)", lambda: getattr(target, prefix + "put_writes")(at_bob, [("__error__", "x")], "task-1")),
    ]
    return [(f"{prefix}{name} with user_id={user!r}", call) for name, call in calls]


async def test_a_config_naming_another_user_is_refused_before_any_io(backend: Backend) -> None:
    saver = Checkpointer(backend)
    strict = Checkpointer(backend, require_user=True)
    fill(saver.for_user("alice"), "t", "alice", big=True)
    bob_ids = fill(saver.for_user("bob"), "t", "bob", big=True)
    hostile_names = ["", "alice ", "Alice", "7"]
    before = snapshot(backend, ["alice", "bob"]), snapshot(backend, hostile_names, ("langgraph",))
    failures = []
    for view in VIEWS:
        base = strict if view.endswith("(require_user=True)") else saver
        target, _ = bound(base, view)
        for mode in ("sync", "async"):
            for user in HOSTILE_USERS:
                for case, call in hostile_calls(target, user, bob_ids[1], mode == "sync"):
                    try:
                        with io_spy(backend) as calls, bound(base, view)[1]:
                            await refused(f"{view}: {case}", call, IsolationError)
                        assert calls == [], f"{view}: {case} reached the backend before refusing: {calls}"
                    except AssertionError as failure:
                        failures.append(str(failure))
            # Naming alice herself is fine, and serves alice's data.
            with bound(base, view)[1]:
                method = "get_tuple" if mode == "sync" else "aget_tuple"
                mine = await outcome(lambda: getattr(target, method)(cfg("t", user="alice")))
            assert values_of(mine)["ch"] == "alice-1", (view, mine)
            assert [w[2] for w in mine.pending_writes] == ["write-of-alice"], (view, mine)
    assert not failures, "\n".join(failures)
    after = snapshot(backend, ["alice", "bob"]), snapshot(backend, hostile_names, ("langgraph",))
    assert after == before, "a refused call changed a record"


async def test_a_thread_management_acts_for_the_binding_only(backend: Backend) -> None:
    """delete_thread / copy_thread / prune / delete_for_runs take no config: the binding decides."""
    saver = Checkpointer(backend)
    bob = saver.for_user("bob")
    for thread in ("t", "bob-only"):
        fill(bob, thread, "bob")
    bob_before = snapshot(backend, ["bob"])
    for mode in ("sync", "async"):
        prefix, user = ("" if mode == "sync" else "a"), f"alice-{mode}"
        alice = saver.for_user(user)
        fill(alice, "t", user)
        for target, context, copy_to in ((alice, nullcontext(), "copy-a"), (saver, saver.acting_for(user), "copy-b")):
            with context:
                for method, args, kwargs in [
                    ("delete_for_runs", (["run-bob"],), {}),
                    ("copy_thread", ("t", copy_to), {}),
                    ("copy_thread", ("bob-only", copy_to + "-2"), {}),
                    ("prune", (["bob-only"],), {"strategy": "delete"}),
                    ("prune", (["t"],), {}),
                    ("delete_thread", ("bob-only",), {}),
                ]:
                    await outcome(lambda: getattr(target, prefix + method)(*args, **kwargs))
        assert sorted(backend.partitions(user, "langgraph")) == ["copy-a", "copy-b", "t"], mode
        assert [len(list(alice.list(cfg(t, ns=None)))) for t in ("copy-a", "t", "copy-b")] == [2, 1, 1], mode
        assert {t.metadata["owner"] for t in alice.list(None)} == {user}, mode
    assert snapshot(backend, ["bob"]) == bob_before, "alice's thread management changed bob's records"


# == b. crafted payloads ===========================================================


@pytest.mark.parametrize("payload", NAMED_TYPE_PAYLOADS + FRAME_PAYLOADS)
async def test_b_crafted_checkpoint_bytes_never_run_code(
    backend: Backend, backend_name: str, payload: str, tmp_path: Path
) -> None:
    marker = tmp_path / f"pwned-{payload}"
    command = f"touch {marker}"
    saver = Checkpointer(backend).for_user("alice")
    placements = PLACEMENTS
    if backend_name not in THOROUGH and payload not in ("single_arg", "pickle", "json_plain"):
        placements = ["record", "blob"]  # the other places are decoded by the same code
    for placement in placements:
        thread, cid = f"crafted-{placement}", str(uuid6())
        p = Partition("alice", "langgraph", thread)
        raw_write(backend, p, crafted_puts(p, placement, evil_frames(payload, command, cid), cid))
        for read, call in saver_reads(saver, thread, cid, backend_name):
            case = f"{payload} in the {placement}, {read}"
            try:
                exc = await refused(case, call)
            except AssertionError as failure:
                ran = "appeared: os.system ran" if marker.exists() else "did not appear"
                raise AssertionError(f"{failure}; the marker file {ran}") from None
            if payload in NAMED_TYPE_PAYLOADS:
                assert isinstance(exc, DisallowedTypeError), f"{case}: {exc!r} does not name the type"
                assert (exc.module, exc.name) == ("os", "system"), f"{case}: {exc!r}"
            assert not marker.exists(), f"{case}: the payload ran os.system"
    await refused(f"{payload}: alist(None)", lambda: saver.alist(None))
    assert not marker.exists()


async def test_b_crafted_bytes_under_a_key_are_refused_at_the_seal(
    backend: Backend, backend_name: str, tmp_path: Path
) -> None:
    """With integrity_key, the attacker's unkeyed seal is refused before anything is decoded."""
    marker = tmp_path / "pwned"
    saver = Checkpointer(backend, integrity_key=NEW_KEY).for_user("alice")
    for placement in PLACEMENTS:
        thread, cid = f"crafted-{placement}", str(uuid6())
        p = Partition("alice", "langgraph", thread)
        raw_write(backend, p, crafted_puts(p, placement, evil_frames("single_arg", f"touch {marker}", cid), cid))
        for read, call in saver_reads(saver, thread, cid, backend_name):
            exc = await refused(f"{placement}, {read}", call)
            assert not isinstance(exc, DisallowedTypeError), f"{placement}, {read}: decoded before the seal check"
            assert "seal" in exc.reason, exc
    assert not marker.exists()


def af_leaf(variant: str, command: str) -> dict[str, str]:
    """A pickled leaf of the framework's encoding (``__pickled__`` + ``__type__`` markers)."""
    call, type_key = {
        "os.system typed as int": (Call(os.system, command), "builtins:int"),
        "os.system typed as itself": (Call(os.system, command), f"{os.system.__module__}:system"),
        "eval typed as str": (Call(eval, f"__import__('os').system({command!r})"), "builtins:str"),
    }[variant]
    return {"__pickled__": base64.b64encode(pickle.dumps(call)).decode(), "__type__": type_key}


AF_LEAVES = ["os.system typed as int", "os.system typed as itself", "eval typed as str"]
AF_PLACES = ["state", "messages", "metadata", "pending_request_info_events"]


@pytest.mark.parametrize("variant", AF_LEAVES)
async def test_b_crafted_agent_framework_checkpoint_never_runs_code(
    backend: Backend, variant: str, tmp_path: Path
) -> None:
    from adapters.agent_framework import CorruptCheckpointError

    marker = tmp_path / "pwned"
    storage = af_storage(backend, "alice")
    allowing = af_storage(backend, "alice", allowed_checkpoint_types=["posix:system", "os:system", "builtins:eval"])
    for place in AF_PLACES:
        workflow = f"wf-{place}"
        good = af_checkpoint(workflow, "alice")
        await storage.save(good)
        record = raw(backend, storage.partition, af_name(good.checkpoint_id))
        doc = json.loads(record.value)
        doc[place] = {"k": [{"nested": af_leaf(variant, f"touch {marker}")}]}
        forged = json.dumps(doc).encode()
        raw_write(backend, storage.partition, [attacker_put(storage.partition, record.name, forged, dict(record.tags))])
        reads = af_reads(storage, workflow, good.checkpoint_id) + [
            ("load, allowing os.system and eval by name", lambda: allowing.load(good.checkpoint_id))
        ]
        for read, call in reads:
            case = f"{variant} in {place}, {read}"
            await refused(case, call, CorruptCheckpointError)
            assert not marker.exists(), f"{case}: the payload ran"
        assert await storage.list_checkpoint_ids(workflow_name=workflow) == [good.checkpoint_id]


# == c. records copied, spliced and damaged at the storage level ========================


@pytest.mark.parametrize("key", KEYS)
async def test_c_item_copied_from_another_user_is_corrupt(backend: Backend, key: Any) -> None:
    alice = Store(backend, **sealing(key)).for_user("alice")
    bob = alice.for_user("bob")
    bob.set_item(SCOPE, "secret", {"owner": "bob"}, tags={"kind": "plan"})
    bob.set_item(SCOPE, "shared", {"owner": "bob"})
    alice.set_item(SCOPE, "shared", {"owner": "alice"})
    for name in (item_name("secret"), item_name("shared")):  # into an empty place, over alice's own
        raw_write(backend, alice.partition(SCOPE), [copy_put(raw(backend, bob.partition(SCOPE), name))])
    for case, call in [
        ("get_item", lambda: alice.get_item(SCOPE, "secret")),
        ("get_item over alice's own", lambda: alice.get_item(SCOPE, "shared")),
        ("list_items", lambda: alice.list_items(SCOPE)),
        ("list_items(tags)", lambda: alice.list_items(SCOPE, tags={"kind": "plan"})),
        ("aget_item", lambda: alice.aget_item(SCOPE, "secret")),
        ("alist_items", lambda: alice.alist_items(SCOPE, limit=5)),
    ]:
        await refused(case, call)
    assert bob.get_item(SCOPE, "secret").value == {"owner": "bob"}  # the original is fine


@pytest.mark.parametrize("key", KEYS)
async def test_c_item_moved_to_another_name_or_scope_is_corrupt(backend: Backend, key: Any) -> None:
    store = Store(backend, **sealing(key)).for_user("alice")
    store.set_item(SCOPE, "a", {"v": "a"})
    store.set_item(SCOPE, "b", {"v": "b"})
    p, other = store.partition(SCOPE), store.partition("runs/r2")
    record = raw(backend, p, item_name("a"))
    raw_write(backend, p, [copy_put(record, name=item_name("b")), copy_put(record, name=item_name("steps/1"))])
    raw_write(backend, other, [copy_put(record)])
    for case, call in [
        ("get of the overwritten name", lambda: store.get_item(SCOPE, "b")),
        ("aget of the new name", lambda: store.aget_item(SCOPE, "steps/1")),
        ("get in the other scope", lambda: store.get_item("runs/r2", "a")),
        ("list", lambda: store.list_items(SCOPE)),
        ("alist of the other scope", lambda: store.alist_items("runs/r2")),
    ]:
        await refused(case, call)
    assert store.get_item(SCOPE, "a").value == {"v": "a"}


@pytest.mark.parametrize("key", KEYS)
async def test_c_forged_tags_are_corrupt(backend: Backend, key: Any) -> None:
    store = Store(backend, **sealing(key)).for_user("alice")
    p = store.partition(SCOPE)
    for k in ("changed", "added", "removed"):
        store.set_item(SCOPE, k, {"k": k}, tags={"kind": "plan", "owner": "alice"})
    forged = {
        "changed": {"kind": "plan", "owner": "bob"},
        "added": {"kind": "plan", "owner": "alice", "admin": "1"},
        "removed": {"kind": "plan"},
    }
    raw_write(backend, p, [copy_put(raw(backend, p, item_name(k)), tags=t) for k, t in forged.items()])
    for k, tags in forged.items():
        await refused(f"get of the item whose tags were {k}", lambda: store.get_item(SCOPE, k))
        await refused(f"alist by a forged tag ({k})", lambda: store.alist_items(SCOPE, tags=tags))
    await refused("list", lambda: store.list_items(SCOPE, tags={"kind": "plan"}))


@pytest.mark.parametrize("key", KEYS)
async def test_c_swapped_values_are_corrupt(backend: Backend, key: Any) -> None:
    store = Store(backend, **sealing(key)).for_user("alice")
    p = store.partition(SCOPE)
    for k in ("a", "b", "c", "d"):
        store.set_item(SCOPE, k, {"v": k})
    a, b, c, d = (raw(backend, p, item_name(k)) for k in "abcd")
    raw_write(
        backend,
        p,
        [
            copy_put(a, value=b.value, digest=b.digest),  # value and digest travel together: a splice
            copy_put(b, value=a.value, digest=a.digest),
            copy_put(c, value=d.value),  # each record keeps its own digest: damage
            copy_put(d, value=c.value),
        ],
    )
    for k in "abcd":
        await refused(f"get {k}", lambda: store.get_item(SCOPE, k))
    await refused("alist", lambda: store.alist_items(SCOPE))


@pytest.mark.parametrize("key", KEYS)
async def test_c_checkpoint_copied_from_another_user_or_thread_is_corrupt(
    backend: Backend, backend_name: str, key: Any
) -> None:
    saver = Checkpointer(backend, **sealing(key))
    alice, bob = saver.for_user("alice"), saver.for_user("bob")
    fill(alice, "t", "alice", big=True)
    fill(alice, "t-other", "alice", big=True)
    bob_ids = fill(bob, "t", "bob", big=True)
    bob_records = backend.list(Partition("bob", "langgraph", "t"), ListQuery())
    assert any(r.name.startswith("b/") for r in bob_records), "the thread should have a blob"
    # Bob's whole thread into alice's empty thread, and into alice's thread on top of hers.
    raw_write(backend, Partition("alice", "langgraph", "empty"), [copy_put(r) for r in bob_records])
    raw_write(backend, Partition("alice", "langgraph", "t"), [copy_put(r) for r in bob_records])
    # Alice's own thread spliced into her other thread (same user, another partition).
    mine = backend.list(Partition("alice", "langgraph", "t-other"), ListQuery())
    raw_write(backend, Partition("alice", "langgraph", "spliced"), [copy_put(r) for r in mine])
    for thread in ("empty", "t", "spliced"):
        cid = bob_ids[1] if thread != "spliced" else None
        for read, call in saver_reads(alice, thread, cid or "x", backend_name):
            if cid is None and "checkpoint_id" in read:
                continue
            await refused(f"thread {thread!r}: {read}", call)
    await refused("list(None)", lambda: alice.list(None))
    assert values_of(bob.get_tuple(cfg("t")))["ch"] == "bob-1"


@pytest.mark.parametrize("key", KEYS)
async def test_c_blob_writes_and_tags_of_a_thread_spliced_or_forged_are_corrupt(backend: Backend, key: Any) -> None:
    saver = Checkpointer(backend, **sealing(key))
    alice, bob = saver.for_user("alice"), saver.for_user("bob")
    big = {"big": "same value " * 400}
    versions = {"big": f"{1:032}.0"}
    cids = {}
    for who, view in (("alice", alice), ("bob", bob)):
        cids[who] = str(uuid6())
        view.put(cfg("blob"), checkpoint(cids[who], big, versions), {"source": "input", "step": -1}, versions)
    pa, pb = Partition("alice", "langgraph", "blob"), Partition("bob", "langgraph", "blob")
    (blob,) = [r for r in backend.list(pb, ListQuery(prefix="b/"))]
    assert raw(backend, pa, blob.name).value == blob.value  # content-addressed: the same name and bytes
    raw_write(backend, pa, [copy_put(blob)])  # identical content, sealed for bob
    await refused("a blob of identical content copied from bob", lambda: alice.get_tuple(cfg("blob")))

    ids = fill(alice, "w", "alice")
    pw = Partition("alice", "langgraph", "w")
    (writes,) = backend.list(pw, ListQuery(prefix=writes_prefix("", ids[1])))
    moved = writes_prefix("", ids[0]) + writes.name[len(writes_prefix("", ids[1])) :]
    raw_write(backend, pw, [copy_put(writes, name=moved)])
    await refused("writes moved to another checkpoint", lambda: alice.get_tuple(cfg("w", cid=ids[0])))
    # A re-write of that (checkpoint, task, idx) meets the moved record: refused, never compared or kept.
    again = cfg("w", cid=ids[0])
    await refused("put_writes over a moved record", lambda: alice.put_writes(again, [("ch", "x")], "task-1"))
    await refused("aput_writes over a moved record", lambda: alice.aput_writes(again, [("ch", "x")], "task-1"))
    assert alice.write_mismatches == 0

    fill(alice, "tags", "alice")
    pt = Partition("alice", "langgraph", "tags")
    latest = backend.list(pt, ListQuery(prefix="c/", depth=1, descending=True, limit=1))[0]
    raw_write(backend, pt, [copy_put(latest, tags={**latest.tags, "m.step": "5"})])
    await refused("forged metadata tag: get_tuple", lambda: alice.get_tuple(cfg("tags")))
    await refused("forged metadata tag: list(filter)", lambda: alice.list(cfg("tags"), filter={"step": 5}))
    await refused("forged metadata tag: alist", lambda: alice.alist(cfg("tags", ns=None), limit=1))


@pytest.mark.parametrize("key", KEYS)
async def test_c_agent_framework_checkpoint_copied_or_forged_is_corrupt(backend: Backend, key: Any) -> None:
    from adapters.agent_framework import CorruptCheckpointError

    alice, bob = af_storage(backend, "alice", key), af_storage(backend, "bob", key)
    mine = af_checkpoint("wf", "alice")
    await alice.save(mine)
    theirs = af_checkpoint("wf", "bob")
    await bob.save(theirs)
    same_id = dataclasses.replace(af_checkpoint("wf", "bob"), checkpoint_id=mine.checkpoint_id)
    await bob.save(same_id)
    for cp in (theirs, same_id):  # into an empty id, and over alice's own checkpoint
        record = raw(backend, bob.partition, af_name(cp.checkpoint_id))
        raw_write(backend, alice.partition, [copy_put(record)])
    for cp in (theirs, same_id):
        for read, call in af_reads(alice, "wf", cp.checkpoint_id):
            await refused(f"bob's {cp.checkpoint_id} copied to alice: {read}", call, CorruptCheckpointError)

    # Tags forged: re-indexed under another workflow, an added tag.
    other = af_checkpoint("wf2", "alice")
    await alice.save(other)
    record = raw(backend, alice.partition, af_name(other.checkpoint_id))
    raw_write(backend, alice.partition, [copy_put(record, tags={**record.tags, "workflow": "wf3"})])
    await refused(
        "re-indexed under wf3: get_latest", lambda: alice.get_latest(workflow_name="wf3"), CorruptCheckpointError
    )
    raw_write(backend, alice.partition, [copy_put(record, tags={**record.tags, "extra": "1"})])
    await refused("an added tag: load", lambda: alice.load(other.checkpoint_id), CorruptCheckpointError)
    assert (await bob.load(theirs.checkpoint_id)).metadata == {"owner": "bob"}


@pytest.mark.parametrize("key", KEYS)
async def test_c_agent_framework_index_refuses_copied_and_forged_records(backend: Backend, key: Any) -> None:
    """list_checkpoint_ids reads the index only, but never lists another user's or a re-indexed record."""
    from adapters.agent_framework import CorruptCheckpointError

    alice, bob = af_storage(backend, "alice", key), af_storage(backend, "bob", key)
    theirs = af_checkpoint("wf", "bob")
    await bob.save(theirs)
    raw_write(backend, alice.partition, [copy_put(raw(backend, bob.partition, af_name(theirs.checkpoint_id)))])
    mine = af_checkpoint("wf2", "alice")
    await alice.save(mine)
    record = raw(backend, alice.partition, af_name(mine.checkpoint_id))
    raw_write(backend, alice.partition, [copy_put(record, tags={**record.tags, "workflow": "wf3"})])
    failures = []
    for case, workflow in (("bob's record copied to alice", "wf"), ("alice's record re-indexed under wf3", "wf3")):
        try:
            ids = await outcome(lambda: alice.list_checkpoint_ids(workflow_name=workflow))
            raise AssertionError(f"{case}: list_checkpoint_ids returned {ids} instead of raising CorruptCheckpointError")
        except CorruptCheckpointError:
            pass
        except AssertionError as failure:
            failures.append(str(failure))
    assert not failures, "\n".join(failures)


async def test_c_unkeyed_seals_recomputed_by_an_attacker_are_refused_under_a_key(backend: Backend) -> None:
    from adapters.agent_framework import CorruptCheckpointError

    store = Store(backend, integrity_key=NEW_KEY).for_user("alice")
    store.set_item(SCOPE, "k", {"v": 1}, tags={"kind": "plan"})
    p = store.partition(SCOPE)
    genuine = raw(backend, p, item_name("k"))
    forged = b'j{"v":"forged"}'
    raw_write(backend, p, [attacker_put(p, item_name("k"), forged, {"kind": "plan"})])
    raw_write(backend, p, [make_put(item_name("unsealed"), b'j{"v":"old"}')])  # a bare digest, as before 0.2
    for case, call in [
        ("get of an unkeyed seal", lambda: store.get_item(SCOPE, "k")),
        ("get of a bare digest", lambda: store.get_item(SCOPE, "unsealed")),
        ("alist", lambda: store.alist_items(SCOPE)),
    ]:
        await refused(case, call)
    lax = Store(backend, integrity_key=NEW_KEY, accept_unsealed=True).for_user("alice")
    assert lax.get_item(SCOPE, "unsealed").value == {"v": "old"}  # opted in, for the migration
    raw_write(backend, p, [copy_put(genuine)])
    assert store.get_item(SCOPE, "k").value == {"v": 1}

    saver = Checkpointer(backend, integrity_key=NEW_KEY).for_user("alice")
    ids = fill(saver, "t", "alice")
    pt = Partition("alice", "langgraph", "t")
    record = raw(backend, pt, ckpt_name("", ids[1]))
    raw_write(backend, pt, [attacker_put(pt, record.name, record.value, dict(record.tags))])
    await refused("checkpoint with an unkeyed seal", lambda: saver.get_tuple(cfg("t")))

    storage = af_storage(backend, "alice", NEW_KEY)
    cp = af_checkpoint("wf", "alice")
    await storage.save(cp)
    record = raw(backend, storage.partition, af_name(cp.checkpoint_id))
    forged = attacker_put(storage.partition, record.name, record.value, dict(record.tags))
    raw_write(backend, storage.partition, [forged])
    await refused("AF checkpoint with an unkeyed seal", lambda: storage.load(cp.checkpoint_id), CorruptCheckpointError)


async def test_c_key_rotation_reads_old_records_and_signs_with_the_new_key(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    from adapters.agent_framework import CorruptCheckpointError

    old = Store(backend, integrity_key=OLD_KEY).for_user("alice")
    rotated = Store(backend, integrity_key=[NEW_KEY, OLD_KEY]).for_user("alice")
    new_only = Store(backend, integrity_key=NEW_KEY).for_user("alice")
    no_key = Store(backend).for_user("alice")
    old.set_item(SCOPE, "a", {"v": "a"}, tags={"t": "1"})
    step = old.append_step(SCOPE, "1", {"v": 1})
    assert rotated.get_item(SCOPE, "a").value == {"v": "a"}
    rotated.set_item(SCOPE, "b", {"v": "b"})
    assert sorted(i.key for i in rotated.list_items(SCOPE)) == ["a", "b", "steps/1"]
    assert new_only.get_item(SCOPE, "b").value == {"v": "b"}
    for case, call in [
        ("a reader without the new key, of a new record", lambda: old.get_item(SCOPE, "b")),
        ("a reader without the old key, of an old record", lambda: new_only.get_item(SCOPE, "a")),
        ("a reader without any key, of a keyed record", lambda: no_key.get_item(SCOPE, "a")),
        ("a reader without any key: alist", lambda: no_key.alist_items(SCOPE)),
    ]:
        exc = await refused(case, call)
        assert "key" in exc.reason, exc
    again = rotated.append_step(SCOPE, "1", {"v": 1})  # identical re-append after rotation: a no-op
    assert (again.seq, again.etag, again.value) == (step.seq, step.etag, step.value)
    with pytest.raises(StepMismatchError):
        rotated.append_step(SCOPE, "1", {"v": 2})
    assert old.get_item(SCOPE, "steps/1").value == {"v": 1}

    # The same through the environment variable (comma-separated, the first signs).
    with monkeypatch.context() as env:
        env.setenv(ENV_VAR, f"{NEW_KEY},{OLD_KEY}")
        from_env = Store(backend).for_user("alice")
    assert from_env.get_item(SCOPE, "a").value == {"v": "a"}
    c = from_env.set_item(SCOPE, "c", {"v": "c"})
    assert new_only.get_item(SCOPE, "c").etag == c.etag

    # The saver and the Agent Framework storage rotate the same way.
    saver_old = Checkpointer(backend, integrity_key=OLD_KEY).for_user("alice")
    saver_new = Checkpointer(backend, integrity_key=[NEW_KEY, OLD_KEY]).for_user("alice")
    cid = str(uuid6())
    versions = {"ch": f"{1:032}.0", "big": f"{1:032}.0"}
    cp = checkpoint(cid, {"ch": "v", "big": "x" * 3000}, versions)
    meta = {"source": "input", "step": -1}
    saver_old.put(cfg("t"), cp, meta, versions)
    assert values_of(saver_new.get_tuple(cfg("t")))["ch"] == "v"
    saver_new.put(cfg("t"), cp, meta, versions)  # identical: a no-op
    assert values_of(saver_old.get_tuple(cfg("t")))["ch"] == "v"
    with pytest.raises(StepMismatchError):
        saver_new.put(cfg("t"), checkpoint(cid, {"ch": "other", "big": "x" * 3000}, versions), meta, versions)
    later = str(uuid6())
    saver_new.put(cfg("t", cid=cid), checkpoint(later, {"ch": "w", "big": "x" * 3000}, versions), meta, {})
    await refused("checkpoint signed with the new key, read with the old one", lambda: saver_old.get_tuple(cfg("t")))

    af_old, af_new = af_storage(backend, "alice", OLD_KEY), af_storage(backend, "alice", [NEW_KEY, OLD_KEY])
    first = af_checkpoint("wf", "alice")
    await af_old.save(first)
    assert (await af_new.load(first.checkpoint_id)).metadata == {"owner": "alice"}
    assert await af_new.save(first) == first.checkpoint_id  # identical: a no-op
    with pytest.raises(StepMismatchError):
        await af_new.save(dataclasses.replace(first, state={"n": 99}))
    second = af_checkpoint("wf", "alice")
    await af_new.save(second)
    await refused(
        "AF checkpoint signed with the new key, old reader", lambda: af_old.load(second.checkpoint_id), CorruptCheckpointError
    )
    assert (await af_old.load(first.checkpoint_id)).checkpoint_id == first.checkpoint_id


# == d. bad input: library errors before any I/O, nothing written ========================

BAD, UNSERIALIZABLE = InvalidArgumentError, UnserializableValueError
_DEEP: list[Any] = []
for _ in range(100_000):
    _DEEP = [_DEEP]

#: (case, call(m) where m(name) is the store's sync or async method, error).
STORE_BAD_INPUT: list[tuple[str, Callable[[Callable[[str], Any]], Any], type[CheckpointerError]]] = [
    ("set_item(if_match='')", lambda m: m("set_item")(SCOPE, "k", 2, if_match=""), BAD),
    ("set_item(if_match=5)", lambda m: m("set_item")(SCOPE, "k", 2, if_match=5), BAD),
    ("delete_item(if_match='')", lambda m: m("delete_item")(SCOPE, "k", if_match=""), BAD),
    ("list_items(limit='3')", lambda m: m("list_items")(SCOPE, limit="3"), BAD),
    ("list_items(limit=-1)", lambda m: m("list_items")(SCOPE, limit=-1), BAD),
    ("list_items(limit=True)", lambda m: m("list_items")(SCOPE, limit=True), BAD),
    ("set_item(object())", lambda m: m("set_item")(SCOPE, "v", object()), UNSERIALIZABLE),
    ("set_item(nan)", lambda m: m("set_item")(SCOPE, "v", math.nan), UNSERIALIZABLE),
    ("set_item(inf)", lambda m: m("set_item")(SCOPE, "v", math.inf), UNSERIALIZABLE),
    ("create_item(-inf nested)", lambda m: m("create_item")(SCOPE, "v", {"a": [-math.inf]}), UNSERIALIZABLE),
    ("set_item(10**5000)", lambda m: m("set_item")(SCOPE, "v", 10**5000), UNSERIALIZABLE),
    ("set_item(a set)", lambda m: m("set_item")(SCOPE, "v", {1, 2}), UNSERIALIZABLE),
    ("append_step(100,000-deep nesting)", lambda m: m("append_step")(SCOPE, "1", _DEEP), UNSERIALIZABLE),
    ("set_item(a lone surrogate)", lambda m: m("set_item")(SCOPE, "v", "\ud800"), UNSERIALIZABLE),
    ("set_item(tuple keys)", lambda m: m("set_item")(SCOPE, "v", {(1, 2): 3}), UNSERIALIZABLE),
]

BATCH_BAD_INPUT: list[tuple[str, Callable[[Any], Any], type[CheckpointerError]]] = [
    ("batch.set(if_match='')", lambda b: b.set("k", 2, if_match=""), BAD),
    ("batch.delete(if_match='')", lambda b: b.delete("k", if_match=""), BAD),
    ("batch: a key set twice", lambda b: b.set("x", 1).set("x", 2), BAD),
    ("batch: a key set then deleted", lambda b: b.set("x", 1).delete("x"), BAD),
    ("batch: a step appended twice", lambda b: b.append_step("1", 1).append_step("1", 1), BAD),
    ("batch: a step appended and set", lambda b: b.append_step("1", 1).set("steps/1", 1), BAD),
    ("batch.set(nan)", lambda b: b.set("x", math.nan), UNSERIALIZABLE),
]

_BUILTINS = {InvalidArgumentError: (ValueError, TypeError), UnserializableValueError: (TypeError, ValueError)}


def assert_library_error(case: str, exc: BaseException, error: type[CheckpointerError]) -> None:
    assert isinstance(exc, error), f"{case}: {type(exc).__name__}: {exc}"
    for builtin in _BUILTINS[error]:
        assert isinstance(exc, builtin), f"{case}: {type(exc).__name__} is not a {builtin.__name__}"
    assert "nothing was written" in str(exc), f"{case}: {exc}"


async def test_d_store_bad_input_raises_before_any_io(backend: Backend) -> None:
    store = Store(backend).for_user("alice")
    store.set_item(SCOPE, "k", 1)
    before = snapshot(backend, ["alice"])
    failures = []
    for case, call, error in STORE_BAD_INPUT:
        for prefix in ("", "a"):
            try:
                with io_spy(backend) as calls:
                    exc = await refused(prefix + case, lambda: call(lambda name: getattr(store, prefix + name)), Exception)
                assert_library_error(prefix + case, exc, error)
                assert calls == [], f"{prefix}{case}: reached the backend first ({calls})"
            except AssertionError as failure:
                failures.append(str(failure))
    for case, add, error in BATCH_BAD_INPUT:
        for sync in (True, False):
            label = case if sync else f"{case} (abatch)"
            batch = store.batch(SCOPE) if sync else store.abatch(SCOPE)
            batch.set("other", 1)
            try:
                with io_spy(backend) as calls:  # raised by the call that adds it, not at the end of the block
                    exc = await refused(f"{label}, at the call", lambda: add(batch), Exception)
                assert_library_error(label, exc, error)
                assert calls == [], f"{label}: reached the backend ({calls})"
            except AssertionError as failure:
                failures.append(str(failure))
                continue
            with pytest.raises(error):  # and inside a block the same, writing nothing
                if sync:
                    with store.batch(SCOPE) as b:
                        add(b.set("other", 1))
                else:
                    async with store.abatch(SCOPE) as b:
                        add(b.set("other", 1))
    assert not failures, "\n".join(failures)
    assert snapshot(backend, ["alice"]) == before, "a refused call wrote something"


Case = tuple[str, Callable[[Callable[[str], Any]], Any], type[CheckpointerError]]


def saver_bad_input(cid: str) -> list[Case]:
    """(case, call(m), error) for a saver bound to alice whose thread ``t`` has checkpoint ``cid``.

    ``m(name)`` is the saver's sync or async method of that name.
    """
    cp = checkpoint(str(uuid6()), {"ch": "v"}, {"ch": f"{5:032}.0"})
    meta = {"source": "loop", "step": 5}
    new = {"ch": cp["channel_versions"]["ch"]}
    at = cfg("t", cid=cid)

    def with_value(value: Any) -> dict[str, Any]:
        return checkpoint(str(uuid6()), {"ch": value}, {"ch": f"{5:032}.0"})

    def raw_cfg(**conf: Any) -> dict[str, Any]:
        return {"configurable": conf}

    cases: list[Case] = [
        ("get_tuple without thread_id", lambda m: m("get_tuple")(raw_cfg(checkpoint_ns="")), BAD),
        ("get_tuple({})", lambda m: m("get_tuple")({}), BAD),
        ("put without thread_id", lambda m: m("put")(raw_cfg(checkpoint_ns=""), cp, meta, new), BAD),
        ("put_writes without thread_id", lambda m: m("put_writes")(raw_cfg(checkpoint_id=cid), [("ch", 1)], "task"), BAD),
        ("put_writes without checkpoint_id", lambda m: m("put_writes")(cfg("t"), [("ch", 1)], "task"), BAD),
        ("get_tuple(checkpoint_ns=5)", lambda m: m("get_tuple")(cfg("t", ns=5)), BAD),
        ("list(checkpoint_ns=5)", lambda m: m("list")(cfg("t", ns=5)), BAD),
        ("put(checkpoint_ns=5)", lambda m: m("put")(cfg("t", ns=5), cp, meta, new), BAD),
        ("put_writes(checkpoint_ns=b'')", lambda m: m("put_writes")(cfg("t", ns=b"", cid=cid), [("ch", 1)], "task"), BAD),
        ("get_tuple(checkpoint_id=5)", lambda m: m("get_tuple")(raw_cfg(thread_id="t", checkpoint_id=5)), BAD),
        ("list(checkpoint_id=5)", lambda m: m("list")(raw_cfg(thread_id="t", checkpoint_id=5)), BAD),
        ("list(before with checkpoint_id=5)", lambda m: m("list")(cfg("t"), before=raw_cfg(checkpoint_id=5)), BAD),
        ("put(parent checkpoint_id=5)", lambda m: m("put")(raw_cfg(thread_id="t", checkpoint_id=5), cp, meta, new), BAD),
        ("put(checkpoint['id']=5)", lambda m: m("put")(cfg("t"), {**cp, "id": 5}, meta, new), BAD),
        ("put_writes(checkpoint_id=5)", lambda m: m("put_writes")(raw_cfg(thread_id="t", checkpoint_id=5), [("ch", 1)], "task"), BAD),
        ("put_writes(task_id=5)", lambda m: m("put_writes")(at, [("ch", 1)], 5), BAD),
        ("put_writes(task_id=None)", lambda m: m("put_writes")(at, [("ch", 1)], None), BAD),
        ("list(limit='3')", lambda m: m("list")(cfg("t"), limit="3"), BAD),
        ("list(filter='x')", lambda m: m("list")(cfg("t"), filter="x"), BAD),
        ("prune('one-string')", lambda m: m("prune")("one-string"), BAD),
        ("delete_for_runs('one-string')", lambda m: m("delete_for_runs")("run-alice"), BAD),
        ("put(a channel value serde cannot serialize)", lambda m: m("put")(cfg("t"), with_value(object()), meta, new), UNSERIALIZABLE),
        ("put(10**5000 in a channel)", lambda m: m("put")(cfg("t"), with_value(10**5000), meta, new), UNSERIALIZABLE),
        ("put(100,000-deep nesting)", lambda m: m("put")(cfg("t"), with_value(_DEEP), meta, new), UNSERIALIZABLE),
        ("put(a function in the metadata)", lambda m: m("put")(cfg("t"), cp, {**meta, "f": print}, new), UNSERIALIZABLE),
        ("put(10**5000 in the metadata)", lambda m: m("put")(cfg("t"), cp, {**meta, "n": 10**5000}, new), UNSERIALIZABLE),
        ("put_writes(a value serde cannot serialize)", lambda m: m("put_writes")(at, [("ch", object())], "task"), UNSERIALIZABLE),
        ("put_writes(a special write serde cannot serialize)", lambda m: m("put_writes")(at, [("__error__", object())], "task"), UNSERIALIZABLE),
    ]
    for tid in (1.5, b"t", ["t"], True, {"t": 1}):
        cases += [
            (f"get_tuple(thread_id={tid!r})", lambda m, tid=tid: m("get_tuple")(cfg(tid)), BAD),
            (f"list(thread_id={tid!r})", lambda m, tid=tid: m("list")(cfg(tid)), BAD),
            (f"put(thread_id={tid!r})", lambda m, tid=tid: m("put")(cfg(tid), cp, meta, new), BAD),
            (f"put_writes(thread_id={tid!r})", lambda m, tid=tid: m("put_writes")(cfg(tid, cid=cid), [("ch", 1)], "task"), BAD),
            (f"delete_thread({tid!r})", lambda m, tid=tid: m("delete_thread")(tid), BAD),
            (f"copy_thread('t', {tid!r})", lambda m, tid=tid: m("copy_thread")("t", tid), BAD),
            (f"prune([{tid!r}])", lambda m, tid=tid: m("prune")([tid]), BAD),
        ]
    return cases


async def test_d_saver_bad_input_raises_before_any_io(backend: Backend) -> None:
    saver = Checkpointer(backend).for_user("alice")
    ids = fill(saver, "t", "alice", big=True)
    before = snapshot(backend, ["alice"])
    failures = []
    for case, call, error in saver_bad_input(ids[1]):
        for prefix in ("", "a"):
            try:
                with io_spy(backend) as calls:
                    exc = await refused(prefix + case, lambda: call(lambda name: getattr(saver, prefix + name)), Exception)
                assert_library_error(prefix + case, exc, error)
                assert calls == [], f"{prefix}{case}: reached the backend first ({calls})"
            except AssertionError as failure:
                failures.append(str(failure))
    assert not failures, "\n".join(failures)
    assert snapshot(backend, ["alice"]) == before, "a refused call wrote something"
    # Ints and UUIDs are thread ids, as in LangGraph.
    assert saver.get_tuple(cfg(5)) is None and saver.get_tuple(cfg(uuid.uuid4())) is None


# == e. a store written by 0.1 ========================================================


def _old_store_module() -> Any:
    """``tests/data/make_store_0_1.py``: the graph and what the old store holds."""
    name = "tests_data_make_store_0_1"
    if name not in sys.modules:  # registered: LangGraph resolves the state's annotations through it
        spec = importlib.util.spec_from_file_location(name, DATA / "make_store_0_1.py")
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


@pytest.fixture
def old_store(tmp_path: Path) -> Iterator[Any]:
    """A copy of tests/data/store-0.1.db (today's code may write to it) opened as a SqliteBackend."""
    from checkpointers.backends.sqlite import SqliteBackend

    path = tmp_path / "store-0.1.db"
    shutil.copyfile(DATA / "store-0.1.db", path)
    with SqliteBackend(path) as backend:
        yield backend


def test_e_the_committed_old_store_is_small_and_unsealed() -> None:
    path = DATA / "store-0.1.db"
    assert path.stat().st_size < 200_000
    import sqlite3

    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        digests = [d for (d,) in conn.execute("SELECT digest FROM records")]
    assert digests and all(len(d) == 64 and "." not in d for d in digests), "written before seals: bare digests"


async def test_e_a_store_written_by_0_1_is_read_in_full_without_a_key(old_store: Backend) -> None:
    old = _old_store_module()
    store = Store(old_store).for_user(old.USER)
    for key, (value, tags) in old.EXPECTED["items"].items():
        item = store.get_item(old.SCOPE, key)
        assert item is not None and (item.value, dict(item.tags)) == (value, tags), (key, item)
        assert len(item.digest) == 64
    listed = await store.alist_items(old.SCOPE)
    assert sorted(i.key for i in listed) == sorted(old.EXPECTED["items"])
    assert [i.key for i in store.list_items(old.SCOPE, tags={"kind": "plan"})] == ["plan"]
    for key, (value, tags) in old.EXPECTED["other_items"].items():
        item = store.for_user(old.OTHER).get_item(old.SCOPE, key)
        assert (item.value, dict(item.tags)) == (value, tags)
    step = store.get_item(old.SCOPE, "steps/1")
    again = store.append_step(old.SCOPE, "1", {"fetched": 10})  # identical: a no-op over an unsealed record
    assert (again.seq, again.etag) == (step.seq, step.etag)
    with pytest.raises(StepMismatchError):
        store.append_step(old.SCOPE, "1", {"fetched": 11})

    saver = Checkpointer(old_store).for_user(old.USER)
    for cid, values in old.EXPECTED["direct"].items():
        found = saver.get_tuple(cfg(old.DIRECT_THREAD, cid=cid))
        assert found is not None and values_of(found) == values, cid
    latest = await saver.aget_tuple(cfg(old.DIRECT_THREAD))
    assert latest.checkpoint["id"] == old.CHECKPOINT_IDS[-1]
    assert latest.pending_writes == old.EXPECTED["direct_writes"]
    assert latest.metadata["run_id"] == "run-0.1"
    listed_cps = [t.checkpoint["id"] for t in saver.list(cfg(old.DIRECT_THREAD), filter={"run_id": "run-0.1"})]
    assert listed_cps == old.CHECKPOINT_IDS[::-1]

    graph = old.build_graph(saver)
    gcfg = {"configurable": {"thread_id": old.GRAPH_THREAD}}
    state = graph.get_state(gcfg)
    assert {k: state.values[k] for k in ("n", "log")} == old.EXPECTED["graph_final"]
    history = list(graph.get_state_history(gcfg))
    assert len(history) >= 5 and any(s.tasks for s in history)
    more = graph.invoke({"n": 0, "log": []}, gcfg)  # today's code carries the old thread on
    assert more["n"] == 3 and more["log"] == old.EXPECTED["graph_final"]["log"] * 2
    assert len(list(saver.list(None))) > len(old.CHECKPOINT_IDS) + len(history)

    storage = af_storage(old_store, old.USER)
    loaded = [await storage.load(cid) for cid in old.AF_IDS]
    assert [c.state for c in loaded] == [{"n": i, "owner": old.USER} for i in range(len(old.AF_IDS))]
    assert (await storage.get_latest(workflow_name=old.AF_WORKFLOW)).checkpoint_id == old.AF_IDS[-1]
    assert await storage.list_checkpoint_ids(workflow_name=old.AF_WORKFLOW) == old.AF_IDS
    assert [c.checkpoint_id for c in await storage.list_checkpoints(workflow_name=old.AF_WORKFLOW)] == old.AF_IDS


async def test_e_a_store_written_by_0_1_is_refused_with_a_key_unless_accept_unsealed(old_store: Backend) -> None:
    from adapters.agent_framework import CorruptCheckpointError

    old = _old_store_module()
    store = Store(old_store, integrity_key=NEW_KEY).for_user(old.USER)
    saver = Checkpointer(old_store, integrity_key=NEW_KEY).for_user(old.USER)
    storage = af_storage(old_store, old.USER, NEW_KEY)
    for case, call, error in [
        ("get_item", lambda: store.get_item(old.SCOPE, "plan"), CorruptItemError),
        ("alist_items", lambda: store.alist_items(old.SCOPE), CorruptItemError),
        ("get_tuple", lambda: saver.get_tuple(cfg(old.DIRECT_THREAD)), CorruptItemError),
        ("alist", lambda: saver.alist(None), CorruptItemError),
        ("AF load", lambda: storage.load(old.AF_IDS[0]), CorruptCheckpointError),
        ("AF get_latest", lambda: storage.get_latest(workflow_name=old.AF_WORKFLOW), CorruptCheckpointError),
    ]:
        exc = await refused(case, call, error)
        assert "accept_unsealed" in str(exc), exc

    store = Store(old_store, integrity_key=NEW_KEY, accept_unsealed=True).for_user(old.USER)
    saver = Checkpointer(old_store, integrity_key=NEW_KEY, accept_unsealed=True).for_user(old.USER)
    storage = af_storage(old_store, old.USER, NEW_KEY, accept_unsealed=True)
    assert {i.key: i.value for i in store.list_items(old.SCOPE)} == {
        k: v for k, (v, _) in old.EXPECTED["items"].items()
    }
    assert values_of(saver.get_tuple(cfg(old.DIRECT_THREAD))) == old.EXPECTED["direct"][old.CHECKPOINT_IDS[-1]]
    graph_thread = list(saver.list(cfg(old.GRAPH_THREAD, ns=None)))
    assert len(list(saver.list(None))) == len(old.CHECKPOINT_IDS) + len(graph_thread)
    assert (await storage.get_latest(workflow_name=old.AF_WORKFLOW)).checkpoint_id == old.AF_IDS[-1]
    # What such a store writes now is sealed with the key: a keyed reader without the opt-in reads it.
    store.set_item(old.SCOPE, "new", {"v": 1})
    assert Store(old_store, integrity_key=NEW_KEY).for_user(old.USER).get_item(old.SCOPE, "new").value == {"v": 1}


# == the conformance kit's adversarial checks, on every backend =============================


@pytest.mark.parametrize(
    "check",
    LANGGRAPH_ADVERSARIAL_CHECKS + AGENT_FRAMEWORK_ADVERSARIAL_CHECKS,
    ids=lambda check: check.__name__,
)
async def test_the_kits_adversarial_face_checks_pass_on_every_backend(backend: Backend, check: Any) -> None:
    """What ``python -m checkpointers.conformance`` runs against a backend's LangGraph and Agent Framework faces.

    (Its store checks run on every backend in tests/test_contract.py.)
    """
    bind = saver_binder() if check in LANGGRAPH_ADVERSARIAL_CHECKS else storage_binder()
    note = await check(bind(backend))
    assert not note, note  # our saver raises IsolationError: nothing to remark
