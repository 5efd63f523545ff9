"""The bytes of the S3 backend's objects: records, tombstones and batch manifests.

No I/O and no boto3: encoders, and decoders that check every field before
anything acts on it. Where the objects live (the key layout) is
:mod:`checkpointers.backends.s3`'s; what the batch protocol does with them is
:mod:`checkpointers.backends._s3_batch`'s.

=====================  ======================================================
record                 ``CKS3`` + header length (4 bytes, big-endian) + header
                       ``{"e": etag, "d": digest, "s": seq, "t": {tags}}``
                       (+ ``"x": batch id``, the *marker*, + ``"o": 1`` when
                       the batch is optimistic, + ``"g": generation`` when
                       above 0) + the value
tombstone              the same framing, header ``{"z": 1, "x": batch id}``
redo-log manifest      ``CKTX`` + header length + header (a list of
                       ``{"n": name, "p": S3 ETag or null, "l": body length,
                       "d": is a delete}``) + the bodies, in order
optimistic manifest    ``CKTX`` + ``{"o": 1, "n": [names]}`` (+ ``"a": 1``
                       once a recovery is aborting it)
partition lifetime     ``CKEX`` + ``{"g": generation, "e": expiry (seconds
                       since the epoch) or null}`` (retention; absent:
                       generation 0, no expiry)
=====================  ======================================================

A damaged object is :class:`~checkpointers.errors.CorruptItemError` naming
it (a record by its name, a manifest as ``tx/<id>``); the cheap checks run on
the read path and the reason is only worked out when one fails.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import CorruptItemError
from .base import Put, Record

__all__ = [
    "Lifetime",
    "Obj",
    "Op",
    "OptimisticManifest",
    "RedoLog",
    "decode_lifetime",
    "decode_manifest",
    "lifetime_body",
    "decode_object",
    "optimistic_manifest",
    "record_body",
    "redo_manifest",
    "shown",
    "tombstone",
]

_MAGIC = b"CKS3"
_TX_MAGIC = b"CKTX"
_EX_MAGIC = b"CKEX"
SEQ_SPAN = 10**20 - 1  # seqs are microsecond timestamps, far below this
TX_ID = re.compile(r"[0-9]{20}-[0-9a-f]{32}\Z")  # a batch id, as a marker or a manifest's key
_NAME = re.compile(r"[%\-/0-9A-Z_a-z]*\Z")  # a record name (= its inverted form)


@dataclass(frozen=True)
class Obj:
    """A record object as read: the record (None for a tombstone), marker and S3 ETag."""

    record: Record | None
    tx: str | None
    s3etag: str
    optimistic: bool = False  #: the marker is an optimistic batch's
    name: str = ""  #: the record name it was read under (also for a tombstone)
    gen: int = 0  #: the partition generation it was written in (retention)


@dataclass(frozen=True)
class Op:
    """One operation of a redo-log batch: the body to store under ``name``.

    ``pre`` is the S3 ETag the operation replaces (None: the name must be
    absent); ``delete`` marks a tombstone body.
    """

    name: str
    pre: str | None
    body: bytes
    delete: bool


@dataclass(frozen=True)
class RedoLog:
    """A decoded redo-log manifest: every operation, checked."""

    ops: tuple[Op, ...]


@dataclass(frozen=True)
class OptimisticManifest:
    """A decoded optimistic manifest: the record names, and whether a recovery is aborting it."""

    names: tuple[str, ...]
    aborting: bool


# -- records and tombstones ----------------------------------------------------


def _encode(header: dict[str, Any], value: bytes) -> bytes:
    h = json.dumps(header, separators=(",", ":")).encode()
    return _MAGIC + len(h).to_bytes(4, "big") + h + value


def record_body(put: Put, seq: int, tx: str | None = None, optimistic: bool = False, gen: int = 0) -> bytes:
    """The object of ``put`` stored with ``seq``, marked with batch ``tx`` (optimistic or not), generation ``gen``."""
    header: dict[str, Any] = {"e": put.etag, "d": put.digest, "s": seq, "t": dict(put.tags)}
    if tx:
        header["x"] = tx
    if optimistic:
        header["o"] = 1
    if gen:
        header["g"] = gen
    return _encode(header, put.value)


def tombstone(tx: str) -> bytes:
    """The object a redo-log batch stores over a record it deletes (reads as absent)."""
    return _encode({"z": 1, "x": tx}, b"")


def as_record(put: Put, seq: int) -> Record:
    """The record ``put`` becomes when stored with ``seq``."""
    return Record(put.name, put.value, dict(put.tags), put.etag, put.digest, seq)


def decode_object(name: str, body: bytes, s3etag: str, values: bool = True) -> Obj:
    """A record object's bytes as an :class:`Obj`; :class:`CorruptItemError` naming ``name`` if damaged.

    Every header field is checked for its type with a few cheap tests; the
    reason is only worked out when one fails (:func:`_header_problem`).
    """
    n = int.from_bytes(body[4:8], "big")
    if body[:4] != _MAGIC or len(body) < 8 + n:
        raise CorruptItemError(name, _framing_problem(body, _MAGIC, "record"))
    try:
        h = json.loads(body[8 : 8 + n])
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise CorruptItemError(name, f"record header does not decode: {type(exc).__name__}: {exc}") from None
    if type(h) is dict:
        tx = h.get("x")
        if tx is not None and not (type(tx) is str and TX_ID.match(tx)):
            pass  # a damaged marker: reported below
        elif "z" in h:
            if h["z"] == 1 and len(h) == (1 if tx is None else 2):
                return Obj(None, tx, s3etag, False, name)
        else:
            e, d, s, t, g = h.get("e"), h.get("d"), h.get("s"), h.get("t"), h.get("g", 0)
            if (
                type(g) is int
                and 0 <= g <= SEQ_SPAN
                and type(e) is str
                and type(d) is str
                and type(s) is int
                and type(t) is dict
                and 0 <= s <= SEQ_SPAN
                and e.isascii()
                and d.isascii()
                and h.get("o", 1) == 1
                and (not t or all(type(v) is str for v in t.values()))  # JSON keys are str
            ):
                record = Record(name, body[8 + n :] if values else b"", t, e, d, s)
                return Obj(record, tx, s3etag, "o" in h, name, g)
    raise CorruptItemError(name, _header_problem(h))


def _framing_problem(body: bytes, magic: bytes, what: str) -> str:
    """Why ``body`` is not framed as ``magic`` + header length + header (+ the rest)."""
    if not body:
        return f"the S3 object is empty, not a checkpointers {what}"
    if body[:4] != magic:
        return f"the S3 object is not a checkpointers {what} (starts with {body[:8]!r})"
    if len(body) < 8:
        return f"the S3 object is truncated inside the {what} header's length ({len(body)} bytes)"
    n = int.from_bytes(body[4:8], "big")
    rest = len(body) - 8
    return f"the {what} header's length ({n:,} bytes) runs past the end of the object ({rest:,} bytes after it)"


def _header_problem(h: Any) -> str:
    """Why a decoded record header ``h`` is not one (called only when a check failed)."""
    if type(h) is not dict:
        return f"record header is a JSON {type(h).__name__}, not an object"
    tx = h.get("x")
    if tx is not None and not (type(tx) is str and TX_ID.match(tx)):
        return f"record header's batch marker 'x' is {shown(tx)}, not a batch id"
    if "z" in h:
        return f"tombstone header is {shown(h)}, not {{'z': 1, 'x': batch id}}"
    for key, kind in (("e", "str"), ("d", "str"), ("s", "int"), ("t", "dict")):
        if key not in h:
            return f"record header has no {key!r} field"
        if type(h[key]).__name__ != kind:
            return f"record header's {key!r} is {shown(h[key])}, not {'an' if kind == 'int' else 'a'} {kind}"
    if not 0 <= h["s"] <= SEQ_SPAN:
        return f"record header's seq {h['s']!r} is out of range"
    if type(h.get("g", 0)) is not int or not 0 <= h.get("g", 0) <= SEQ_SPAN:
        return f"record header's generation 'g' is {shown(h['g'])}, not an int in range"
    for key in ("e", "d"):
        if not h[key].isascii():
            return f"record header's {key!r} is {shown(h[key])}, not ASCII"
    if h.get("o", 1) != 1:
        return f"record header's optimistic flag 'o' is {shown(h['o'])}, not 1"
    bad = next(((k, v) for k, v in h["t"].items() if type(k) is not str or type(v) is not str), None)
    if bad is not None:
        return f"record header's tags map {shown(bad[0])} to {shown(bad[1])}: tags are str -> str"
    return f"record header {shown(h)} is not a record's"


def shown(value: Any) -> str:
    """``repr(value)`` cut to 60 characters, with its type when that is not obvious."""
    text = repr(value)
    text = text if len(text) <= 60 else text[:57] + "..."
    return text if isinstance(value, (str, dict, list)) else f"{text} ({type(value).__name__})"


# -- manifests -------------------------------------------------------------------


def optimistic_manifest(names: Sequence[str], aborting: bool = False) -> bytes:
    """The manifest of an optimistic batch over ``names`` (``aborting``: a recovery is undoing it)."""
    header: dict[str, Any] = {"o": 1, "n": list(names)}
    if aborting:
        header["a"] = 1
    return _TX_MAGIC + json.dumps(header, separators=(",", ":")).encode()


def redo_manifest(ops: Sequence[Op]) -> bytes:
    """The manifest of a redo-log batch: every operation and its body."""
    header = [{"n": op.name, "p": op.pre, "l": len(op.body), "d": op.delete} for op in ops]
    h = json.dumps(header, separators=(",", ":")).encode()
    return _TX_MAGIC + len(h).to_bytes(4, "big") + h + b"".join(op.body for op in ops)


def decode_manifest(tx: str, data: bytes) -> RedoLog | OptimisticManifest:
    """A manifest's bytes, checked in full before anything acts on it.

    A roll-forward writes its bodies, an abort deletes the records it names:
    a damaged manifest is a :class:`CorruptItemError` naming ``tx/<id>``, and
    nothing is written or deleted because of it. Each body must be a record
    (or, for a delete, a tombstone) carrying this batch's marker, and the
    bodies must fill the manifest exactly, so a damaged length can never
    hand one operation another's bytes.
    """
    label = f"tx/{tx}"
    if data[:4] == _TX_MAGIC and data[4:5] == b"{":
        return _decode_optimistic(label, data)
    n = int.from_bytes(data[4:8], "big")
    if data[:4] != _TX_MAGIC or len(data) < 8 + n:
        raise CorruptItemError(label, _framing_problem(data, _TX_MAGIC, "batch manifest"))
    try:
        header = json.loads(data[8 : 8 + n])
    except (ValueError, RecursionError) as exc:
        raise CorruptItemError(label, f"batch manifest header does not decode: {type(exc).__name__}: {exc}") from exc
    if type(header) is not list or not header:
        raise CorruptItemError(label, f"batch manifest header is {shown(header)}, not a list of operations")
    return RedoLog(_redo_ops(label, tx, header, data, 8 + n))


def _decode_optimistic(label: str, data: bytes) -> OptimisticManifest:
    try:
        h = json.loads(data[4:])
    except (ValueError, RecursionError) as exc:
        reason = f"optimistic batch manifest does not decode: {type(exc).__name__}: {exc}"
        raise CorruptItemError(label, reason) from exc
    names = h.get("n") if type(h) is dict else None
    if (
        type(names) is list
        and h.get("o") == 1
        and h.get("a", 1) == 1
        and all(type(n) is str and _NAME.match(n) for n in names)
        and len(set(names)) == len(names)
    ):
        return OptimisticManifest(tuple(names), "a" in h)
    raise CorruptItemError(
        label, f"optimistic batch manifest {shown(h)} is not {{'o': 1, 'n': [distinct record names]}}"
    )


def _redo_ops(label: str, tx: str, header: list[Any], data: bytes, pos: int) -> tuple[Op, ...]:
    """The operations of a redo-log manifest whose bodies start at ``pos``, each checked."""
    ops: list[Op] = []
    seen: set[str] = set()
    for i, op in enumerate(header):
        if not _op_header_ok(op, seen, len(data) - pos):
            raise CorruptItemError(
                label,
                f"batch manifest operation {i} is {shown(op)}, not {{'n': a record name not named before, "
                f"'p': S3 ETag or null, 'l': a body length within the manifest, 'd': bool}}",
            )
        name, body = op["n"], data[pos : pos + op["l"]]
        try:
            obj = decode_object(name, body, "", False)
        except CorruptItemError as exc:
            reason = f"the body of operation {i} (record {name!r}) is damaged: {exc.reason}"
            raise CorruptItemError(label, reason) from exc
        if obj.tx != tx or obj.optimistic or (obj.record is None) != op["d"]:
            kind = "tombstone" if op["d"] else "record"
            raise CorruptItemError(label, f"the body of operation {i} (record {name!r}) is not this batch's {kind}")
        seen.add(name)
        ops.append(Op(name, op["p"], body, op["d"]))
        pos += op["l"]
    if pos != len(data):
        raise CorruptItemError(label, f"{len(data) - pos:,} bytes follow the last operation's body")
    return tuple(ops)


def _op_header_ok(op: Any, seen: set[str], room: int) -> bool:
    """Whether one redo-log operation's header is well formed (its body fits in ``room`` bytes)."""
    return bool(
        type(op) is dict
        and type(op.get("n")) is str
        and _NAME.match(op["n"])
        and op["n"] not in seen
        and "p" in op
        and (op["p"] is None or type(op["p"]) is str)
        and type(op.get("l")) is int
        and 0 <= op["l"] <= room
        and type(op.get("d")) is bool
    )


# -- partition lifetimes (retention) -----------------------------------------------


@dataclass(frozen=True)
class Lifetime:
    """A partition's lifetime object: its generation and expiry (seconds since the epoch, None: never).

    Only records of the current generation are the partition's; a write to
    an expired partition (and a sweep) moves to a new generation first, so
    everything older reads as absent at once, before it is deleted.
    """

    gen: int = 0
    expires_at: float | None = None


def lifetime_body(life: Lifetime) -> bytes:
    """The bytes of a partition's lifetime object."""
    return _EX_MAGIC + json.dumps({"g": life.gen, "e": life.expires_at}, separators=(",", ":")).encode()


def decode_lifetime(label: str, data: bytes) -> Lifetime:
    """A lifetime object's bytes, checked; :class:`CorruptItemError` naming ``label`` if damaged."""
    try:
        h = json.loads(data[4:]) if data[:4] == _EX_MAGIC else None
    except (ValueError, RecursionError):
        h = None
    if type(h) is dict and set(h) == {"g", "e"}:
        g, e = h["g"], h["e"]
        if type(g) is int and 0 <= g <= SEQ_SPAN and (e is None or (type(e) in (int, float) and e == e)):
            return Lifetime(g, None if e is None else float(e))
    reason = f"the partition lifetime object is {shown(data[:60])}, not CKEX + {{'g': generation, 'e': expiry}}"
    raise CorruptItemError(label, reason)
