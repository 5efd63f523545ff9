"""``verify`` and ``gc`` over one of our stores.

``verify`` reads every record of a user's partitions and checks it the way a
read would (content digest, seal binding it to its user/space/partition/name/
tags, decoding), then the references of each LangGraph thread: every blob a
checkpoint names exists, every blob is named by some checkpoint, every writes
record belongs to a stored checkpoint. ``gc`` removes what the saver's own
``prune`` removes (:meth:`~checkpointers._saver_flows.SaverFlows._collect_flow`,
the same code): unreferenced blobs, writes of missing checkpoints and, with
``keep``, all but the newest ``keep`` checkpoints of each namespace.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from .._flows import Flow
from .._names import Partition, decode_component
from ..backends.base import Record, WriteResult, content_digest
from ..backends.ops import WriteOp
from ..errors import CorruptItemError, DisallowedTypeError
from ..leases import LeaseSite
from ..leases import decode as decode_lease
from ..savers import Checkpointer
from ..store import decode_value
from ._inspect import OTHER_SPACES
from ._scan import BLOB, CKPT, decode_checkpoint, kind_of, layout_of, thread_partitions, walk, walk_resilient

__all__ = ["Finding", "ThreadCheck", "collect", "verify_thread", "verify_user"]

Tick = Callable[[int], None]


@dataclass(frozen=True)
class Finding:
    """One damaged, missing or orphaned record."""

    user: str
    space: str
    partition: str
    record: str
    problem: str  #: "corrupt", "disallowed-type", "missing", "orphaned", "unknown"
    detail: str

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


@dataclass
class ThreadCheck:
    """What one partition's check found, and how many records it read."""

    records: int = 0
    findings: list[Finding] = field(default_factory=list)


def _problem(exc: CorruptItemError) -> str:
    return "disallowed-type" if isinstance(exc, DisallowedTypeError) else "corrupt"


class _Refs:
    """The references of one thread seen so far (names and digests only)."""

    def __init__(self) -> None:
        self.checkpoints: set[str] = set()
        self.named: dict[str, str] = {}  # blob digest -> the first checkpoint naming it
        self.blobs: set[str] = set()
        self.writes: list[tuple[str, str]] = []  # (writes record, its checkpoint) not matched yet

    def saw(self, name: str) -> None:
        """A record is there (damaged or not): a blob is not missing, a checkpoint's writes are no orphans."""
        kind = kind_of(name).kind
        if kind == "checkpoint":
            self.checkpoints.add(name)
        elif kind == "blob":
            self.blobs.add(name[len(BLOB) :])


def _check_record(saver: Checkpointer, p: Partition, rec: Record, refs: _Refs) -> str | None:
    """Check one record of a thread; return an unknown name's reason, raise CorruptItemError if damaged."""
    kind = kind_of(rec.name)
    where = f"thread {p.name!r}"
    if kind.kind == "checkpoint":
        s = decode_checkpoint(saver, p, rec)
        for channel, data in s.inline.items():
            layout_of(saver)._loads(f"channel {channel!r} inline in {rec.name!r}", data)
        for sha in s.blobs.values():
            refs.named.setdefault(sha, rec.name)
    elif kind.kind == "writes" and kind.owner is not None:
        layout_of(saver)._pending(p, rec, where)
        if kind.owner not in refs.checkpoints:
            refs.writes.append((rec.name, kind.owner))
    elif kind.kind == "blob":
        sha = rec.name[len(BLOB) :]
        if content_digest(rec.digest) != sha:
            raise CorruptItemError(rec.name, "its stored digest is not the one its name says")
        layout_of(saver)._load(p, f"blob {rec.name!r} of {where}", rec)
    elif kind.kind == "lease":  # the thread's lease record (held, released, or vacant): it must decode
        decode_lease(LeaseSite(layout_of(saver).integrity, p, p.name), rec)
    else:
        return "not a record name of the LangGraph layout"
    return None


def verify_thread(saver: Checkpointer, p: Partition) -> ThreadCheck:
    """Check every record of one LangGraph thread and its references."""
    out, refs = ThreadCheck(), _Refs()

    def add(record: str, problem: str, detail: str) -> None:
        out.findings.append(Finding(p.user, p.space, p.name, record, problem, detail))

    try:
        for rec in walk_resilient(saver.backend, p):
            out.records += 1
            refs.saw(rec.key if isinstance(rec, CorruptItemError) else rec.name)
            if isinstance(rec, CorruptItemError):
                add(rec.key, _problem(rec), rec.reason)
                continue
            try:
                unknown = _check_record(saver, p, rec, refs)
            except CorruptItemError as exc:
                add(rec.name, _problem(exc), exc.reason)
                continue
            if unknown:
                add(rec.name, "unknown", unknown)
    except CorruptItemError as exc:  # the names themselves could not be listed
        add(exc.key, "corrupt", f"the partition cannot be listed: {exc.reason}")
        return out
    for sha, owner in sorted(refs.named.items()):
        if sha not in refs.blobs:
            add(BLOB + sha, "missing", f"named by checkpoint record {owner!r}, not stored (or damaged)")
    for sha in sorted(refs.blobs - refs.named.keys()):
        add(BLOB + sha, "orphaned", "a blob no checkpoint names (gc removes it)")
    for name, owner in refs.writes:
        if owner not in refs.checkpoints:
            add(name, "orphaned", f"writes of checkpoint record {owner!r}, which is not stored (gc removes them)")
    return out


def verify_other(saver: Checkpointer, p: Partition) -> ThreadCheck:
    """Check the records of an item or Agent Framework partition (digest and seal; item values decoded)."""
    out = ThreadCheck()
    for rec in walk_resilient(saver.backend, p):
        out.records += 1
        try:
            if isinstance(rec, CorruptItemError):
                raise rec
            saver.integrity.check(p, rec, rec.name)
            if p.space == "items":
                decode_value(rec.name, rec.value)
        except CorruptItemError as exc:
            out.findings.append(Finding(p.user, p.space, p.name, exc.key, _problem(exc), exc.reason))
    return out


def verify_user(
    saver: Checkpointer, user: str, thread: str | None = None, tick: Tick = lambda n: None
) -> Iterator[ThreadCheck]:
    """Check every partition of ``user`` (or one thread), one result per partition."""
    if thread is not None:
        yield verify_thread(saver, Partition(user, "langgraph", thread))
        return
    for p in thread_partitions(saver.backend, user):
        yield verify_thread(saver, p)
        tick(1)
    for space in OTHER_SPACES:
        for name in sorted(saver.backend.partitions(user, space)):
            yield verify_other(saver, Partition(user, space, name))
            tick(1)


# -- gc -----------------------------------------------------------------------------


def _drive(flow: Flow[Any], saver: Checkpointer, dry_run: bool) -> list[str]:
    """Run a flow with the backend; return the names its writes delete (not deleted when ``dry_run``)."""
    deleted: list[str] = []
    try:
        op = next(flow)
        while True:
            if isinstance(op, WriteOp):
                deleted.extend(d.name for d in op.deletes)
                result: Any = WriteResult(records=[]) if dry_run else op.call(saver.backend)
                if result.conflict is not None:
                    raise CorruptItemError(result.conflict.name, "changed while gc ran; run gc again")
            else:
                result = op.call(saver.backend)
            op = flow.send(result)
    except StopIteration:
        return deleted
    finally:
        flow.close()


#: 100-ns intervals from the UUID epoch (1582-10-15) to the Unix epoch.
_UUID_EPOCH = 0x01B21DD213814000


def checkpoint_time(name: str) -> float | None:
    """When a checkpoint record's id was made (seconds since the epoch), from LangGraph's uuid6 ids.

    None when the id is not a version-6 UUID (a caller-chosen id): such a
    checkpoint is never judged old.
    """
    cid = decode_component(name.rsplit("/", 1)[-1])
    try:
        u = uuid.UUID(cid or "")
    except ValueError:
        return None
    if u.version != 6:
        return None
    ticks = (((u.int >> 80) & 0xFFFFFFFFFFFF) << 12) | ((u.int >> 64) & 0x0FFF)
    return (ticks - _UUID_EPOCH) / 1e7


def doomed_checkpoints(names: list[str], keep: int | None, before: float | None) -> set[str]:
    """The checkpoint records ``gc`` removes: all but the newest ``keep`` of each namespace, and
    (``before``) those made before that time; the newest of each namespace always stays."""
    groups: dict[str, list[str]] = {}
    for n in names:
        groups.setdefault(n.rsplit("/", 1)[0], []).append(n)
    doomed: set[str] = set()
    for group in groups.values():
        ordered = sorted(group)
        if keep is not None:
            doomed.update(ordered[: max(len(ordered) - keep, 0)])
        if before is not None:
            for n in ordered[:-1]:
                made = checkpoint_time(n)
                if made is not None and made < before:
                    doomed.add(n)
    return doomed


def collect(
    saver: Checkpointer, p: Partition, keep: int | None, dry_run: bool, before: float | None = None
) -> dict[str, Any]:
    """gc one thread: what was (or, with ``dry_run``, would be) deleted, by kind."""
    names = [r.name for r in walk(saver.backend, p, CKPT, depth=1, values=False)]
    doomed = doomed_checkpoints(names, keep, before)
    deleted = _drive(layout_of(saver)._collect_flow(p, names, doomed, orphans=True), saver, dry_run)
    by_kind: dict[str, list[str]] = {"checkpoint": [], "writes": [], "blob": [], "lease": [], "unknown": []}
    for name in deleted:
        by_kind[kind_of(name).kind].append(name)
    return {"thread_id": p.name, "deleted": by_kind, "dry_run": dry_run}
