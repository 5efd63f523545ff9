"""The read-only verbs over one of our stores: threads, history, show, stats.

Each function returns plain data (dicts and lists of JSON-able values); the
command line prints it as a table or as JSON.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from langgraph.checkpoint.base import writes_sort_key

from .._names import Partition
from .._names import encode_component as enc
from .._saver_flows import writes_prefix
from ..savers import Checkpointer
from ._scan import CKPT, decode_checkpoint, kind_of, layout_of, thread_partitions, walk

__all__ = [
    "OTHER_SPACES",
    "expiry_text",
    "history",
    "jsonable",
    "show",
    "space_totals",
    "task_writes",
    "thread_summaries",
    "thread_summary",
]

#: Partition spaces besides LangGraph's: the item API's and the Agent Framework storage's.
OTHER_SPACES = ("items", "agent_framework")

Tick = Callable[[int], None]


def _no_tick(_: int) -> None:
    return None


def thread_summary(saver: Checkpointer, p: Partition) -> dict[str, Any]:
    """Counts and bytes of one thread, and the time of its newest checkpoint (one walk)."""
    counts = {"checkpoint": 0, "writes": 0, "blob": 0, "lease": 0, "unknown": 0}
    size = 0
    newest = None
    for rec in walk(saver.backend, p):
        kind = kind_of(rec.name).kind
        counts[kind] += 1
        size += len(rec.value)
        if kind == "checkpoint" and (newest is None or rec.name.rsplit("/", 1)[1] > newest.name.rsplit("/", 1)[1]):
            newest = rec
    last = None
    if newest is not None:
        last = decode_checkpoint(saver, p, newest).checkpoint.get("ts")
    return {
        "thread_id": p.name,
        "checkpoints": counts["checkpoint"],
        "writes": counts["writes"],
        "blobs": counts["blob"],
        "records": sum(counts.values()),
        "bytes": size,
        "last_write": last,
        "expires": expiry_text(saver.backend.expiry(p)),
    }


def expiry_text(expires_at: float | None) -> str | None:
    """A stored expiry as ISO 8601 UTC to the second (``None``: never expires)."""
    if expires_at is None:
        return None
    return datetime.datetime.fromtimestamp(expires_at, datetime.timezone.utc).isoformat(timespec="seconds")


def thread_summaries(saver: Checkpointer, user: str, tick: Tick = _no_tick) -> Iterator[dict[str, Any]]:
    """:func:`thread_summary` of every thread of ``user``, in thread id order."""
    for p in thread_partitions(saver.backend, user):
        yield thread_summary(saver, p)
        tick(1)


def space_totals(saver: Checkpointer, user: str) -> dict[str, dict[str, int]]:
    """Partitions, records and bytes of ``user`` in the item and Agent Framework spaces."""
    out: dict[str, dict[str, int]] = {}
    for space in OTHER_SPACES:
        parts = [Partition(user, space, n) for n in saver.backend.partitions(user, space)]
        records = size = 0
        for p in parts:
            for rec in walk(saver.backend, p):
                records += 1
                size += len(rec.value)
        out[space] = {"partitions": len(parts), "records": records, "bytes": size}
    return out


def history(
    saver: Checkpointer, user: str, thread: str, limit: int | None, tick: Tick = _no_tick
) -> list[dict[str, Any]]:
    """The checkpoints of a thread, newest first (every namespace), without channel values."""
    p = Partition(user, "langgraph", thread)
    rows = []
    writes: dict[str, int] = {}
    for rec in walk(saver.backend, p, CKPT, values=True):
        tick(1)
        kind = kind_of(rec.name)
        if kind.kind == "writes" and kind.owner is not None:
            writes[kind.owner] = writes.get(kind.owner, 0) + 1
        if kind.kind != "checkpoint":
            continue
        s = decode_checkpoint(saver, p, rec)
        rows.append(
            {
                "checkpoint_id": s.cid,
                "checkpoint_ns": s.ns,
                "parent_checkpoint_id": s.parent,
                "ts": s.checkpoint.get("ts"),
                "source": s.metadata.get("source"),
                "step": s.metadata.get("step"),
                "writes_records": 0,
                "_name": rec.name,
            }
        )
    rows.sort(key=lambda r: r["checkpoint_id"], reverse=True)
    for row in rows:
        row["writes_records"] = writes.get(row.pop("_name"), 0)
    return rows[:limit] if limit else rows


def show(saver: Checkpointer, user: str, thread: str, checkpoint: str | None, ns: str) -> dict[str, Any] | None:
    """The decoded checkpoint (the latest of ``ns`` without ``checkpoint``), metadata and pending writes."""
    conf: dict[str, Any] = {"thread_id": thread, "checkpoint_ns": ns}
    if checkpoint:
        conf["checkpoint_id"] = checkpoint
    found = saver.for_user(user).get_tuple({"configurable": conf})
    if found is None:
        return None
    cid = found.config["configurable"]["checkpoint_id"]
    return {
        "config": found.config,
        "parent_config": found.parent_config,
        "checkpoint": jsonable(found.checkpoint),
        "metadata": jsonable(found.metadata),
        "pending_writes": [
            {"task_id": task, "task_path": path, "idx": idx, "channel": channel, "value": jsonable(value)}
            for path, task, idx, channel, value in task_writes(saver, Partition(user, "langgraph", thread), ns, cid)
        ],
    }


def task_writes(
    saver: Checkpointer, p: Partition, ns: str, cid: str, *, old_layout: bool = True
) -> list[tuple[str, str, int, str, Any]]:
    """The writes stored for one checkpoint as ``(task_path, task_id, idx, channel, value)``, in write order.

    ``old_layout``: also look where records of formats 1 and 2 kept their
    writes (``w/<ns>/<id>/``); a record of format 3 has its writes only as
    its children.
    """
    out: list[tuple[str, str, int, str, Any]] = []
    prefixes = [writes_prefix(ns, cid)] + ([f"w/{enc(ns)}/{enc(cid)}/"] if old_layout else [])
    for prefix in prefixes:
        for rec in walk(saver.backend, p, prefix):
            out.extend(layout_of(saver)._pending(p, rec, f"checkpoint {cid!r} of thread {p.name!r}"))
    return sorted(out, key=lambda w: writes_sort_key(w[0], w[1], w[2]))


def jsonable(value: Any) -> Any:
    """``value`` as JSON-able data: containers kept, models and dataclasses as dicts, the rest as repr."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in value]
    if isinstance(value, (bytes, bytearray)):
        return {"bytes_base64": base64.b64encode(bytes(value)).decode("ascii")}
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return {"type": type(value).__name__, **jsonable(dump())}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {"type": type(value).__name__, **jsonable(dataclasses.asdict(value))}
    return repr(value)
