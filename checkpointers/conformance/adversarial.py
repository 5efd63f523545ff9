"""Adversarial checks: a hostile writer of the storage, crafted payloads, a config naming another user.

The promises these hold any target to (issue 12 of this project):

* **Records are bound to their place.** A record copied from one user's
  partition into another's, moved to another name or scope, spliced from two
  records or carrying forged tags is refused with
  :class:`~checkpointers.errors.CorruptItemError`, never returned as data.
  Store checks (they take an :class:`~.contract.Api`):
  :func:`check_record_copied_from_another_user_is_corrupt` (group
  ``isolation``) and :func:`check_record_moved_or_damaged_is_corrupt` (group
  ``contract``). They write through a Store as user B, copy or alter the raw
  record through the backend interface, and read through user A's Store; so
  they hold a backend to returning a record's value, digest and tags exactly
  as written, and a ``store_factory`` to sealing what it writes.
* **Stored bytes never run code** (groups ``langgraph`` and
  ``agent_framework``): records holding a msgpack extension, a pickle frame
  or a json frame that name ``os.system``, or an Agent Framework pickled leaf
  whose ``__reduce__`` calls it, are written straight into the storage with a
  correct digest and a valid unkeyed seal (what anyone who can write the
  storage can compute). Every read must raise (``CorruptItemError`` for our
  savers, the framework's ``WorkflowCheckpointException`` for a storage),
  and the marker file the payload would create (in a fresh temporary
  directory) must never appear.
* **A record copied from another user's thread or storage** is refused
  (groups ``langgraph`` and ``agent_framework``), as for items.
* **A bound view is a wall** (group ``langgraph``): a saver that
  ``saver_for(alice)`` returned, called with a config whose
  ``configurable.user_id`` names bob, must never read, list or change bob's
  checkpoints.

What a check can require of a saver or storage that is not ours
---------------------------------------------------------------

The crafted-payload and copy checks need to write records behind the face's
back, in its own layout: that is only possible for our own
:class:`~checkpointers.savers.Checkpointer` and
:class:`~adapters.agent_framework.IsolatedCheckpointStorage` (over any
backend, yours included: give a Backend and the groups run through them).
For anything else (``factory(user)`` returning a third-party saver or
storage) they report *not applicable* with the reason; they never count as
passed.

``configurable.user_id`` is this library's convention; LangGraph's own
savers and most third-party ones ignore it, and a saver bound to one tenant
by construction (one store per user) is isolated whatever the config says.
So :func:`check_langgraph_config_naming_another_user` requires only what
isolation needs: every call with a config naming bob either raises (any
exception: the report names it when it is not ``IsolationError``) or acts
for the bound user, and bob's checkpoints stay exactly as they were; a saver
that returns or changes bob's data fails. A saver that ignores ``user_id``
passes with a note. Our own ``Checkpointer`` is held to what its
documentation promises: ``IsolationError`` on every method, sync and async,
and nothing written for either user.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import pickle
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar

from ..backends.base import Backend, ListQuery, Put, Record
from ..errors import CorruptItemError, IsolationError
from ..integrity import Integrity
from ..names import Partition
from ..names import encode_component as _enc
from ..store import item_name as _name
from .contract import Api, _raises

__all__ = [
    "AGENT_FRAMEWORK_ADVERSARIAL_CHECKS",
    "CONTRACT_ADVERSARIAL_CHECKS",
    "ISOLATION_ADVERSARIAL_CHECKS",
    "LANGGRAPH_ADVERSARIAL_CHECKS",
    "NotApplicable",
    "check_af_checkpoint_copied_from_another_user",
    "check_af_crafted_checkpoint_never_runs_code",
    "check_langgraph_checkpoint_copied_from_another_user",
    "check_langgraph_config_naming_another_user",
    "check_langgraph_crafted_checkpoint_never_runs_code",
    "check_record_copied_from_another_user_is_corrupt",
    "check_record_moved_or_damaged_is_corrupt",
]


class NotApplicable(Exception):
    """Raised by a check that cannot run against this target; the reason is reported."""


F = TypeVar("F", bound=Callable[..., Any])


def _runs(mode: str) -> Callable[[F], F]:
    """The mode label the report shows for a face check (it runs every mode it names itself)."""

    def mark(check: F) -> F:
        check.mode = mode  # type: ignore[attr-defined]
        return check

    return mark


# -- helpers ----------------------------------------------------------------------


def _copy(record: Record, **changes: Any) -> Put:
    """A raw copy of ``record`` as stored (value, digest, etag, tags), optionally altered."""
    put = Put(record.name, record.value, record.digest, record.etag, dict(record.tags))
    return replace(put, **changes)


def _attacker_put(p: Partition, name: str, value: bytes, tags: dict[str, str] | None = None) -> Put:
    """A record written by someone without a key: a correct content digest and a valid unkeyed seal."""
    tags = tags or {}
    sha = hashlib.sha256(value).hexdigest()
    return Put(name, value, Integrity([]).seal(p, name, tags, sha), f"cf-{uuid.uuid4().hex}", tags)


class _Raw:
    """The backend interface, driven sync (in a thread) or async like the check's API."""

    def __init__(self, backend: Backend, sync: bool) -> None:
        self.backend, self.sync = backend, sync

    async def _call(self, name: str, *args: Any) -> Any:
        if self.sync:
            return await asyncio.to_thread(getattr(self.backend, name), *args)
        return await getattr(self.backend, "a" + name)(*args)

    async def records(self, p: Partition, prefix: str = "") -> list[Record]:
        return list(await self._call("list", p, ListQuery(prefix=prefix)))

    async def one(self, p: Partition, name: str) -> Record:
        record: Record | None
        (record,) = await self._call("get", p, [name])
        assert record is not None, f"the record {name!r} just written is not in {p}"
        return record

    async def write(self, p: Partition, puts: list[Put]) -> None:
        result = await self._call("write", p, puts)
        assert result.conflict is None, f"an unconditional write was refused: {result.conflict}"


async def _outcome(call: Callable[[], Any]) -> Any:
    """Call, await if needed, drain generators and async generators."""
    result = call()
    if asyncio.iscoroutine(result) or isinstance(result, asyncio.Future):
        result = await result
    if hasattr(result, "__aiter__"):
        return [x async for x in result]
    if hasattr(result, "__next__"):
        return list(result)
    return result


@contextmanager
def _marker() -> Iterator[Path]:
    """A path in a fresh temporary directory that a payload would create if it ran."""
    where = Path(tempfile.mkdtemp(prefix="checkpointers-conformance-"))
    try:
        yield where / "payload-ran"
    finally:
        shutil.rmtree(where, ignore_errors=True)


class _Call:
    """Pickles as the call ``fn(*args)``: what a ``__reduce__`` exploit looks like."""

    def __init__(self, fn: Any, *args: Any) -> None:
        self.fn, self.args = fn, args

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return self.fn, self.args


# -- (i) records copied or damaged at the storage level: store checks ------------------


async def check_record_copied_from_another_user_is_corrupt(api: Api) -> None:
    """B's item copied into A's partition (empty place, over A's own) raises CorruptItemError for A."""
    run = uuid.uuid4().hex[:8]
    a, b = api.for_user(f"{run}-alice"), api.for_user(f"{run}-bob")
    raw = _Raw(api.store.backend, api.sync)
    await b.set("s", "secret", {"owner": "bob"}, tags={"kind": "plan"})
    await b.set("s", "both", {"owner": "bob"})
    await a.set("s", "both", {"owner": "alice"})
    pa, pb = a.store.partition("s"), b.store.partition("s")
    await raw.write(pa, [_copy(r) for r in await raw.records(pb)])
    await _raises(CorruptItemError, a.get("s", "secret"), "get of B's item copied into A's partition")
    await _raises(CorruptItemError, a.get("s", "both"), "get of B's item copied over A's own")
    await _raises(CorruptItemError, a.list("s"), "list over B's items copied into A's partition")
    await _raises(CorruptItemError, a.list("s", tags={"kind": "plan"}), "list by tag over B's copied item")
    got = await b.get("s", "secret")
    assert got is not None and got.value == {"owner": "bob"}, f"B's own item: {got}"


async def check_record_moved_or_damaged_is_corrupt(api: Api) -> None:
    """A record moved to another name or scope, with forged tags, or with swapped values raises CorruptItemError."""
    raw = _Raw(api.store.backend, api.sync)
    store = api.store
    for k in ("a", "b", "c", "d", "tagged", "extra"):
        await api.set("s", k, {"v": k}, tags={"kind": "plan"} if k in ("tagged", "extra") else None)
    p = store.partition("s")
    recs = {r.name: r for r in await raw.records(p)}

    def rec(key: str) -> Record:
        return recs[_name(key)]

    a, b, c, d = rec("a"), rec("b"), rec("c"), rec("d")
    await raw.write(store.partition("s2"), [_copy(a)])  # moved to another scope
    await raw.write(
        p,
        [
            _copy(a, name=_name("moved")),  # moved to another name
            _copy(b, value=a.value, digest=a.digest),  # a splice: value and digest travel together
            _copy(c, value=d.value),  # damage: the value alone changed
            _copy(rec("tagged"), tags={"kind": "forged"}),
            _copy(rec("extra"), tags={"kind": "plan", "admin": "1"}),
        ],
    )
    for key, case in (
        ("moved", "a record moved to another name"),
        ("b", "value and digest of another record"),
        ("c", "another record's value under its own digest"),
        ("tagged", "a forged tag value"),
        ("extra", "an added tag"),
    ):
        await _raises(CorruptItemError, api.get("s", key), f"get of {case}")
    await _raises(CorruptItemError, api.get("s2", "a"), "get of a record moved to another scope")
    await _raises(CorruptItemError, api.list("s"), "list over moved and damaged records")
    await _raises(CorruptItemError, api.list("s", tags={"kind": "forged"}), "list by a forged tag")
    assert (await api.get("s", "a")).value == {"v": "a"}, "the original record must still read"


ISOLATION_ADVERSARIAL_CHECKS = [check_record_copied_from_another_user_is_corrupt]
CONTRACT_ADVERSARIAL_CHECKS = [check_record_moved_or_damaged_is_corrupt]


# -- LangGraph ----------------------------------------------------------------------------

#: ``saver_for(user)`` returns a saver bound to ``user`` over the shared store.
SaverFor = Callable[[str], Any]


def _ours(saver: Any) -> bool:
    try:
        from ..savers import Checkpointer
    except ImportError:  # pragma: no cover - langgraph missing: the group is N/A anyway
        return False
    return isinstance(saver, Checkpointer)


def _reachable_saver(saver: Any) -> tuple[Backend, str]:
    """The backend and user of one of our bound savers, or NotApplicable."""
    backend, user = getattr(saver, "backend", None), getattr(saver, "user", None)
    if not _ours(saver) or not isinstance(backend, Backend) or user is None:
        raise NotApplicable(
            f"{type(saver).__name__} is not a checkpointers Checkpointer bound to a user: its storage "
            f"layout is unknown, so records cannot be written behind its back"
        )
    return backend, user


def _lg_config(thread: str, *, user: Any = None, checkpoint_id: str | None = None, ns: Any = "") -> dict[str, Any]:
    conf: dict[str, Any] = {"thread_id": thread}
    if ns is not None:
        conf["checkpoint_ns"] = ns
    if checkpoint_id is not None:
        conf["checkpoint_id"] = checkpoint_id
    if user is not None:
        conf["user_id"] = user
    return {"configurable": conf}


def _lg_checkpoint(checkpoint_id: str, values: dict[str, Any], versions: dict[str, Any]) -> dict[str, Any]:
    return {
        "v": 4,
        "id": checkpoint_id,
        "ts": datetime.now(timezone.utc).isoformat(),
        "channel_values": values,
        "channel_versions": versions,
        "versions_seen": {},
        "updated_channels": sorted(values),
    }


class _Face:
    """One saver, called through its sync methods (in a thread) or its async ones."""

    def __init__(self, saver: Any, sync: bool) -> None:
        self.saver, self.sync = saver, sync

    def call(self, method: str, *args: Any, **kwargs: Any) -> Callable[[], Any]:
        """A zero-argument callable making the call (for :func:`_outcome`)."""
        if method == "list":
            if self.sync:
                return lambda: asyncio.to_thread(lambda: list(self.saver.list(*args, **kwargs)))
            return lambda: self.saver.alist(*args, **kwargs)
        if self.sync:
            return lambda: asyncio.to_thread(getattr(self.saver, method), *args, **kwargs)
        return lambda: getattr(self.saver, "a" + method)(*args, **kwargs)

    async def __call__(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return await _outcome(self.call(method, *args, **kwargs))


async def _seen(face: _Face, thread: str) -> list[tuple[Any, ...]]:
    """What a user observes of one thread: ids, values, metadata, pending writes."""
    tuples = await face("list", _lg_config(thread, ns=None))
    return sorted(
        (
            t.checkpoint["id"],
            repr(t.checkpoint["channel_values"]),
            repr(sorted(t.metadata.items(), key=repr)),
            repr(sorted(t.pending_writes or [], key=repr)),
        )
        for t in tuples
    )


async def _put_one(face: _Face, thread: str, checkpoint_id: str, owner: str) -> dict[str, Any]:
    version = face.saver.get_next_version(None, None)
    config = await face(
        "put",
        _lg_config(thread),
        _lg_checkpoint(checkpoint_id, {"ch": f"value-of-{owner}"}, {"ch": version}),
        {"source": "input", "step": -1, "parents": {}, "owner": owner},
        {"ch": version},
    )
    await face("put_writes", config, [("ch", f"write-of-{owner}")], "task-1", "")
    return config  # type: ignore[no-any-return]


@_runs("sync+async")
async def check_langgraph_config_naming_another_user(saver_for: SaverFor) -> str:
    """A bound view called with ``configurable.user_id`` naming another user never serves or changes that user.

    Our Checkpointer must raise IsolationError on every method and write nothing;
    another saver may ignore ``user_id`` (the binding wins) or raise (see the module docstring).
    """
    from langgraph.checkpoint.base.id import uuid6

    tag = f"cf{uuid.uuid4().hex[:8]}-"
    alice, bob = f"{tag}alice", f"{tag}bob"
    notes: set[str] = set()
    for sync in (False, True):
        mode = "sync" if sync else "async"
        thread = f"{tag}thread-{mode}"
        a, b = _Face(saver_for(alice), sync), _Face(saver_for(bob), sync)
        strict = _ours(a.saver)
        a_id, b_id = (str(uuid6(clock_seq=i)) for i in range(2))
        await _put_one(a, thread, a_id, "alice")
        await _put_one(b, thread, b_id, "bob")
        own = await a("get_tuple", _lg_config(thread, user=alice))
        assert own is not None and own.checkpoint["channel_values"] == {"ch": "value-of-alice"}, (
            f"{mode}: alice's view, config naming alice herself: {own}"
        )
        a_before, b_before = await _seen(a, thread), await _seen(b, thread)
        later = str(uuid6(clock_seq=9))
        version = a.saver.get_next_version(None, None)
        hostile = _lg_config(thread, user=bob)
        at_bob = _lg_config(thread, user=bob, checkpoint_id=b_id)
        calls = [
            ("get_tuple", a.call("get_tuple", hostile)),
            ("get_tuple(checkpoint_id)", a.call("get_tuple", at_bob)),
            ("list", a.call("list", hostile)),
            ("list(every thread)", a.call("list", {"configurable": {"user_id": bob}})),
            (
                "put",
                a.call(
                    "put",
                    hostile,
                    _lg_checkpoint(later, {"ch": "forged"}, {"ch": version}),
                    {"source": "update", "step": 1, "parents": {}, "owner": "forged"},
                    {"ch": version},
                ),
            ),
            ("put_writes", a.call("put_writes", at_bob, [("ch", "forged")], "task-2", "")),
        ]
        for name, call in calls:
            case = f"{mode} {name} on alice's view with user_id naming bob"
            try:
                got = await _outcome(call)
            except IsolationError:
                continue
            except Exception as exc:
                assert not strict, f"{case}: raised {type(exc).__name__}: {exc}, not IsolationError"
                notes.add(f"{name}: raises {type(exc).__name__} (not IsolationError)")
                continue
            assert not strict, f"{case}: returned {got!r:.200} instead of raising IsolationError"
            assert "value-of-bob" not in repr(got) and "write-of-bob" not in repr(got), (
                f"{case}: served bob's data: {got!r:.300}"
            )
            notes.add("ignores configurable.user_id (the binding wins; raising IsolationError is recommended)")
        assert await _seen(b, thread) == b_before, f"{mode}: a call naming bob on alice's view changed bob's thread"
        if strict:
            assert await _seen(a, thread) == a_before, f"{mode}: a refused call changed alice's thread"
        for face in (a, b):
            try:
                await face("delete_thread", thread)
            except NotImplementedError:
                pass
    return "; ".join(sorted(notes))


def _evil_payloads(command: str) -> dict[str, Callable[[str], dict[str, bytes]]]:
    """Crafted record bytes by name: ``payload(checkpoint_id)`` -> record, channel value, writes record."""
    import ormsgpack
    from langgraph.checkpoint.serde import jsonplus

    def frame(kind: str, data: bytes) -> bytes:
        return bytes([len(kind)]) + kind.encode() + data

    def ext(code: int, *fields: Any) -> Any:
        return ormsgpack.Ext(code, ormsgpack.packb(list(fields)))

    single = ext(jsonplus.EXT_CONSTRUCTOR_SINGLE_ARG, "os", "system", command)
    exts = {
        "msgpack constructor ext naming os.system": single,
        "msgpack kwargs ext naming os.system": ext(
            jsonplus.EXT_CONSTRUCTOR_KW_ARGS, "os", "system", {"command": command}
        ),
        "msgpack method ext naming os.system": ext(jsonplus.EXT_METHOD_SINGLE_ARG, "os", "system", command, "__call__"),
        "os.system ext inside an allowed type (deque)": ext(
            jsonplus.EXT_CONSTRUCTOR_POS_ARGS, "collections", "deque", [[single]]
        ),
    }

    def msgpack_payload(evil: Any) -> Callable[[str], dict[str, bytes]]:
        def build(cid: str) -> dict[str, bytes]:
            return {
                "record": frame("msgpack", ormsgpack.packb(_record_payload(cid, metadata={"x": {"y": evil}}))),
                "value": frame("msgpack", ormsgpack.packb({"y": [evil]})),
                "write": frame(
                    "msgpack", ormsgpack.packb({"task_id": "task", "task_path": "", "w": [[0, "ch", {"y": evil}]]})
                ),
            }

        return build

    def same(data: bytes) -> Callable[[str], dict[str, bytes]]:
        return lambda cid: {"record": data, "value": data, "write": data}

    out = {name: msgpack_payload(evil) for name, evil in exts.items()}
    out["pickle frame calling os.system"] = same(frame("pickle", pickle.dumps(_Call(os.system, command))))
    lc = {"lc": 2, "type": "constructor", "id": ["os", "system"], "args": [command]}
    out["json frame with an lc constructor of os.system"] = same(frame("json", json.dumps(lc).encode()))
    return out


def _record_payload(cid: str, **fields: Any) -> dict[str, Any]:
    """Our saver's checkpoint record layout (format 3), without channel values unless given."""
    payload: dict[str, Any] = {
        "v": 3,
        "ns": "",
        "id": cid,
        "parent": None,
        "checkpoint": {
            "v": 4,
            "id": cid,
            "ts": "2025-01-01T00:00:00+00:00",
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


def _crafted_puts(p: Partition, placement: str, frames: dict[str, bytes], cid: str) -> list[Put]:
    import ormsgpack

    from ..savers import checkpoint_record_name as ckpt_name
    from ..savers import checkpoint_writes_prefix as writes_prefix

    def clean(**fields: Any) -> bytes:
        return b"\x07msgpack" + ormsgpack.packb(_record_payload(cid, **fields))

    name, versions = ckpt_name("", cid), {"ch": f"{1:032}.0"}
    if placement == "record":
        return [_attacker_put(p, name, frames["record"])]
    if placement == "inline channel value":
        return [_attacker_put(p, name, clean(inline={"ch": frames["value"]}, versions=versions))]
    if placement == "blob":
        sha = hashlib.sha256(frames["value"]).hexdigest()
        return [
            _attacker_put(p, "b/" + sha, frames["value"]),
            _attacker_put(p, name, clean(blobs={"ch": sha}, versions=versions)),
        ]
    writes = writes_prefix("", cid) + _enc("task") + "/0"
    return [_attacker_put(p, name, clean()), _attacker_put(p, writes, frames["write"])]


_PLACEMENTS = ("record", "inline channel value", "blob", "pending write")


@_runs("sync+async")
async def check_langgraph_crafted_checkpoint_never_runs_code(saver_for: SaverFor) -> None:
    """Crafted checkpoint bytes naming os.system (msgpack ext, pickle, json) raise CorruptItemError; nothing runs."""
    from langgraph.checkpoint.base.id import uuid6

    from ..savers import LANGGRAPH_SPACE as SPACE

    tag = f"cf{uuid.uuid4().hex[:8]}-"
    saver = saver_for(f"{tag}alice")
    backend, user = _reachable_saver(saver)
    with _marker() as marker:
        payloads = _evil_payloads(f"touch {marker}")
        for sync in (False, True):
            face, raw = _Face(saver, sync), _Raw(backend, sync)
            for i, (what, build) in enumerate(payloads.items()):
                placement = _PLACEMENTS[i % len(_PLACEMENTS)] if sync else _PLACEMENTS[-1 - i % len(_PLACEMENTS)]
                thread, cid = f"{tag}{i}-{sync}", str(uuid6())
                p = Partition(user, SPACE, thread)
                await raw.write(p, _crafted_puts(p, placement, build(cid), cid))
                for read, call in (
                    ("get_tuple", face.call("get_tuple", _lg_config(thread))),
                    ("get_tuple(checkpoint_id)", face.call("get_tuple", _lg_config(thread, checkpoint_id=cid))),
                    ("list", face.call("list", _lg_config(thread, ns=None))),
                ):
                    case = f"{'sync' if sync else 'async'} {read}: {what} in the {placement}"
                    try:
                        got = await _outcome(call)
                    except CorruptItemError:
                        pass
                    except Exception as exc:
                        raise AssertionError(
                            f"{case}: raised {type(exc).__name__}: {exc}, not CorruptItemError"
                        ) from exc
                    else:
                        ran = "; the payload ran os.system" if marker.exists() else ""
                        raise AssertionError(f"{case}: returned {got!r:.200} instead of raising CorruptItemError{ran}")
                    assert not marker.exists(), f"{case}: the payload ran os.system"
                await face("delete_thread", thread)


@_runs("sync+async")
async def check_langgraph_checkpoint_copied_from_another_user(saver_for: SaverFor) -> None:
    """Bob's thread (checkpoint, blob, writes) copied into alice's raises CorruptItemError for alice."""
    from langgraph.checkpoint.base.id import uuid6

    from ..savers import LANGGRAPH_SPACE as SPACE

    tag = f"cf{uuid.uuid4().hex[:8]}-"
    alice, bob = saver_for(f"{tag}alice"), saver_for(f"{tag}bob")
    (a_backend, a_user), (b_backend, b_user) = _reachable_saver(alice), _reachable_saver(bob)
    for sync in (False, True):
        a, b = _Face(alice, sync), _Face(bob, sync)
        thread = f"{tag}t-{sync}"
        version = b.saver.get_next_version(None, None)
        cid = str(uuid6())
        config = await b(
            "put",
            _lg_config(thread),
            _lg_checkpoint(cid, {"ch": "bob's", "big": "b" * 4096}, {"ch": version, "big": version}),
            {"source": "input", "step": -1, "parents": {}},
            {"ch": version, "big": version},
        )
        await b("put_writes", config, [("ch", "bob's write")], "task", "")
        records = await _Raw(b_backend, sync).records(Partition(b_user, SPACE, thread))
        await _Raw(a_backend, sync).write(Partition(a_user, SPACE, thread), [_copy(r) for r in records])
        for read, call in (
            ("get_tuple", a.call("get_tuple", _lg_config(thread))),
            ("get_tuple(checkpoint_id)", a.call("get_tuple", _lg_config(thread, checkpoint_id=cid))),
            ("list", a.call("list", _lg_config(thread, ns=None))),
        ):
            try:
                got = await _outcome(call)
            except CorruptItemError:
                continue
            raise AssertionError(f"{'sync' if sync else 'async'} {read} of bob's thread copied to alice: {got!r:.200}")
        mine = await b("get_tuple", _lg_config(thread))
        assert mine is not None and mine.checkpoint["channel_values"]["ch"] == "bob's", f"bob's own: {mine}"
        for face in (a, b):
            await face("delete_thread", thread)


LANGGRAPH_ADVERSARIAL_CHECKS = [
    check_langgraph_config_naming_another_user,
    check_langgraph_crafted_checkpoint_never_runs_code,
    check_langgraph_checkpoint_copied_from_another_user,
]


# -- Agent Framework ----------------------------------------------------------------------

#: ``storage_for(user)`` returns a CheckpointStorage bound to ``user``.
StorageFor = Callable[[str], Any]


def _reachable_storage(storage: Any) -> tuple[Backend, Partition]:
    try:
        from adapters.agent_framework import IsolatedCheckpointStorage
    except ImportError:  # pragma: no cover
        IsolatedCheckpointStorage = None  # type: ignore[assignment,misc]  # noqa: N806
    backend, partition = getattr(storage, "backend", None), getattr(storage, "partition", None)
    if (
        IsolatedCheckpointStorage is None
        or not isinstance(storage, IsolatedCheckpointStorage)
        or not isinstance(backend, Backend)
        or not isinstance(partition, Partition)
    ):
        raise NotApplicable(
            f"{type(storage).__name__} is not a checkpointers IsolatedCheckpointStorage: its storage "
            f"layout is unknown, so records cannot be written behind its back"
        )
    return backend, partition


def _af_checkpoint(workflow: str, owner: str) -> Any:
    from agent_framework import WorkflowCheckpoint

    return WorkflowCheckpoint(
        workflow_name=workflow,
        graph_signature_hash="conformance",
        state={"owner": owner},
        iteration_count=0,
    )


async def _af_refused(case: str, call: Callable[[], Any], marker: Path | None = None) -> None:
    from agent_framework import WorkflowCheckpointException

    try:
        got = await _outcome(call)
    except WorkflowCheckpointException as exc:
        assert isinstance(exc, CorruptItemError), f"{case}: {type(exc).__name__}, not a CorruptItemError: {exc}"
        return
    except Exception as exc:
        raise AssertionError(f"{case}: raised {type(exc).__name__}: {exc}, not CorruptCheckpointError") from exc
    ran = "; the payload ran" if marker is not None and marker.exists() else ""
    raise AssertionError(f"{case}: returned {got!r:.200} instead of raising CorruptCheckpointError{ran}")


def _af_reads(storage: Any, workflow: str, checkpoint_id: str) -> list[tuple[str, Callable[[], Any]]]:
    return [
        ("load", lambda: storage.load(checkpoint_id)),
        ("get_latest", lambda: storage.get_latest(workflow_name=workflow)),
        ("list_checkpoints", lambda: storage.list_checkpoints(workflow_name=workflow)),
    ]


@_runs("async")
async def check_af_crafted_checkpoint_never_runs_code(storage_for: StorageFor) -> None:
    """A stored checkpoint whose pickled leaf calls os.system (lying type markers) is refused; nothing runs."""
    tag = f"cf{uuid.uuid4().hex[:8]}-"
    storage = storage_for(f"{tag}alice")
    backend, partition = _reachable_storage(storage)
    raw = _Raw(backend, sync=False)
    with _marker() as marker:
        command = f"touch {marker}"
        leaves = {
            "os.system typed as builtins:int": (_Call(os.system, command), "builtins:int"),
            "os.system typed as itself": (_Call(os.system, command), f"{os.system.__module__}:system"),
            "eval typed as builtins:str": (_Call(eval, f"__import__('os').system({command!r})"), "builtins:str"),
        }
        for i, (what, (call, type_key)) in enumerate(leaves.items()):
            workflow = f"{tag}wf-{i}"
            good = _af_checkpoint(workflow, "alice")
            await storage.save(good)
            (record,) = [r for r in await raw.records(partition) if r.tags.get("id") == good.checkpoint_id]
            doc = json.loads(record.value)
            place = ("state", "metadata", "messages")[i % 3]
            leaf = {"__pickled__": base64.b64encode(pickle.dumps(call)).decode(), "__type__": type_key}
            doc[place] = {"k": [{"nested": leaf}]}
            forged = json.dumps(doc).encode()
            await raw.write(partition, [_attacker_put(partition, record.name, forged, dict(record.tags))])
            for read, read_call in _af_reads(storage, workflow, good.checkpoint_id):
                case = f"{read}: {what} in {place}"
                await _af_refused(case, read_call, marker)
                assert not marker.exists(), f"{case}: the payload ran"
            await storage.delete(good.checkpoint_id)


@_runs("async")
async def check_af_checkpoint_copied_from_another_user(storage_for: StorageFor) -> None:
    """Bob's stored checkpoint copied into alice's storage (new id, and over alice's own) is refused."""
    tag = f"cf{uuid.uuid4().hex[:8]}-"
    alice, bob = storage_for(f"{tag}alice"), storage_for(f"{tag}bob")
    (a_backend, a_part), (b_backend, b_part) = _reachable_storage(alice), _reachable_storage(bob)
    workflow = f"{tag}wf"
    mine = _af_checkpoint(workflow, "alice")
    await alice.save(mine)
    theirs = _af_checkpoint(workflow, "bob")
    same_id = replace(_af_checkpoint(workflow, "bob"), checkpoint_id=mine.checkpoint_id)
    for cp in (theirs, same_id):
        await bob.save(cp)
    wanted = {theirs.checkpoint_id, same_id.checkpoint_id}
    records = [r for r in await _Raw(b_backend, False).records(b_part) if r.tags.get("id") in wanted]
    await _Raw(a_backend, False).write(a_part, [_copy(r) for r in records])
    for cp in (theirs, same_id):
        for read, call in _af_reads(alice, workflow, cp.checkpoint_id):
            await _af_refused(f"{read}: bob's checkpoint {cp.checkpoint_id} copied into alice's storage", call)
    got = await bob.load(theirs.checkpoint_id)
    assert got.state == {"owner": "bob"}, f"bob's own: {got.state}"
    for storage in (alice, bob):
        for cp in (mine, theirs):
            await storage.delete(cp.checkpoint_id)


AGENT_FRAMEWORK_ADVERSARIAL_CHECKS = [
    check_af_crafted_checkpoint_never_runs_code,
    check_af_checkpoint_copied_from_another_user,
]
