"""Moving threads: the export file format, reading our stores, writing to any saver.

A move is a stream of :class:`Entry` (one checkpoint with its writes) from a
*source* (one of our stores, a LangGraph saver, an export file) into a
*sink*: any LangGraph ``BaseCheckpointSaver`` (ours, bound to the target user,
or LangGraph's own), through its public ``put`` and ``put_writes``. Nothing
is held but the entry in hand: memory stays flat in the number of checkpoints.

Each checkpoint is put with every channel as new (``new_versions`` = its
``channel_versions``), so it never depends on its parent being there first:
entries can come in any order, and putting one twice stores nothing new (our
saver's records are append-only, identical re-puts are no-ops). Writes keep
their task id, task path and index: a task's regular writes are put in index
order (the index is the position in ``put_writes``), its special ones
(interrupts, errors, resumes) after them.

**Export format**, version 1: JSON Lines (``.gz``: gzip), one object a line::

    {"kind": "header", "format": "checkpointers-export", "version": 1, ...}
    {"kind": "checkpoint", "thread_id", "checkpoint_ns", "checkpoint_id",
     "parent_checkpoint_id", "checkpoint": V, "metadata": V,
     "channel_values": {channel: V}, "sha256"}
    {"kind": "writes", "thread_id", "checkpoint_ns", "checkpoint_id",
     "task_id", "task_path", "writes": [[idx, channel, V], ...], "sha256"}
    {"kind": "end", "lines": N, "checkpoints": C, "writes": W, "sha256"}

``V`` is a serialized value, ``{"type": T, "data": base64}``, LangGraph's
msgpack (``serde.dumps_typed``): exact, and decoded on import only into
allowed types (nothing named in the file is imported). Each line's
``sha256`` is the SHA-256 of its canonical JSON without that key (sorted keys,
no spaces); the end line's ``sha256`` also covers every line digest before
it, so a line lost, added or changed anywhere is found. ``import`` checks all
of it before it writes anything.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol, cast

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.serde.base import SerializerProtocol

from .._names import Partition
from ..savers import Checkpointer
from ._inspect import task_writes
from ._scan import CKPT, decode_checkpoint, thread_partitions, walk

__all__ = [
    "FORMAT",
    "VERSION",
    "Entry",
    "ExportError",
    "OurSource",
    "Source",
    "check_file",
    "copy_entries",
    "export_entries",
    "import_file",
    "put_entry",
    "writing",
]

FORMAT, VERSION = "checkpointers-export", 1
#: A write as moved: (task_path, task_id, idx, channel, value).
Write = tuple[str, str, int, str, Any]


class ExportError(ValueError):
    """An export file that is not one, is of another version, or fails a digest (nothing was imported)."""


@dataclass
class Entry:
    """One checkpoint (with its channel values) and the writes stored for it."""

    thread_id: str
    ns: str
    checkpoint: dict[str, Any]
    metadata: dict[str, Any]
    parent_id: str | None
    writes: list[Write] = field(default_factory=list)

    @property
    def checkpoint_id(self) -> str:
        return str(self.checkpoint["id"])


class Source(Protocol):
    """Where entries come from: threads one at a time, each thread's entries lazily."""

    def threads(self) -> Iterator[str]: ...

    def entries(self, thread_id: str) -> Iterator[Entry]: ...

    def close(self) -> None: ...


class OurSource:
    """The LangGraph threads of one user of one of our stores."""

    def __init__(self, saver: Checkpointer, user: str) -> None:
        self.saver, self.user, self.view = saver, user, saver.for_user(user)

    def threads(self) -> Iterator[str]:
        for p in thread_partitions(self.saver.backend, self.user):
            yield p.name

    def entries(self, thread_id: str) -> Iterator[Entry]:
        p = Partition(self.user, "langgraph", thread_id)
        for rec in walk(self.saver.backend, p, CKPT, depth=1):
            s = decode_checkpoint(self.saver, p, rec)
            conf = {"thread_id": thread_id, "checkpoint_ns": s.ns, "checkpoint_id": s.cid}
            found = self.view.get_tuple({"configurable": conf})
            if found is None:  # deleted since it was listed
                continue
            writes = task_writes(self.saver, p, s.ns, s.cid, old_layout=getattr(s, "format", 1) < 3)
            yield Entry(thread_id, s.ns, dict(found.checkpoint), dict(found.metadata), s.parent, writes)

    def close(self) -> None:
        self.saver.close()


# -- the sink -------------------------------------------------------------------------


def _config(thread_id: str, ns: str, checkpoint_id: str | None) -> RunnableConfig:
    conf: dict[str, Any] = {"thread_id": thread_id, "checkpoint_ns": ns}
    if checkpoint_id is not None:
        conf["checkpoint_id"] = checkpoint_id
    return {"configurable": conf}


def put_task_writes(
    sink: BaseCheckpointSaver[Any],
    thread_id: str,
    ns: str,
    cid: str,
    task: tuple[str, str],
    writes: list[tuple[int, str, Any]],
) -> None:
    """One task's writes in one ``put_writes``: regular ones in index order, then the special ones."""
    path, task_id = task
    ordered = sorted((w for w in writes if w[0] >= 0), key=lambda w: w[0]) + [w for w in writes if w[0] < 0]
    sink.put_writes(_config(thread_id, ns, cid), [(ch, v) for _, ch, v in ordered], task_id, path)


def _version(v: Any) -> Any:
    """An integer channel version as our saver's string version (``get_next_version``'s format), order kept."""
    return f"{v:032}.{0:016}" if isinstance(v, int) and not isinstance(v, bool) else v


def string_versions(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """``checkpoint`` with integer channel versions (the plain-Redis saver's) made strings.

    Our saver's versions are strings; LangGraph compares a checkpoint's
    versions with the next ones, so a resumed thread must not mix the two.
    Equal integers give equal strings and the order is kept (zero-padded).
    """
    versions = checkpoint.get("channel_versions") or {}
    if not any(isinstance(v, int) for v in versions.values()):
        return checkpoint
    seen = checkpoint.get("versions_seen") or {}
    return {
        **checkpoint,
        "channel_versions": {ch: _version(v) for ch, v in versions.items()},
        "versions_seen": {node: {ch: _version(v) for ch, v in vs.items()} for node, vs in seen.items()},
    }


def put_entry(sink: BaseCheckpointSaver[Any], entry: Entry) -> int:
    """Put one entry's checkpoint, then its writes, task by task; return how many writes."""
    checkpoint = string_versions(entry.checkpoint)
    versions = dict(checkpoint.get("channel_versions") or {})
    sink.put(_config(entry.thread_id, entry.ns, entry.parent_id), checkpoint, entry.metadata, versions)  # type: ignore[arg-type]
    tasks: dict[tuple[str, str], list[tuple[int, str, Any]]] = {}
    for path, task_id, idx, channel, value in entry.writes:
        tasks.setdefault((path, task_id), []).append((idx, channel, value))
    for task, writes in tasks.items():
        put_task_writes(sink, entry.thread_id, entry.ns, entry.checkpoint_id, task, writes)
    return len(entry.writes)


def copy_entries(source: Source, sink: BaseCheckpointSaver[Any], tick: Callable[[int], None]) -> dict[str, int]:
    """Move every thread of ``source`` into ``sink``; counts of threads, checkpoints and writes."""
    counts = {"threads": 0, "checkpoints": 0, "writes": 0}
    for thread_id in source.threads():
        counts["threads"] += 1
        for entry in source.entries(thread_id):
            counts["writes"] += put_entry(sink, entry)
            counts["checkpoints"] += 1
            tick(1)
    return counts


# -- the file -------------------------------------------------------------------------


def _canonical(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _sealed(obj: dict[str, Any]) -> dict[str, Any]:
    return {**obj, "sha256": hashlib.sha256(_canonical(obj)).hexdigest()}


def _value(serde: SerializerProtocol, value: Any) -> dict[str, str]:
    kind, data = serde.dumps_typed(value)
    return {"type": kind, "data": base64.b64encode(data).decode("ascii")}


def _unvalue(serde: SerializerProtocol, v: dict[str, str]) -> Any:
    return serde.loads_typed((v["type"], base64.b64decode(v["data"], validate=True)))


def open_file(path: str | Path, mode: str) -> IO[str]:
    """A text file, gzip-compressed when its name ends in ``.gz`` (or ``.gz.partial``)."""
    if str(path).removesuffix(".partial").endswith(".gz"):
        return cast(IO[str], gzip.open(path, mode + "t", encoding="utf-8"))
    return open(path, mode, encoding="utf-8")


@contextmanager
def writing(path: str | Path) -> Iterator[IO[str]]:
    """Write ``path`` through ``<path>.partial``, renamed into place only when the block succeeds.

    A failed export (a damaged record, a lost connection) leaves no file
    behind, rather than a truncated one.
    """
    partial = Path(f"{path}.partial")
    try:
        with open_file(partial, "w") as f:
            yield f
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def _entry_lines(serde: SerializerProtocol, e: Entry) -> Iterator[dict[str, Any]]:
    body = {k: v for k, v in e.checkpoint.items() if k != "channel_values"}
    where = {"thread_id": e.thread_id, "checkpoint_ns": e.ns, "checkpoint_id": e.checkpoint_id}
    yield {
        "kind": "checkpoint",
        **where,
        "parent_checkpoint_id": e.parent_id,
        "checkpoint": _value(serde, body),
        "metadata": _value(serde, e.metadata),
        "channel_values": {ch: _value(serde, v) for ch, v in (e.checkpoint.get("channel_values") or {}).items()},
    }
    tasks: dict[tuple[str, str], list[list[Any]]] = {}
    for path, task_id, idx, channel, value in e.writes:
        tasks.setdefault((path, task_id), []).append([idx, channel, _value(serde, value)])
    for (path, task_id), writes in tasks.items():
        yield {"kind": "writes", **where, "task_id": task_id, "task_path": path, "writes": writes}


def export_entries(
    source: Source, out: IO[str], serde: SerializerProtocol, header: dict[str, Any], tick: Callable[[int], None]
) -> dict[str, int]:
    """Write every thread of ``source`` to ``out`` in the export format; the counts written."""
    chain = hashlib.sha256()
    counts = {"threads": 0, "checkpoints": 0, "writes": 0, "lines": 0}

    def emit(obj: dict[str, Any]) -> None:
        line = _sealed(obj)
        chain.update(line["sha256"].encode("ascii"))
        out.write(json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n")
        counts["lines"] += 1

    emit({"kind": "header", "format": FORMAT, "version": VERSION, **header})
    for thread_id in source.threads():
        counts["threads"] += 1
        for entry in source.entries(thread_id):
            for obj in _entry_lines(serde, entry):
                emit(obj)
            counts["checkpoints"] += 1
            counts["writes"] += len(entry.writes)
            tick(1)
    end = {"kind": "end", "lines": counts["lines"], "checkpoints": counts["checkpoints"], "writes": counts["writes"]}
    emit({**end, "chain": chain.hexdigest()})
    return counts


def _lines(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    with open_file(path, "r") as f:
        for number, text in enumerate(f, 1):
            try:
                obj = json.loads(text)
            except ValueError as exc:
                raise ExportError(f"{path}: line {number} is not JSON ({exc})") from None
            if not isinstance(obj, dict) or "kind" not in obj or "sha256" not in obj:
                raise ExportError(f"{path}: line {number} is not a line of a {FORMAT} file")
            yield number, obj


def check_file(path: str | Path, tick: Callable[[int], None] = lambda n: None) -> dict[str, Any]:
    """Check every digest of an export file without decoding values; its header and end line.

    Raises :class:`ExportError` naming the first bad line.
    """
    chain = hashlib.sha256()
    header: dict[str, Any] | None = None
    end: dict[str, Any] | None = None
    count = 0
    for number, obj in _lines(path):
        if end is not None:
            raise ExportError(f"{path}: line {number} comes after the end line")
        stated = obj.pop("sha256")
        if hashlib.sha256(_canonical(obj)).hexdigest() != stated:
            raise ExportError(f"{path}: line {number} ({obj.get('kind')}) does not match its sha256: damaged")
        if number == 1:
            if obj.get("kind") != "header" or obj.get("format") != FORMAT:
                raise ExportError(f"{path}: no {FORMAT} header on line 1")
            if obj.get("version") != VERSION:
                raise ExportError(f"{path}: export format version {obj.get('version')!r}; this version reads {VERSION}")
            header = obj
        if obj["kind"] == "end":
            if obj.get("chain") != chain.hexdigest() or obj.get("lines") != count:
                raise ExportError(f"{path}: the end line does not match the lines before it (lines lost or added)")
            end = obj
        chain.update(stated.encode("ascii"))
        count += 1
        tick(1)
    if header is None or end is None:
        raise ExportError(f"{path}: {'empty' if header is None else 'no end line: the file is truncated'}")
    return {"header": header, "end": end}


def import_file(
    path: str | Path, sink: BaseCheckpointSaver[Any], serde: SerializerProtocol, tick: Callable[[int], None]
) -> dict[str, int]:
    """Put every checkpoint and task's writes of a checked export file into ``sink``."""
    counts = {"checkpoints": 0, "writes": 0}
    for _, obj in _lines(path):
        if obj["kind"] == "checkpoint":
            checkpoint = _unvalue(serde, obj["checkpoint"])
            checkpoint["channel_values"] = {ch: _unvalue(serde, v) for ch, v in obj["channel_values"].items()}
            metadata = _unvalue(serde, obj["metadata"])
            entry = Entry(obj["thread_id"], obj["checkpoint_ns"], checkpoint, metadata, obj["parent_checkpoint_id"])
            put_entry(sink, entry)
            counts["checkpoints"] += 1
            tick(1)
        elif obj["kind"] == "writes":
            writes = [(idx, ch, _unvalue(serde, v)) for idx, ch, v in obj["writes"]]
            task = (obj["task_path"], obj["task_id"])
            put_task_writes(sink, obj["thread_id"], obj["checkpoint_ns"], obj["checkpoint_id"], task, writes)
            counts["writes"] += len(writes)
    return counts
