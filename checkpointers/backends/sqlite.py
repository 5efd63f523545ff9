"""SQLite backend: the embedded default, one file shared by threads and processes.

Every operation is written **once**, as a plain function of a stdlib
``sqlite3.Connection`` (``_get``, ``_write``, ``_list``, ``_partitions``,
``_drop``). The sync face runs it on a pooled connection; the async face runs
the sync method on the backend's worker thread (:class:`~.base.Offload`, what
aiosqlite does for one connection), so no SQL or transaction logic exists
twice and the event loop never runs SQLite code.

Durability and concurrency
--------------------------

* The file is in WAL mode with ``synchronous=NORMAL``: a committed batch
  survives the process being killed (``kill -9``) at any point, and readers
  never block the writer. A power loss or OS crash may lose the last few
  committed transactions (never corrupt the file); pass
  ``synchronous="FULL"`` to fsync on every commit if that matters more than
  write latency.
* Every :meth:`~SqliteBackend.write` is ONE ``BEGIN IMMEDIATE`` transaction:
  the batch's conditions are checked with :func:`~.base.evaluate` against rows
  read inside that transaction, then applied; a refused batch is rolled back.
  ``BEGIN IMMEDIATE`` takes the file's write lock up front, so two processes
  can never both pass a check and then both write. A batch of puts that must
  find their names absent (appends, creates) is first tried without the read,
  as an insert that skips existing names, while the writer connection's memo
  of the partition's seq is current (see :class:`_Connection`); if it skipped
  a name, that transaction is rolled back and the checked one runs.
* ``seq``: a write counts up from the partition's highest seq or
  ``seq_counter`` (raised by deletes to the highest seq they remove),
  whichever is higher, so within a partition it is strictly increasing, also
  after the record with the highest seq is deleted, and a put writes no
  counter row.
* A busy file (another connection holds the write lock) is waited for by
  SQLite's busy handler for up to ``timeout`` seconds; the few busy cases the
  handler does not cover are retried with a short backoff until the same
  deadline. Then :class:`~checkpointers.errors.BackendUnavailableError` is
  raised, the ``sqlite3`` error chained.
* Connections: reads borrow one from a small pool (a connection is used by
  one thread at a time), writes use the one writer connection. Async calls
  run, one at a time, on one worker thread per backend, started on first use;
  it serves every event loop (each may run in its own thread) and hands each
  result to the loop that awaits it. ``close()`` / ``aclose()`` release the
  connections and stop the worker.

Disk space
----------

Deleting gives the space back, at a cost bounded by the delete's own:

* A new file is created ``auto_vacuum=INCREMENTAL``: SQLite keeps the map
  of page owners that lets it move pages, but never moves them on its own.
  A :meth:`~SqliteBackend.drop` or a batch with deletes that leaves at least
  ``_RECLAIM_MIN`` (256) pages free switches the file to ``FULL`` for its own
  commit, at which SQLite moves the pages at the end of the file into the
  free ones and cuts the end off (linear in the pages moved), then switches
  it back (:func:`_reclaim`, :func:`_after_deletes`). Puts and upserts do no
  vacuum work; the pages an upsert frees are reused by the next writes.
* After such a delete, a ``TRUNCATE`` checkpoint that never waits
  (:func:`_checkpoint_now`) empties the WAL, which carried the deleted pages
  (zeroed: this SQLite build has ``secure_delete`` on). While another
  connection reads an older snapshot the WAL cannot be emptied yet; it is
  cut back to ``journal_size_limit`` (8 MiB) when the next writer starts it
  over, as after any large transaction.
* Files created before this release (``auto_vacuum=NONE``) are left in that
  mode: switching needs ``VACUUM``, which rewrites the whole file under the
  write lock (and needs as much free disk again), so it is not done behind
  the back of other processes. Their free pages are reused by later writes
  (the file does not grow back) and their WAL is emptied the same way; to
  make one shrink, run ``PRAGMA auto_vacuum=INCREMENTAL; VACUUM;`` on it
  with ``sqlite3`` while nothing else uses it.

Measured with ``python -m benchmarks.sqlite_disk`` (100 records of 1 MB in one
partition, then deleted): after ``drop()`` or one batch of deletes, file 105 MB
+ WAL 105.6 MB with 25,634 free pages before this, now 0.05 MB + 0 with none
free; ``SqliteCheckpointer.prune`` of 100 checkpoints with a 1 MB channel
(keeping the latest), 105 + 105 MB before, 1.1 MB + 0 now. The deletes take
as long as before (within this machine's noise: 0.7-2.2 s against 1.0-1.8 s).

Schema (version = position in :data:`MIGRATIONS`)
-------------------------------------------------

``records(pid, name, seq, etag, digest, tags, value)``
    one row per record, primary key ``(pid, name)`` where ``pid`` is the
    partition's integer id (its ``partitions`` row); ``value`` is the last
    column so reading metadata never touches a large value's overflow pages.
    Index ``(pid, seq)``.
``tags(pid, k, v, name, seq)``
    one row per tag, written in the same transaction as ``records`` and
    rewritten with it (so ``seq`` is always the record's), keyed
    ``(pid, k, v, name)`` (``WITHOUT ROWID``) and indexed on
    ``(pid, k, v, seq)``: a tag query walks the b-tree of its order and,
    with a limit, stops after that many matches. A rewrite or delete removes
    a record's tag rows by their keys, from the tags its own row carries.

Etags and digests of the shapes this library writes (32 hex digits;
``<sha256>`` or ``<sha256>.u<seal>``) are stored as the bytes of their hex
(:func:`_pack_etag`, :func:`_pack_digest`), any other as text; with the
smaller tag rows this fits a 3 x 1 KB checkpoint and its writes' record in
one 4 KiB page, where v4 rows needed two pages.
``partitions(pkey, id, user_key, name, expires_at)``
    keyed by :attr:`Partition.key` (``WITHOUT ROWID``): the id the
    partition's rows carry, the raw partition name (``Partition.key`` hashes
    long names, so they cannot be decoded back) and the expiry (index on
    ``expires_at``), for every non-empty partition; a row is removed when
    its partition's last record goes. Every read looks its partition up
    here once per statement (:data:`_LIVE_PID`): the id, if not expired. A
    user's partitions are the range of keys starting with its ``user_key``.
    Ids come from ``seq_counter.pids`` and are never handed out twice
    (:func:`_new_partition`). Before v6 every row of ``records``, ``tags``
    and their indexes carried the text key (about 20 bytes for a short
    thread id, up to 160 hashed): v6 took 164 bytes off every put of a
    3 x 1 KB checkpoint with its writes (4,997 to 4,833 bytes at rest over
    200 puts of ``benchmarks.shape.ShapeThread``, file + WAL). Opening a v5
    file copies its tables once into the v6 ones, in the setup transaction
    (the file needs that much free disk again; the old pages stay free for
    later writes).
``seq_counter``, ``schema_migrations``
    the highest seq ever deleted and the last partition id handed out, and
    the applied schema versions.

Caller-supplied strings that may hold anything Python allows (tag keys and
values, raw partition names, lone surrogates included) are stored in an
injective ASCII/bytes form, because ``sqlite3`` refuses to bind lone
surrogates.

Errors
------

:func:`translate_errors` is the single place where ``sqlite3`` exceptions
become library errors:

===========================================  ===================================
``OperationalError`` (locked, busy, disk I/O,  :class:`BackendUnavailableError`
full, read-only, cannot open), ``DatabaseError``
(not a database, malformed), ``InternalError``,
any other ``sqlite3.Error``
``ProgrammingError``, ``InterfaceError``,      :class:`CheckpointerError`
``IntegrityError``, ``DataError``,             (root class, *not* "unavailable":
``NotSupportedError``, ``sqlite3.Warning``     these mean a bug in this module or
                                               a SQLite limit; retrying will not
                                               help, so they are not disguised
                                               as an outage)
===========================================  ===================================

Damaged rows (a file edited by hand, a bad disk, a forged row) are
:class:`~checkpointers.errors.CorruptItemError` naming the record, on every
read (``get``, every ``list`` including ``values=False`` and children
listings, ``partitions``), never a driver or ``json`` error and never a field
of the wrong type: :func:`_record` checks each column's type (``seq`` an
integer, ``tags`` a JSON object of strings, ...), a tag query checks that
what the tag index found carries those tags in its own row, and
``partitions`` checks each stored name against its partition key. A listing
with ``values=False`` does not read values, so a damaged value is found when
it is read. A write does not trip over a damaged row: an upsert or an
unconditional delete replaces or removes it; a condition on a damaged etag or
digest fails, and a write that would return the stored record (an append
no-op, a conflict) raises ``CorruptItemError``; a seq damaged to a
non-integer is never counted up from nor copied into ``seq_counter``.
"""

from __future__ import annotations

import builtins
import functools
import json
import math
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from json.encoder import encode_basestring_ascii as _json_str
from pathlib import Path
from typing import Any, Literal, TypeVar
from urllib.parse import unquote, urlsplit

from .._names import Partition, encode_component
from ..errors import BackendUnavailableError, CheckpointerError, CorruptItemError
from . import query_options, retention_options
from .base import (
    Backend,
    Conflict,
    Delete,
    ExpiredPartition,
    ListQuery,
    Mode,
    Offload,
    Put,
    Record,
    Retention,
    WriteResult,
    check_batch,
    evaluate,
    read_partitions,
    tags_json,
    unchanged_reput,
    users_of,
)
from .ops import GetOp, ListOp

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "SqliteBackend", "translate_errors"]

T = TypeVar("T")

#: Schema migrations. To change the schema, APPEND a new string to this list;
#: its position is its version number. Never edit or remove an entry (turn a
#: dead one into ``"SELECT 1"``), or files created by older releases would skip
#: or repeat steps. Statements are separated by ``;`` (no ``;`` inside
#: literals). Each migration runs inside the setup transaction.
MIGRATIONS: list[str] = [
    # v0: the version table itself.
    """
    CREATE TABLE IF NOT EXISTS schema_migrations (v INTEGER PRIMARY KEY)
    """,
    # v1: records, their tags, partition names, the sequence counter.
    """
    CREATE TABLE records (
        pkey   TEXT    NOT NULL,
        name   TEXT    NOT NULL,
        seq    INTEGER NOT NULL,
        etag   TEXT    NOT NULL,
        digest TEXT    NOT NULL,
        tags   TEXT    NOT NULL,
        value  BLOB    NOT NULL,
        PRIMARY KEY (pkey, name)
    );
    CREATE INDEX records_seq ON records (pkey, seq);
    CREATE TABLE tags (
        pkey TEXT NOT NULL,
        name TEXT NOT NULL,
        k    TEXT NOT NULL,
        v    TEXT NOT NULL,
        PRIMARY KEY (pkey, name, k)
    ) WITHOUT ROWID;
    CREATE INDEX tags_kv ON tags (pkey, k, v, name);
    CREATE TABLE partitions (
        pkey     TEXT NOT NULL PRIMARY KEY,
        user_key TEXT NOT NULL,
        name     BLOB NOT NULL
    ) WITHOUT ROWID;
    CREATE INDEX partitions_user ON partitions (user_key);
    CREATE TABLE seq_counter (
        id  INTEGER PRIMARY KEY CHECK (id = 0),
        seq INTEGER NOT NULL
    );
    INSERT INTO seq_counter (id, seq) VALUES (0, 0)
    """,
    # v2: each tag row carries its record's seq, indexed, so "the newest N
    # with tag X" walks an index and stops after N (backfilled from records).
    """
    ALTER TABLE tags ADD COLUMN seq INTEGER NOT NULL DEFAULT 0;
    UPDATE tags SET seq = (
        SELECT r.seq FROM records AS r WHERE r.pkey = tags.pkey AND r.name = tags.name
    );
    CREATE INDEX tags_seq ON tags (pkey, k, v, seq)
    """,
    # v3: no schema change. Seqs are now handed out per partition, above both
    # the partition's highest seq and ``seq_counter``, which only deletes
    # raise (to the highest seq they remove); releases before v3 bumped the
    # counter on every write and would hand out seqs below the partition's,
    # so the version number keeps them off files written by this one.
    """
    SELECT 1
    """,
    # v4: retention. A partition's expiry (seconds since the epoch, NULL: never),
    # set by every write of a backend with a ttl; an index for the sweep.
    """
    ALTER TABLE partitions ADD COLUMN expires_at REAL;
    CREATE INDEX partitions_expiry ON partitions (expires_at) WHERE expires_at IS NOT NULL
    """,
    # v5: smaller rows. Etags and digests of the usual shapes are stored as
    # bytes (half their hex; rows written before stay text, both are read).
    # The tag rows are keyed (pkey, k, v, name): the name-order index is the
    # table itself, so a tag row is in two b-trees, not three; a write
    # replaces a record's tag rows by their keys (the stored tags say which).
    """
    CREATE TABLE tags_v5 (
        pkey TEXT    NOT NULL,
        k    TEXT    NOT NULL,
        v    TEXT    NOT NULL,
        name TEXT    NOT NULL,
        seq  INTEGER NOT NULL,
        PRIMARY KEY (pkey, k, v, name)
    ) WITHOUT ROWID;
    INSERT INTO tags_v5 (pkey, k, v, name, seq) SELECT pkey, k, v, name, seq FROM tags;
    DROP TABLE tags;
    ALTER TABLE tags_v5 RENAME TO tags;
    CREATE INDEX tags_seq ON tags (pkey, k, v, seq)
    """,
    # v6: an integer partition id. ``records`` and ``tags`` rows (and their
    # indexes) carry the partition's ``id`` instead of its text key, which
    # was repeated in every row of four b-trees. Ids come from
    # ``seq_counter.pids`` (never reused); the partition of a record without
    # a ``partitions`` row (none this library writes) gets a row that names
    # no user, so its records read as before. ``partitions`` loses its
    # ``user_key`` index: a user's partitions are a range of ``pkey``.
    """
    ALTER TABLE seq_counter ADD COLUMN pids INTEGER NOT NULL DEFAULT 0;
    CREATE TABLE pid_map (id INTEGER PRIMARY KEY, pkey TEXT NOT NULL UNIQUE);
    INSERT INTO pid_map (pkey) SELECT pkey FROM partitions UNION SELECT pkey FROM records;
    CREATE TABLE partitions_v6 (
        pkey       TEXT    NOT NULL PRIMARY KEY,
        id         INTEGER NOT NULL,
        user_key   TEXT    NOT NULL,
        name       BLOB    NOT NULL,
        expires_at REAL
    ) WITHOUT ROWID;
    INSERT INTO partitions_v6 (pkey, id, user_key, name, expires_at)
        SELECT m.pkey, m.id, p.user_key, p.name, p.expires_at FROM pid_map AS m JOIN partitions AS p ON p.pkey = m.pkey;
    INSERT INTO partitions_v6 (pkey, id, user_key, name, expires_at)
        SELECT m.pkey, m.id, '', x'', NULL FROM pid_map AS m WHERE m.pkey NOT IN (SELECT pkey FROM partitions);
    UPDATE seq_counter SET pids = (SELECT IFNULL(MAX(id), 0) FROM pid_map) WHERE id = 0;
    CREATE TABLE records_v6 (
        pid    INTEGER NOT NULL,
        name   TEXT    NOT NULL,
        seq    INTEGER NOT NULL,
        etag   TEXT    NOT NULL,
        digest TEXT    NOT NULL,
        tags   TEXT    NOT NULL,
        value  BLOB    NOT NULL,
        PRIMARY KEY (pid, name)
    );
    INSERT INTO records_v6 (pid, name, seq, etag, digest, tags, value)
        SELECT m.id, r.name, r.seq, r.etag, r.digest, r.tags, r.value
        FROM records AS r JOIN pid_map AS m ON m.pkey = r.pkey ORDER BY r.rowid;
    CREATE TABLE tags_v6 (
        pid  INTEGER NOT NULL,
        k    TEXT    NOT NULL,
        v    TEXT    NOT NULL,
        name TEXT    NOT NULL,
        seq  INTEGER NOT NULL,
        PRIMARY KEY (pid, k, v, name)
    ) WITHOUT ROWID;
    INSERT INTO tags_v6 (pid, k, v, name, seq)
        SELECT m.id, t.k, t.v, t.name, t.seq FROM tags AS t JOIN pid_map AS m ON m.pkey = t.pkey;
    DROP TABLE records;
    DROP TABLE tags;
    DROP TABLE partitions;
    DROP TABLE pid_map;
    ALTER TABLE records_v6 RENAME TO records;
    ALTER TABLE tags_v6 RENAME TO tags;
    ALTER TABLE partitions_v6 RENAME TO partitions;
    CREATE INDEX records_seq ON records (pid, seq);
    CREATE INDEX tags_seq ON tags (pid, k, v, seq);
    CREATE INDEX partitions_expiry ON partitions (expires_at) WHERE expires_at IS NOT NULL
    """,
]

#: The schema version this module writes.
SCHEMA_VERSION = len(MIGRATIONS) - 1

_SYNCHRONOUS = ("NORMAL", "FULL", "EXTRA")
_CHUNK = 400  # names per IN (...) list; old SQLite builds allow 999 variables
_COLUMNS = "r.name, r.seq, r.etag, r.digest, r.tags, r.value"
_META_COLUMNS = "r.name, r.seq, r.etag, r.digest, r.tags, x'' AS value"
#: The id of the partition whose key is parameter ``n``, if it has not expired
#: (else NULL, which no row's ``pid`` equals): every read statement selects its
#: rows by it, so one lookup gives both the id and the expiry check. Not
#: correlated, so SQLite evaluates it once per statement; ``cp_now()`` is the
#: backend's clock, registered on each connection. ``?1`` reuses the first
#: parameter; later plain ``?`` keep counting from the highest so far.
_LIVE_PID = (
    "(SELECT e.id FROM partitions AS e WHERE e.pkey = ?{n} AND (e.expires_at IS NULL OR e.expires_at > cp_now()))"
)
_LIVE_PID1 = _LIVE_PID.format(n=1)
#: The id of the partition whose key is the next parameter, expired or not (the write path's).
_PID = "(SELECT e.id FROM partitions AS e WHERE e.pkey = ?)"

# -- error translation -------------------------------------------------------

#: Driver errors that mean "our bug or a hard SQLite limit", never an outage.
_NOT_RETRYABLE: tuple[type[Exception], ...] = (
    sqlite3.ProgrammingError,
    sqlite3.InterfaceError,
    sqlite3.IntegrityError,
    sqlite3.DataError,
    sqlite3.NotSupportedError,
    sqlite3.Warning,
)
#: Every exception the driver raises (``sqlite3.Warning`` is not an ``sqlite3.Error``).
_DRIVER_ERRORS: tuple[type[Exception], ...] = (sqlite3.Error, sqlite3.Warning)
_SQLITE_BUSY, _SQLITE_LOCKED = 5, 6


class translate_errors:  # noqa: N801 - used as a function: ``with translate_errors(path):``
    """Turn ``sqlite3`` exceptions raised inside the block into library errors.

    Outages (locked, busy, I/O, full disk, not a database, ...) become
    :class:`BackendUnavailableError`; driver errors that signal a bug or a
    SQLite limit become a plain :class:`CheckpointerError`, so nobody retries
    them as if the disk were away. The driver's exception is chained as
    ``__cause__``. Busy retries happen before this, in :func:`_retrying`.
    (A class, not a ``@contextmanager`` generator: it wraps every call, and
    a generator costs a few microseconds of GIL-holding CPU per use.)

    >>> try:
    ...     with translate_errors("x.db"):
    ...         raise sqlite3.OperationalError("database is locked")
    ... except BackendUnavailableError as exc:
    ...     print(type(exc.__cause__).__name__, "->", type(exc).__name__)
    OperationalError -> BackendUnavailableError
    """

    __slots__ = ("path",)

    def __init__(self, path: str | os.PathLike[str] = "") -> None:
        self.path = path

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> Literal[False]:
        if exc is None or not isinstance(exc, _DRIVER_ERRORS):
            return False
        path = str(self.path)
        if isinstance(exc, _NOT_RETRYABLE):
            raise CheckpointerError(
                f"SQLite database {path!r}: the driver refused the operation "
                f"({type(exc).__name__}: {exc}). This is not an outage and retrying will not "
                f"help: it is a bug in checkpointers (please report it) or a SQLite limit."
            ) from exc
        if _is_busy(exc):
            hint = (
                "another connection held the write lock longer than the timeout; "
                "raise timeout= or look for a long-running transaction on this file"
            )
        else:
            hint = "check that the file is a SQLite database, its directory is writable and the disk has room"
        raise BackendUnavailableError(
            f"SQLite database {path!r} is unavailable ({type(exc).__name__}: {exc}); {hint}"
        ) from exc


def _is_busy(exc: BaseException) -> bool:
    """Whether ``exc`` is SQLITE_BUSY / SQLITE_LOCKED (worth waiting for)."""
    if not isinstance(exc, sqlite3.OperationalError):
        return False
    code = getattr(exc, "sqlite_errorcode", None)  # Python >= 3.11
    if code is not None:
        return code & 0xFF in (_SQLITE_BUSY, _SQLITE_LOCKED)
    text = str(exc).lower()
    return "locked" in text or "busy" in text


def _retrying(timeout: float, fn: Callable[..., T], *args: Any) -> T:
    """Call ``fn(*args)``, retrying busy/locked errors until ``timeout`` has passed.

    SQLite's busy handler already waits up to ``timeout`` for most lock
    conflicts; this covers the ones it does not (WAL recovery, a concurrent
    ``journal_mode`` change) with a bounded, growing backoff. Runs on whatever
    thread executes the SQL (the worker thread for async calls), so
    sleeping never blocks an event loop.
    """
    deadline = time.monotonic() + timeout
    delay = 0.005
    while True:
        try:
            return fn(*args)
        except sqlite3.OperationalError as exc:
            if not _is_busy(exc) or time.monotonic() + delay > deadline:
                raise
        time.sleep(delay)
        delay = min(delay * 2, 0.25)


# -- encodings of caller strings -----------------------------------------------


def _text(value: str) -> str:
    """Injective ASCII form of any Python string (used for tag keys and values): its JSON."""
    return _json_str(value)  # == json.dumps(value)


def _blob(value: str) -> bytes:
    """Lossless bytes of any Python string, lone surrogates included."""
    return value.encode("utf-8", "surrogatepass")


def _unblob(value: bytes) -> str:
    return bytes(value).decode("utf-8", "surrogatepass")


def _record(row: Sequence[Any]) -> Record:
    """The :class:`Record` of a ``records`` row; a damaged row raises :class:`CorruptItemError`.

    The hot path of every read: the columns' types are checked with ``type(x)
    is T`` (no conversion), and the tags column is parsed only when it is not
    ``"{}"`` (blobs and writes, most records). A packed etag or digest (a
    blob, :func:`_pack_etag`) is unpacked; a blob of another length is
    damage. Only a failing row pays for finding out what is wrong with it
    (:func:`_damaged`). Never returns another type than the schema's in a
    field, and never converts one (``bytes(5)`` would be five zero bytes).
    """
    name, seq, etag, digest, tags, value = row
    if tags == "{}":
        parsed: Any = {}
    else:
        parsed = _parse_tags(tags) if type(tags) is str else None
        if type(parsed) is not dict or not all(type(v) is str for v in parsed.values()):
            raise _damaged(row)
    if type(etag) is bytes and len(etag) == _ETAG_BYTES:
        etag = etag.hex()
    if type(digest) is bytes:
        digest = _unpack_digest(digest)
    if (
        type(seq) is int and type(name) is str and type(etag) is str and type(digest) is str
        and type(value) is bytes
    ):
        return Record(name, value, parsed, etag, digest, seq)
    raise _damaged(row)


#: The etags :func:`~checkpointers._flows.new_etag` makes: 32 lowercase hex digits, stored as 16 bytes.
_ETAG_BYTES = 16
#: The sealed digests of :class:`~checkpointers._integrity.Integrity` without a key:
#: ``<sha256 hex>.u<128-bit hex>`` (98 characters), stored as 48 bytes; a bare
#: ``<sha256 hex>`` (64) as 32.
_SEAL_MARK = ".u"


def _pack_etag(etag: str) -> str | bytes:
    """The stored form of an etag: 16 bytes for 32 lowercase hex digits, else the text itself.

    Injective: only a string that :func:`_record` turns back into itself is
    packed (``bytes.fromhex`` also takes upper case and spaces), and a text
    cell is never unpacked. Halves the etag's bytes in every row.
    """
    if len(etag) == 2 * _ETAG_BYTES:
        try:
            packed = bytes.fromhex(etag)
        except ValueError:
            return etag
        if packed.hex() == etag:
            return packed
    return etag


def _pack_digest(digest: str) -> str | bytes:
    """The stored form of a digest: the bytes of its hex parts when :func:`_unpack_digest` gives it back."""
    if len(digest) == 64 or (len(digest) == 98 and digest[64:66] == _SEAL_MARK):
        try:
            packed = bytes.fromhex(digest[:64]) + bytes.fromhex(digest[66:])
        except ValueError:
            return digest
        if _unpack_digest(packed) == digest:
            return packed
    return digest


def _unpack_digest(packed: bytes) -> str | None:
    """A packed digest's text (``None``: a blob :func:`_pack_digest` never writes, i.e. damage)."""
    if len(packed) == 48:
        return f"{packed[:32].hex()}{_SEAL_MARK}{packed[32:].hex()}"
    return packed.hex() if len(packed) == 32 else None


def _unpacked(row: Sequence[Any]) -> list[Any]:
    """``row`` with a validly packed etag and digest as text (what :func:`_record` checks next)."""
    cells = list(row)
    if type(cells[2]) is bytes and len(cells[2]) == _ETAG_BYTES:
        cells[2] = cells[2].hex()
    if type(cells[3]) is bytes:
        cells[3] = _unpack_digest(cells[3]) or cells[3]  # a blob of another length stays one: damage
    return cells


#: The C scanner ``json.loads`` calls after its own checks and whitespace skipping
#: (an attribute of every ``JSONDecoder`` that typeshed does not declare).
_scan_json: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def _parse_tags(text: str) -> Any:
    """``json.loads(text)``, or ``None`` where it raises ``ValueError``.

    The canonical text :func:`~.base.tags_json` writes (no whitespace around
    it) is parsed by the scanner alone, at a third of ``json.loads``'s cost;
    anything else (a damaged cell) goes through ``json.loads`` itself.
    """
    try:
        parsed, end = _scan_json(text, 0)
        if end == len(text):
            return parsed
    except (StopIteration, ValueError):  # nothing at 0; JSONDecodeError (UnicodeDecodeError is one too)
        pass
    try:
        return json.loads(text)
    except ValueError:
        return None


#: What each column of a ``records`` row must hold (``_COLUMNS`` order) and how it is said.
_SHAPES: tuple[tuple[str, type, str], ...] = (
    ("name", str, "text"),
    ("seq", int, "an integer"),
    ("etag", str, "text"),
    ("digest", str, "text"),
    ("tags", str, "a JSON object of strings"),
    ("value", bytes, "a blob"),
)


def _damaged(row: Sequence[Any]) -> CorruptItemError:
    """The error for a ``records`` row that :func:`_record` refused, naming the record and the column."""
    row = _unpacked(row)
    name = row[0]
    key = name if type(name) is str else repr(name)
    wrong = [
        f"{column} is {_shown(cell)}, not {what}"
        for (column, kind, what), cell in zip(_SHAPES, row, strict=False)
        if type(cell) is not kind or (column == "tags" and not (isinstance(cell, str) and _tags_ok(cell)))
    ]
    return CorruptItemError(key, "the SQLite row is damaged: " + "; ".join(wrong or ["it does not decode"]))


def _tags_ok(text: str) -> bool:
    try:
        parsed = json.loads(text)
    except ValueError:
        return False
    return type(parsed) is dict and all(type(v) is str for v in parsed.values())


def _shown(cell: Any) -> str:
    """A damaged cell, for a message: its SQL type and the start of its value."""
    kind = {type(None): "NULL", int: "an integer", float: "a real", str: "text", bytes: "a blob"}.get(
        type(cell), type(cell).__name__
    )
    if cell is None:
        return kind
    shown = repr(cell)
    return f"{kind} {shown[:40] + '...' if len(shown) > 40 else shown}"


#: Stand-ins for damaged fields in what a write reads (:func:`_stored`): no
#: caller's etag or digest equals them, so a condition on a damaged record
#: fails (and its conflict read raises ``CorruptItemError``), while an upsert
#: or a delete without condition replaces or removes it.
_NO_ETAG = "\x00damaged"
_NO_DIGEST = "\x00damaged"
#: The tags of a damaged row in what a write reads: unknown, so its tag rows
#: are found by name (a scan of the partition's tag rows) to be replaced.
_DAMAGED_TAGS: Mapping[str, str] = {}


def _stored(row: Sequence[Any]) -> Record:
    """:func:`_record` for the write path: a damaged row is returned with stand-ins, never raised.

    A write only needs the etag (``if_match``), the digest (appends) and the
    seq (deletes raise ``seq_counter`` to it) of what it touches, and its tags
    (their rows are replaced by key). A damaged field gets a stand-in that no
    condition matches and that never raises ``seq_counter``, a damaged row
    the tags :data:`_DAMAGED_TAGS`; the value is never read from here.
    """
    try:
        return _record(row)
    except CorruptItemError:
        name, seq, etag, digest = _unpacked(row)[:4]
        return Record(
            name,
            b"",
            _DAMAGED_TAGS,
            etag if type(etag) is str else _NO_ETAG,
            _NO_DIGEST if type(digest) is not str else digest,
            seq if type(seq) is int else 0,
        )


def _prefix_upper_bound(prefix: str) -> str | None:
    """The smallest string greater than every string starting with ``prefix``.

    ``name >= prefix AND name < bound`` selects the prefix literally and uses
    the primary key; ``LIKE`` would treat ``%`` and ``_`` (both legal in
    names) as wildcards. ``None`` when no bound exists (all chars maximal).
    """
    stripped = prefix.rstrip(chr(0x10FFFF))
    if not stripped:
        return None
    last = ord(stripped[-1]) + 1
    if 0xD800 <= last <= 0xDFFF:  # skip the surrogate block, as UTF-8 order does
        last = 0xE000
    return stripped[:-1] + chr(last)


def _chunks(items: Sequence[T]) -> Iterator[Sequence[T]]:
    for i in range(0, len(items), _CHUNK):
        yield items[i : i + _CHUNK]


# -- the operations, written once as functions of a sqlite3 connection ---------


class _transaction:  # noqa: N801 - used as a function: ``with _transaction(conn, immediate):``
    """One explicit transaction: COMMIT on success, ROLLBACK on any exception.

    The block may end the transaction itself (a refused batch rolls back).
    A class rather than a ``@contextmanager`` generator: every write runs
    one, and the generator machinery costs CPU that competes for the GIL.
    """

    __slots__ = ("conn", "begin")

    def __init__(self, conn: sqlite3.Connection, immediate: bool) -> None:
        self.conn = conn
        self.begin = "BEGIN IMMEDIATE" if immediate else "BEGIN"

    def __enter__(self) -> None:
        self.conn.execute(self.begin)

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> Literal[False]:
        conn = self.conn
        if exc is None:
            if conn.in_transaction:
                try:
                    conn.execute("COMMIT")
                except BaseException:
                    _rollback(conn)
                    raise
            return False
        _rollback(conn)
        return False


def _rollback(conn: sqlite3.Connection) -> None:
    if conn.in_transaction:
        try:
            conn.execute("ROLLBACK")
        except sqlite3.Error:
            pass  # the original error is the one worth reporting


def _schema_version(conn: sqlite3.Connection) -> int:
    """Highest applied migration, or -1 for a fresh file."""
    found = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_migrations'"
    ).fetchone()
    if found is None:
        return -1
    (version,) = conn.execute("SELECT MAX(v) FROM schema_migrations").fetchone()
    return -1 if version is None else int(version)


def _statements(sql: str) -> list[str]:
    return [s.strip() for s in sql.split(";") if s.strip()]


def _setup(conn: sqlite3.Connection) -> None:
    """Switch the file to WAL and apply the missing migrations (idempotent).

    The check-and-migrate runs under ``BEGIN IMMEDIATE``, so two processes
    opening a fresh file at once migrate it exactly once. A new (empty) file
    is made ``auto_vacuum=INCREMENTAL`` first: SQLite fixes the mode when it
    writes the file's first page (``journal_mode=WAL`` does), and changes it
    later only by rewriting the whole file (``VACUUM``), which this module never
    does on its own (see "Disk space" in the module docstring).
    """
    (pages,) = conn.execute("PRAGMA page_count").fetchone()
    if pages == 0:  # nothing written yet (two processes racing here both set the same)
        conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
    (mode,) = conn.execute("PRAGMA journal_mode=WAL").fetchone()
    if str(mode).lower() != "wal":
        raise CheckpointerError(
            f"SQLite refused WAL mode (journal_mode is {mode!r}); several processes could "
            f"not share this file safely. Put the database on a local filesystem."
        )
    if _schema_version(conn) == SCHEMA_VERSION:
        return
    with _transaction(conn, immediate=True):
        conn.execute(MIGRATIONS[0])
        version = _schema_version(conn)
        if version > SCHEMA_VERSION:
            raise CheckpointerError(
                f"the database has schema version {version}, newer than this release "
                f"understands ({SCHEMA_VERSION}); upgrade checkpointers to open it"
            )
        for v in range(version + 1, len(MIGRATIONS)):
            for statement in _statements(MIGRATIONS[v]):
                conn.execute(statement)
            conn.execute("INSERT INTO schema_migrations (v) VALUES (?)", (v,))


def _fetch(
    conn: sqlite3.Connection,
    pkey: str,
    names: Sequence[str],
    values: bool,
    decode: Callable[[Sequence[Any]], Record] = _record,
) -> dict[str, Record]:
    """The stored records among ``names`` (values replaced by ``b""`` unless asked)."""
    found: dict[str, Record] = {}
    for chunk in _chunks(names):
        for row in conn.execute(_fetch_sql(len(chunk), values), (pkey, *chunk)):
            found[row[0]] = decode(row)
    return found


@functools.lru_cache(maxsize=128)
def _fetch_sql(count: int, values: bool) -> str:
    """The statement of :func:`_fetch` for ``count`` names (built once per count: one prepared statement)."""
    cols = _COLUMNS if values else _META_COLUMNS
    return f"SELECT {cols} FROM records AS r WHERE r.pid = {_LIVE_PID1} AND r.name IN ({','.join('?' * count)})"


def _get(conn: sqlite3.Connection, pkey: str, names: Sequence[str]) -> list[Record | None]:
    if not names:
        return []
    if len(names) <= _CHUNK:
        found = _fetch(conn, pkey, names, values=True)
    else:  # several statements: read one snapshot
        with _transaction(conn, immediate=False):
            found = _fetch(conn, pkey, names, values=True)
    return [found.get(n) for n in names]


@functools.lru_cache(maxsize=64)
def _prelude_sql(count: int) -> str:
    """The statement of :func:`_prelude` for ``count`` names (built once per count)."""
    marks = ",".join("?" * count)
    return (
        f"SELECT {_META_COLUMNS} FROM records AS r WHERE r.pid = {_PID} AND r.name IN ({marks}) "
        f"UNION ALL SELECT NULL, MAX(IFNULL((SELECT MAX(seq) FROM records WHERE pid = {_PID}), 0), "
        "(SELECT seq FROM seq_counter WHERE id = 0)), "
        "(SELECT CASE WHEN expires_at IS NULL THEN 1 WHEN expires_at <= cp_now() THEN 3 ELSE 2 END "
        "FROM partitions WHERE pkey = ?), (SELECT id FROM partitions WHERE pkey = ?), NULL, NULL"
    )


def _prelude(
    conn: sqlite3.Connection, pkey: str, names: Sequence[str]
) -> tuple[dict[str, Record], int, int | None, int | None]:
    """What a write needs to know, read in one statement (for up to ``_CHUNK`` names).

    Returns the stored records among ``names`` (values ``b""``), the seq to
    count up from, the partition's state: ``None`` without a
    ``partitions`` row, else :data:`_NO_EXPIRY`, :data:`_LIVE_EXPIRY` or
    :data:`_EXPIRED`, and its id (``None`` without a row).
    Every seq the partition ever handed out is at most its highest present
    seq (the ``records_seq`` index's last entry) or, for deleted records, at
    most ``seq_counter``, which deletes raise to the highest seq they remove;
    so puts writing no counter row still get seqs above all earlier ones.
    """
    first, rest = names[:_CHUNK], names[_CHUNK:]
    found: dict[str, Record] = {}
    for row in conn.execute(_prelude_sql(len(first)), (pkey, *first, pkey, pkey, pkey)).fetchall():
        if row[0] is None:  # the summary row (no record has a NULL name)
            base, state, pid = row[1], row[2], row[3]
        else:
            found[row[0]] = _stored(row)
    if rest:
        found.update(_fetch(conn, pkey, rest, values=False, decode=_stored))
    if type(base) is not int or base > _MAX_SEQ:  # a damaged seq: MAX() of a column holding text is text
        base = _intact_base(conn, pid)
    return found, base, state, pid


#: Partition states :func:`_prelude` reads: a row without expiry, with a future one, expired.
_NO_EXPIRY, _LIVE_EXPIRY, _EXPIRED = 1, 2, 3


#: Seqs above this are damage, not counting (2**62 writes): never counted up from.
_MAX_SEQ = 1 << 62


def _intact_base(conn: sqlite3.Connection, pid: int | None) -> int:
    """:func:`_prelude`'s base counting only intact seqs (integers up to ``_MAX_SEQ``).

    Taken only when the fast query returned something else: a seq damaged to
    text, a blob or a real sorts above every integer in ``MAX()``. The
    damaged rows are then skipped, not counted up from (and not copied into
    ``seq_counter``); reading them raises ``CorruptItemError``.
    """
    intact = "typeof(seq) = 'integer' AND seq <= ?"
    (base,) = conn.execute(
        f"SELECT MAX(IFNULL((SELECT MAX(seq) FROM records WHERE pid = ? AND {intact}), 0), "
        f"IFNULL((SELECT seq FROM seq_counter WHERE id = 0 AND {intact}), 0))",
        (pid, _MAX_SEQ, _MAX_SEQ),
    ).fetchone()
    return int(base)


def _retire_seqs(conn: sqlite3.Connection, seq: int) -> None:
    """Records up to ``seq`` are being deleted: never hand their seqs out again."""
    conn.execute("UPDATE seq_counter SET seq = MAX(seq, ?) WHERE id = 0", (seq,))


_INSERT = "INSERT INTO records (pid, name, seq, etag, digest, tags, value) VALUES (?, ?, ?, ?, ?, ?, ?) "
_INSERT_OR_REPLACE = _INSERT + (
    "ON CONFLICT (pid, name) DO UPDATE SET seq = excluded.seq, etag = excluded.etag, "
    "digest = excluded.digest, tags = excluded.tags, value = excluded.value"
)
_INSERT_NEW = _INSERT + "ON CONFLICT (pid, name) DO NOTHING"
_INSERT_TAGS = "INSERT INTO tags (pid, name, k, v, seq) VALUES (?, ?, ?, ?, ?)"
#: Modes whose puts are written as given exactly when their name is absent.
_NEW_NAME_MODES = (Mode.APPEND, Mode.CREATE)
#: Modes a write may take without reading first (``IF_MATCH``: an unchanged re-put the memo knows).
_MEMO_MODES = (Mode.APPEND, Mode.CREATE, Mode.IF_MATCH)
#: Conditioned records (``CREATE`` / ``IF_MATCH``, e.g. a lease) a writer remembers per partition.
_MEMO_RECORDS = 8
_CONDITIONED = (Mode.CREATE, Mode.IF_MATCH)
#: Partitions whose next seq a writer connection remembers (a bound, not an LRU).
_MEMO_SIZE = 4096
#: ``PRAGMA auto_vacuum`` value of ``NONE`` (no page map: free pages cannot be given back).
_NO_VACUUM = 0
#: Free pages below which deletes leave them for later writes (4 KiB pages: 1 MiB).
_RECLAIM_MIN = 256
#: ``journal_size_limit``: the WAL is cut to this when it starts over (and to 0
#: after a large delete); twice what the automatic checkpoint lets it reach
#: (1,000 pages), so steady writing never cuts it.
_WAL_SIZE_LIMIT = 8 * 1024 * 1024


class _Connection(sqlite3.Connection):
    """A connection that remembers, per partition it wrote, the seq to count up from and the id.

    ``bases[pkey]`` is ``(base, pid)``: what :func:`_prelude` would return as
    ``base`` and ``pid`` for a partition that has its ``partitions`` row. It is set from this
    connection's own committed writes, and trusted only while ``PRAGMA
    data_version`` (read inside the write transaction) is the value this
    connection saw before: SQLite changes that value whenever *another*
    connection, of this process or any other, has committed since (a change
    for any other reason only empties the memo). So a write
    or drop by anyone else, a delete raising ``seq_counter`` included, empties
    the memo before it is used; this connection's own writes update it
    (:meth:`wrote`). Only the writer connection of a backend writes, so the
    memo stays warm while one process writes alone.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.version: int | None = None
        self.bases: dict[str, tuple[int, int]] = {}
        #: by partition: name -> (etag, digest, seq, tags) of conditioned records it wrote (no values: small)
        self.records: dict[str, dict[str, tuple[str, str, int, Mapping[str, str]]]] = {}
        self.vacuums: bool | None = None  #: ``auto_vacuum`` is not ``NONE`` (None: not asked yet)
        self.retention: list[Retention] = []  #: the owning backend's retention, boxed (see :func:`_ttl`)
        self.read_cache = _ReadCache()  #: what this connection read, while valid

    def known_base(self, pkey: str) -> tuple[int, int] | None:
        """The remembered ``(base, pid)`` of ``pkey`` if still current (call inside the write transaction)."""
        (version,) = self.execute("PRAGMA data_version").fetchone()
        if version != self.version:
            self.bases.clear()
            self.records.clear()
            self.version = version
            return None
        return self.bases.get(pkey)

    def known_record(self, pkey: str, name: str) -> tuple[str, str, int, Mapping[str, str]] | None:
        """``(etag, digest, seq, tags)`` of ``name`` as this connection wrote it last (if :meth:`known_base` holds)."""
        return self.records.get(pkey, {}).get(name)

    def wrote(
        self, pkey: str, base: tuple[int, int] | None, everywhere: bool,
        puts: Sequence[Put] = (), records: Sequence[Record] = (),
    ) -> None:
        """After a commit: ``pkey`` now counts up from ``base[0]``, its id is ``base[1]`` (``None``: unknown).

        ``everywhere``: the commit deleted records, which raises the shared
        ``seq_counter`` and may remove a ``partitions`` row, so nothing is kept.
        The records of the batch's ``CREATE`` / ``IF_MATCH`` puts (what the
        commit left: written or kept) are remembered for :meth:`known_record`.
        """
        if everywhere:
            self.bases.clear()
            self.records.clear()
        elif base is None:
            self.bases.pop(pkey, None)
            self.records.pop(pkey, None)
        else:
            if len(self.bases) >= _MEMO_SIZE and pkey not in self.bases:
                self.bases.clear()
                self.records.clear()
            self.bases[pkey] = base
            conditioned = [r for p, r in zip(puts, records, strict=True) if p.mode in _CONDITIONED]
            if conditioned:
                mine = self.records.setdefault(pkey, {})
                if len(mine) + len(conditioned) > _MEMO_RECORDS:
                    mine.clear()
                mine.update((r.name, (r.etag, r.digest, r.seq, dict(r.tags))) for r in conditioned)


def _free_pages(conn: sqlite3.Connection) -> int:
    (free,) = conn.execute("PRAGMA freelist_count").fetchone()
    return int(free)


def _reclaim(conn: sqlite3.Connection, free_before: int) -> tuple[int, bool]:
    """After deletes, inside their transaction: have the commit give free pages back.

    Returns how many pages the deletes freed and whether this commit
    vacuums (then :func:`_after_deletes` switches the file to ``INCREMENTAL``).
    In an ``auto_vacuum=INCREMENTAL`` file (or ``FULL``: one left so by a
    crash) with at least ``_RECLAIM_MIN`` free pages, the transaction
    switches the file to ``FULL``: at ``COMMIT``
    SQLite moves the pages at the end of the file into the free ones and
    cuts the end off, in time linear in the pages moved. (``PRAGMA
    incremental_vacuum`` does the same work one page at a time, but searches
    the free list for each page it takes out: quadratic, 3.0 s for the 25,400
    pages a prune of 100 MB freed, which made the prune 3x slower; at commit
    it is lost in the noise of the delete itself.) The free pages
    are the deletes' own plus what upserts left (later writes reuse those
    first), so the work is bounded by the deletes' own. Other files keep
    their free pages for later writes, which reuse them before growing the file.
    """
    free = _free_pages(conn)
    freed = free - free_before
    if free < _RECLAIM_MIN:
        return freed, False
    vacuums = getattr(conn, "vacuums", None)
    if vacuums is None:
        (mode,) = conn.execute("PRAGMA auto_vacuum").fetchone()
        vacuums = mode != _NO_VACUUM
    if vacuums:
        conn.execute("PRAGMA auto_vacuum=FULL")  # for this commit: see _after_deletes
    return freed, bool(vacuums)


def _after_deletes(conn: sqlite3.Connection, freed: int, vacuumed: bool) -> None:
    """After a commit that freed or vacuumed many pages: back to ``INCREMENTAL``, and empty the WAL.

    ``FULL`` was for that one commit (puts and upserts never vacuum: an upsert
    of a large value would move the new value's pages into the old one's);
    if switching back fails, or the process dies first, the file stays
    ``FULL``, which only makes such upserts slower, until the next large
    delete switches it back (a file made ``FULL`` by hand is switched too).
    Then a ``TRUNCATE`` checkpoint that never waits (:func:`_checkpoint_now`)
    empties the WAL, which carried the freed pages. Best effort: the deletes
    are committed, nothing here may fail the call.
    """
    if vacuumed:
        try:
            conn.execute("PRAGMA auto_vacuum=INCREMENTAL")  # a write transaction of its own
        except sqlite3.Error:
            _rollback(conn)
    if vacuumed or freed >= _RECLAIM_MIN:
        _checkpoint_now(conn)


def _checkpoint_now(conn: sqlite3.Connection) -> None:
    """Empty the WAL if nobody needs it, never waiting; best effort.

    After large deletes the WAL is as large as what was deleted: this SQLite
    build zeroes freed pages (``secure_delete``), through the WAL. A
    ``TRUNCATE`` checkpoint copies what is left into the file (the commit's
    automatic checkpoint usually did already) and cuts the WAL to zero
    bytes, with the busy handler off: while another connection reads an
    older snapshot or writes, it does what it can without blocking, and
    ``journal_size_limit`` cuts the WAL when the next writer starts it over.
    """
    try:
        (wait,) = conn.execute("PRAGMA busy_timeout").fetchone()
        try:
            conn.execute("PRAGMA busy_timeout=0")
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        finally:
            conn.execute(f"PRAGMA busy_timeout={int(wait)}")
    except sqlite3.Error:
        pass


def _rows(
    pid: int, puts: Sequence[Put], base: int, skipped: Collection[int] = ()
) -> tuple[dict[int, int], list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """Seqs (by put index), record rows and tag rows (of partition id ``pid``) of the puts not ``skipped``."""
    seqs: dict[int, int] = {}
    rows: list[tuple[Any, ...]] = []
    tag_rows: list[tuple[Any, ...]] = []
    seq = base
    for i, put in enumerate(puts):
        if i in skipped:
            continue
        seq += 1
        seqs[i] = seq
        name, tags = put.name, put.tags
        rows.append((pid, name, seq, _pack_etag(put.etag), _pack_digest(put.digest), tags_json(tags), put.value))
        tag_rows.extend((pid, name, _text(k), _text(v), seq) for k, v in tags.items())
    return seqs, rows, tag_rows


def _applied(puts: Sequence[Put], seqs: Mapping[int, int], kept: Mapping[str, Record]) -> list[Record]:
    """The records a batch leaves: the written puts with their seqs, the kept no-ops as stored."""
    return [
        Record(p.name, p.value, dict(p.tags), p.etag, p.digest, seqs[i]) if i in seqs else kept[p.name]
        for i, p in enumerate(puts)
    ]


def _write(
    conn: sqlite3.Connection, partition: Partition, puts: Sequence[Put], deletes: Sequence[Delete]
) -> WriteResult:
    if len(puts) + len(deletes) > 1:  # one operation cannot name a record twice
        check_batch(puts, deletes)
    elif not puts and not deletes:
        return WriteResult(records=[])
    memo = conn if isinstance(conn, _Connection) else None
    changes = conn.total_changes
    result: WriteResult | None = None
    after: tuple[int, int] | None = None
    # The fast path writes no partitions row, so it runs only for a backend without a ttl: its
    # memo is then set by its own checked writes, which left the partition without expiry.
    if memo is not None and _ttl(memo) is None and not deletes and all(p.mode in _MEMO_MODES for p in puts):
        with _transaction(conn, immediate=True):
            result, after = _write_new(memo, partition, puts)
    reclaimed: tuple[int, bool] | None = None
    if result is None:  # not only new names, or one of them exists: check everything
        with _transaction(conn, immediate=True):
            result, after, reclaimed = _write_checked(conn, partition, puts, deletes)
    if memo is not None and result.conflict is None:
        everywhere = bool(deletes) or reclaimed is not None
        memo.wrote(partition.key, after, everywhere, puts, result.records)
        if not everywhere:
            memo.read_cache.wrote(partition.key, changes, conn.total_changes)
    if reclaimed is not None:
        _after_deletes(conn, *reclaimed)
    return result


def _write_new(
    conn: _Connection, partition: Partition, puts: Sequence[Put]
) -> tuple[WriteResult | None, tuple[int, int] | None]:
    """Write puts that must find their names absent, without reading first when the memo allows.

    With the partition's base remembered (:meth:`_Connection.known_base`),
    the seqs need no query and the partition has its ``partitions`` row; the
    insert skips names that exist, and if it skipped any, the transaction is
    rolled back and ``(None, None)`` returned: the checked path then decides
    (an append no-op or a conflict), in a transaction of its own. An
    ``IF_MATCH`` put is taken here only as an unchanged re-put of a record the
    memo holds (:meth:`_Connection.known_record`: this connection wrote it
    and nobody has committed since), so its condition holds and it is kept.
    Without a remembered base or record, the checked path runs in this transaction.
    """
    pkey = partition.key
    known_base = conn.known_base(pkey)
    kept: dict[str, Record] = {}
    for put in puts:
        if known_base is not None and put.mode is Mode.IF_MATCH:
            known = conn.known_record(pkey, put.name)
            if known is None or not (put.etag == put.if_match == known[0] and put.digest == known[1] and (
                put.tags == known[3]
            )):
                known_base = None
            else:
                kept[put.name] = Record(put.name, put.value, dict(put.tags), put.etag, put.digest, known[2])
    if known_base is None:
        return _write_checked(conn, partition, puts, ())[:2]
    base, pid = known_base
    skipped = {i for i, put in enumerate(puts) if put.name in kept}
    seqs, rows, tag_rows = _rows(pid, puts, base, skipped)
    if rows and conn.executemany(_INSERT_NEW, rows).rowcount != len(rows):
        conn.execute("ROLLBACK")
        return None, None
    if tag_rows:
        conn.executemany(_INSERT_TAGS, tag_rows)
    return WriteResult(records=_applied(puts, seqs, kept)), (base + len(rows), pid)


def _write_checked(
    conn: sqlite3.Connection, partition: Partition, puts: Sequence[Put], deletes: Sequence[Delete]
) -> tuple[WriteResult, tuple[int, int] | None, tuple[int, bool] | None]:
    """Any batch: read what it touches, check the conditions, apply or roll back.

    Returns the result, the partition's base and id after it (``None`` when the
    partition has no ``partitions`` row afterwards, or the batch was refused)
    and, for a batch with deletes, what :func:`_reclaim` said (else ``None``).
    """
    pkey = partition.key
    names = [p.name for p in puts] + [d.name for d in deletes]
    existing, base, state, pid = _prelude(conn, pkey, names)
    purged = None
    if state == _EXPIRED:  # old data never comes back: gone in this transaction, first
        purged = _purge(conn, pkey)[1]
        existing, base, state, pid = _prelude(conn, pkey, names)
    has_partition = state is not None
    conflict, noops = evaluate(puts, deletes, existing)
    if conflict is not None:
        stored = None
        if conflict.existing is not None:
            stored = _fetch(conn, pkey, [conflict.name], values=True)[conflict.name]
        conn.execute("ROLLBACK")
        return WriteResult(records=[], conflict=Conflict(conflict.index, conflict.name, stored)), None, None

    # Append no-ops keep the stored record (and its seq), and so do unchanged
    # re-puts (their condition held, the stored record is the put); the rest are applied.
    kept = _fetch(conn, pkey, [puts[i].name for i in noops], values=True) if noops else {}
    for i, put in enumerate(puts):
        stored = existing.get(put.name)
        # the stored record itself under its own etag; an intact row (a damaged one is rewritten)
        # with the same tags (a digest without a seal does not bind them)
        if unchanged_reput(put, stored) and stored is not None and stored.tags is not _DAMAGED_TAGS and (
            put.tags == stored.tags
        ):
            kept[put.name] = Record(put.name, put.value, dict(put.tags), put.etag, put.digest, stored.seq)
            noops.append(i)
    skipped = set(noops)
    if pid is None:  # no partitions row (pid and state come from it): it gets one with its first record
        pid = _new_partition(conn, partition) if len(skipped) < len(puts) else None
        has_partition = pid is not None
    elif len(skipped) < len(puts) and (_ttl(conn) is not None or state == _LIVE_EXPIRY):
        # a new expiry, or none any more
        conn.execute("UPDATE partitions SET expires_at = cp_now() + ? WHERE pkey = ?", (_ttl(conn), pkey))
    seqs, rows, tag_rows = _rows(pid or 0, puts, base, skipped)
    if rows:
        conn.executemany(_INSERT_OR_REPLACE, rows)
    # Only records that existed can have tag rows to replace (a delete
    # removes them), so new names (blobs, checkpoints) skip the DELETE.
    retagged = [puts[i].name for i in seqs if puts[i].name in existing] + [d.name for d in deletes]
    if retagged:
        _untag(conn, pid, [existing[n] for n in retagged if n in existing])
    if tag_rows:
        conn.executemany(_INSERT_TAGS, tag_rows)
    reclaimed = None
    if deletes:
        gone = [existing[d.name].seq for d in deletes if d.name in existing]  # _stored: damaged seqs are 0
        if gone:
            _retire_seqs(conn, max(gone))
        free_before = _free_pages(conn)
        conn.executemany("DELETE FROM records WHERE pid = ? AND name = ?", [(pid, d.name) for d in deletes])
        if conn.execute("SELECT 1 FROM records WHERE pid = ? LIMIT 1", (pid,)).fetchone() is None:
            conn.execute("DELETE FROM partitions WHERE pkey = ?", (pkey,))
            has_partition = False
        reclaimed = _reclaim(conn, free_before)
    elif purged is not None:
        reclaimed = purged
    after = (base + len(rows), pid) if has_partition and pid is not None else None
    return WriteResult(records=_applied(puts, seqs, kept)), after, reclaimed


def _new_partition(conn: sqlite3.Connection, partition: Partition) -> int:
    """Give ``partition`` (without a ``partitions`` row) its row and a new id, inside the write transaction.

    Ids count up in ``seq_counter.pids`` and are never handed out twice, so
    no row of a partition that is gone can be read as one of a new
    partition. A counter damaged below an id in use (or to a non-integer) is
    refused rather than letting this partition's writes replace another's
    records: the one index seek that checks it is paid once per partition.
    """
    row = conn.execute(
        "UPDATE seq_counter SET pids = pids + 1 WHERE id = 0 AND typeof(pids) = 'integer' RETURNING pids"
    ).fetchone()
    pid = row[0] if row is not None else None
    if type(pid) is not int or conn.execute("SELECT 1 FROM records WHERE pid = ? LIMIT 1", (pid,)).fetchone():
        raise CorruptItemError(
            partition.name, f"the SQLite seq_counter row is damaged: its pids column ({_shown(pid)}) names an id in use"
        )
    conn.execute(
        "INSERT INTO partitions (pkey, id, user_key, name, expires_at) VALUES (?, ?, ?, ?, cp_now() + ?)",
        (partition.key, pid, partition.user_key, _blob(partition.name), _ttl(conn)),
    )
    return pid


def _untag(conn: sqlite3.Connection, pid: int | None, stored: Sequence[Record]) -> None:
    """Delete the tag rows of ``stored`` records (being rewritten or deleted), by their keys.

    A record's tag rows are the tags its own row carries, so a record without
    tags costs no statement. A damaged row (:data:`_DAMAGED_TAGS`) has its
    tag rows found by name: a scan of the partition's tag rows, as rare as
    the damage.
    """
    keyed = [
        (pid, _text(k), _text(v), r.name) for r in stored if r.tags is not _DAMAGED_TAGS for k, v in r.tags.items()
    ]
    if keyed:
        conn.executemany("DELETE FROM tags WHERE pid = ? AND k = ? AND v = ? AND name = ?", keyed)
    damaged = [(pid, r.name) for r in stored if r.tags is _DAMAGED_TAGS]
    if damaged:
        conn.executemany("DELETE FROM tags WHERE pid = ? AND name = ?", damaged)


def _ttl(conn: sqlite3.Connection) -> float | None:
    """The ttl of the backend that owns ``conn`` (``None``: its writes store no expiry)."""
    box = getattr(conn, "retention", None)
    return box[0].ttl if box else None


def _box_now(box: Sequence[Retention]) -> float:
    """``cp_now()`` in SQL: the clock of the backend's current retention."""
    return box[0].now()


#: The shape of a listing's range filters: whether it has a prefix, a prefix bound, a depth, a start, a stop.
_Ranges = tuple[bool, bool, bool, bool, bool]


def _list_sql(pkey: str, query: ListQuery) -> tuple[str, list[Any]]:
    """The one ``SELECT`` of :meth:`Backend.list`: every filter in SQL, in index order.

    Its text depends only on the query's shape (which filters it has, its
    order, a limit or not, how many tags, values, children), never on the
    values, and is built once per shape (:func:`_shaped_sql`), so ``sqlite3``'s
    statement cache reuses the prepared statement. Without tags, the rows are
    picked on an index and only the picked rows are read (no sort of values);
    with tags, see :func:`_tagged_sql`; with ``children``, the picks and their
    children are one statement (:func:`_with_children_sql`; in name order
    without tags or ``stop``, :func:`_list` scans instead: :func:`_scan_children`).
    """
    if query.order not in ("name", "seq"):
        raise ValueError(f"ListQuery.order must be 'name' or 'seq', got {query.order!r}")
    shape, range_params = _range_params(query)
    params: list[Any] = [pkey]
    for k, v in query.tags.items():
        params += [_text(k), _text(v)]
    params += range_params
    if query.limit is not None:
        params.append(query.limit)
    if query.children:
        params.append(pkey)
    limited = query.limit is not None
    sql = _shaped_sql(query.order, query.descending, limited, len(query.tags), shape, query.values, query.children)
    return sql, params


@functools.lru_cache(maxsize=256)
def _shaped_sql(
    order: str, descending: bool, limited: bool, tags: int, shape: _Ranges, values: bool, children: bool
) -> str:
    """The text of :func:`_list_sql`'s statement for one query shape."""
    cols = _COLUMNS if values else _META_COLUMNS
    direction = "DESC" if descending else "ASC"
    if tags:
        if children:
            picks = _tagged_sql("t.name AS name, t.{order} AS pos", order, direction, limited, tags, shape)
            return _with_children_sql(picks, cols, direction)
        return _tagged_sql(cols, order, direction, limited, tags, shape)
    source = "records AS r"
    if order == "seq" and limited:
        # "the newest N under a prefix": walk the seq index and stop after N
        # matches, instead of sorting every record under the prefix (SQLite
        # has no statistics on how selective a prefix is, and usually picks
        # the sort). A prefix matching few records among many costs a scan
        # of the partition's seq index, never a read of values.
        source = "records AS r INDEXED BY records_seq"
    where = " AND ".join([f"r.pid = {_LIVE_PID1}", *_range_sql("r", order, shape)])
    tail = f" ORDER BY r.{order} {direction} LIMIT ?" if limited else ""
    if children:
        picks = f"SELECT r.name AS name, r.{order} AS pos FROM {source} WHERE {where}{tail}"
        return _with_children_sql(picks, cols, direction)
    if order == "name":
        # the primary key's order: the filters are checked on the index entry
        # and only matching rows are read (SQLite defers the row seek), no sort
        order_by = tail or f" ORDER BY r.name {direction}"
        return f"SELECT {cols} FROM records AS r WHERE {where}{order_by}"
    inner = f"SELECT r.rowid FROM {source} WHERE {where}{tail}"
    return f"SELECT {cols} FROM records AS r WHERE r.rowid IN ({inner}) ORDER BY r.seq {direction}"


def _with_children_sql(picks: str, cols: str, direction: str) -> str:
    """Each pick of ``picks`` (columns ``name``, ``pos``), then its children in name order: one statement.

    A child of ``n`` is named ``n/...``: the range ``[n, n + "0")`` holds ``n``,
    its children, and names continuing ``n`` with ``%`` or ``-`` (below
    ``/``), which the last term drops. One statement reads one snapshot.
    """
    return (
        f"WITH p AS ({picks}) SELECT {cols} FROM p CROSS JOIN records AS r "
        f"WHERE r.pid = {_PID} AND r.name >= p.name AND r.name < p.name || '0' "
        "AND (r.name = p.name OR substr(r.name, length(p.name) + 1, 1) = '/') "
        f"ORDER BY p.pos {direction}, r.name"
    )


def _tagged_sql(cols: str, order: str, direction: str, limited: bool, tags: int, shape: _Ranges) -> str:
    """A tag-filtered list, driven by the first tag's index in the query's order.

    The rows of the first tag are walked in ``tags_seq`` (``pkey, k, v, seq``)
    or the table's own key (``pkey, k, v, name``) order, so the ``ORDER BY`` is the
    index order (no sort) and a limit stops the walk after that many matches:
    "the newest record with tag X" is one index seek. Every other tag is
    checked per row by a primary-key lookup, and prefix and range filters on
    the tag row itself, before its record is read. A query whose first tag
    matches many records but whose other tags match few walks the first
    tag's rows; put the most selective tag first. ``cols`` may name ``t.{order}``.
    """
    index = "INDEXED BY tags_seq" if order == "seq" else "NOT INDEXED"  # the table's own key: name order
    where = [f"t.pid = {_LIVE_PID1}", "t.k = ?", "t.v = ?"]
    where += [
        "EXISTS (SELECT 1 FROM tags AS o WHERE o.pid = t.pid AND o.name = t.name AND o.k = ? AND o.v = ?)"
    ] * (tags - 1)
    where += [*_range_sql("t", order, shape), "r.pid = t.pid", "r.name = t.name"]
    sql = (
        f"SELECT {cols.format(order=order)} FROM tags AS t {index} CROSS JOIN records AS r "
        f"WHERE {' AND '.join(where)} ORDER BY t.{order} {direction}"
    )
    return sql + " LIMIT ?" if limited else sql


def _range_params(query: ListQuery, depth: bool = True) -> tuple[_Ranges, list[Any]]:
    """The shape of ``query``'s prefix, depth and start/stop filters, and their parameters (in that order).

    In name order, a ``start`` or ``stop`` name is folded into the prefix's
    bounds (``max(prefix, start)``, ``min(upper, stop)``): one bound a side.
    Given two upper bounds, SQLite ranges the index on one and checks the
    other row by row, so ``list(before=...)`` walked every record above
    ``before``. ``depth=False`` leaves the depth filter out (:func:`_scan_children`).
    """
    start, stop = query.start, query.stop
    lower: str | None = query.prefix or None
    upper = _prefix_upper_bound(query.prefix) if query.prefix else None
    if query.order == "name":
        if type(start) is str:
            lower, start = start if lower is None else max(lower, start), None
        if type(stop) is str:
            upper, stop = stop if upper is None else min(upper, stop), None
    params: list[Any] = [b for b in (lower, upper) if b is not None]
    counted = depth and query.depth is not None
    if counted:  # the '/' in the name: the prefix's own plus ``depth``
        params.append(query.prefix.count("/") + (query.depth or 0))
    for bound in (start, stop):
        if bound is not None:
            params.append(bound)
    shape = (lower is not None, upper is not None, counted, start is not None, stop is not None)
    return shape, params


@functools.lru_cache(maxsize=256)
def _range_sql(alias: str, order: str, shape: _Ranges) -> tuple[str, ...]:
    """``WHERE`` terms on ``alias`` for a range shape (:func:`_range_params` gives their parameters)."""
    prefix, upper, depth, start, stop = shape
    where: list[str] = []
    if prefix:
        where.append(f"{alias}.name >= ?")
    if upper:
        where.append(f"{alias}.name < ?")
    if depth:
        where.append(f"length({alias}.name) - length(replace({alias}.name, '/', '')) = ?")
    if start:
        where.append(f"{alias}.{order} >= ?")
    if stop:
        where.append(f"{alias}.{order} < ?")
    return tuple(where)


def _scans(query: ListQuery) -> bool:
    """Whether ``query`` is read by :func:`_scan_children`: picks in name order with children, no tags, no stop.

    (With a ``stop``, the children of a pick that ``stop`` extends sort above
    it, and a checkpoint id's ``-`` makes every id prefix such a candidate:
    :func:`_with_children_sql` joins each pick's children instead.)
    """
    return query.children and query.order == "name" and not query.tags and query.stop is None


@functools.lru_cache(maxsize=64)
def _scan_sql(shape: _Ranges, descending: bool, values: bool) -> str:
    """The statement of :func:`_scan_children`: the records under the prefix from ``start``, in name order."""
    cols = _COLUMNS if values else _META_COLUMNS
    where = " AND ".join([f"r.pid = {_LIVE_PID1}", *_range_sql("r", "name", shape)])
    return f"SELECT {cols} FROM records AS r WHERE {where} ORDER BY r.name {'DESC' if descending else 'ASC'}"


def _scan_children(conn: sqlite3.Connection, pkey: str, query: ListQuery) -> list[Record]:
    """A children listing (:func:`_scans`) as one range scan in the query's order, stopped in Python.

    The names under the prefix are read from the top (descending) or from
    ``start`` without a limit, and the cursor is stepped only as far as the
    listing needs: a name with the picks' count of ``/`` is a pick, a deeper
    one is a child of the pick its name starts with plus ``/`` (the name up
    to the ``/`` after that count), anything else is skipped. Descending, a
    pick's children sort above it, so the scan stops at the ``limit``-th
    pick; ascending, it goes on past the children of every pick (below the
    highest ``pick + "0"``: a name ``1-a`` sorts between ``1`` and ``1/...``).
    "The newest checkpoint and its writes" reads just those rows, with no
    subquery, join or sort. Only the rows returned are decoded.
    """
    depth = query.prefix.count("/") + (query.depth or 0)
    shape, bounds = _range_params(query, depth=False)
    params: list[Any] = [pkey, *bounds]
    descending, limit = query.descending, query.limit
    picks: dict[str, Sequence[Any]] = {}  # in scan order: the query's
    kids: dict[str, list[Sequence[Any]]] = {}  # by pick name, in scan order
    up = ""  # ascending: the names of every pick's children are below it
    cursor = conn.execute(_scan_sql(shape, descending, query.values), params)
    try:
        for row in cursor:
            name = row[0]
            if type(name) is not str:  # a damaged name (blobs sort above text: met with no prefix)
                raise _damaged(row)
            full = limit is not None and len(picks) >= limit
            if full and name >= up:  # ascending only: descending stopped at the last pick
                break
            slashes = name.count("/")
            if slashes == depth:
                if not full:
                    picks[name] = row
                    if descending and len(picks) == limit:
                        break
                    up = max(up, name + "0")
            elif slashes > depth:
                cut = -1
                for _ in range(depth + 1):
                    cut = name.find("/", cut + 1)
                kids.setdefault(name[:cut], []).append(row)
    finally:
        cursor.close()  # ends the statement (and its read snapshot) when the scan stopped early
    out: list[Record] = []
    for name, row in picks.items():
        out.append(_record(row))
        below = kids.get(name)
        if below:
            out.extend(_record(r) for r in (reversed(below) if descending else below))
    return out


def _list(conn: sqlite3.Connection, pkey: str, query: ListQuery) -> list[Record]:
    if _scans(query):
        return _scan_children(conn, pkey, query)
    sql, params = _list_sql(pkey, query)
    rows = conn.execute(sql, params)
    if not query.children:
        picks = [_record(row) for row in rows]
        if query.tags:
            _check_tagged(query, picks)
        return picks
    # One statement (one snapshot): each pick, then its children. A row is a
    # child of the last pick when its name continues that pick's name with a
    # "/"; a pick never does (picks have one depth, children a greater one).
    out: list[Record] = []
    below = "\x00"  # no name starts with it: the first row is a pick
    for row in rows:
        rec = _record(row)
        if not rec.name.startswith(below):
            if query.tags:
                _check_tagged(query, (rec,))
            below = rec.name + "/"
        out.append(rec)
    return out


def _is_range(query: ListQuery) -> bool:
    """Whether ``query`` is "every record under a prefix, in name order": what :func:`_many_reads` joins."""
    return (
        query == ListQuery(prefix=query.prefix, values=query.values)
        and bool(query.prefix)
        and _prefix_upper_bound(query.prefix) is not None
    )


@functools.lru_cache(maxsize=64)
def _ranges_sql(count: int, values: bool) -> str:
    """Every record in any of ``count`` name ranges, each row led by its range's position: one statement."""
    marks = ", ".join(["(?, ?, ?)"] * count)
    cols = _COLUMNS if values else _META_COLUMNS
    return (
        f"WITH q(i, lo, hi) AS (VALUES {marks}) SELECT q.i, {cols} FROM q CROSS JOIN records AS r "
        f"WHERE r.pid = {_LIVE_PID.format(n=3 * count + 1)} AND r.name >= q.lo AND r.name < q.hi"
    )


def _many_reads(conn: sqlite3.Connection, ops: Sequence[GetOp | ListOp]) -> list[Any]:
    """The results of read operations on one connection; prefix listings of one partition in one statement.

    The flows' :class:`~.ops.Parallel` reads (the writes of each of up to 64
    checkpoints, beside a get of blobs) are independent: each listing is
    what it would be alone, in name order.
    """
    results: list[Any] = [None] * len(ops)
    ranges: dict[tuple[str, bool], list[tuple[int, str]]] = {}
    for i, op in enumerate(ops):
        if isinstance(op, GetOp):
            results[i] = _get(conn, op.partition.key, op.names)
        elif _is_range(op.query):
            ranges.setdefault((op.partition.key, op.query.values), []).append((i, op.query.prefix))
        else:
            results[i] = _list(conn, op.partition.key, op.query)
    for (pkey, values), group in ranges.items():
        for start in range(0, len(group), _CHUNK // 3):  # 3 variables a range
            chunk = group[start : start + _CHUNK // 3]
            params: list[Any] = []
            for i, prefix in chunk:
                params += [i, prefix, _prefix_upper_bound(prefix)]
                results[i] = []
            for row in conn.execute(_ranges_sql(len(chunk), values), (*params, pkey)):
                results[row[0]].append(_record(row[1:]))
            for i, _ in chunk:
                results[i].sort(key=_by_name)  # already in order: the index's
    return results


def _by_name(record: Record) -> str:
    return record.name


def _check_tagged(query: ListQuery, picks: Sequence[Record]) -> None:
    """Every record a tag query picked through the ``tags`` table carries those tags in its own row.

    The two are written together; a record that a tag row names but whose
    own tags differ (a damaged or forged tag row) is refused, not returned
    as a match.
    """
    wanted = query.tags.items()
    for rec in picks:
        tags = rec.tags
        if any(tags.get(k) != v for k, v in wanted):
            raise CorruptItemError(
                rec.name, "the SQLite tag index lists it under tags its own row does not carry"
            )


# -- the read cache ----------------------------------------------------------------

#: A pooled read connection keeps at most this many results, and this many bytes of them.
_CACHE_ENTRIES = 64
_CACHE_BYTES = 2 * 1024 * 1024
#: A result above this many bytes is not kept (it would push out most of the others).
_CACHE_ENTRY_BYTES = 1024 * 1024
_RECORD_OVERHEAD = 128  #: bytes counted per record beside its value and name
#: ``data_version`` and the partition's ``expires_at``, read in one statement (one snapshot).
_VERSION_EXPIRY_SQL = (
    "SELECT data_version, (SELECT expires_at FROM partitions WHERE pkey = ?) FROM pragma_data_version"
)


class _ReadCache:
    """The results one pooled read connection read, kept while nothing can have changed them.

    Valid only while ``PRAGMA data_version`` is the value they were read
    under: SQLite changes it whenever *another* connection, of this process
    (the backend's writer, a second backend on the file) or of any other, has
    committed since, so a put, delete, drop, prune, sweep, refresh or VACUUM
    by anyone empties the cache before the next read is served. The version
    is read in its own statement just before the records
    (:func:`_read_through`), so an entry may be labelled with a version older
    than its snapshot (a commit in between: the next check sees the newer
    version and drops the entry unserved), never with a newer one. A commit
    by this connection itself does not change the value: ``total_changes``
    (rows this connection changed) is compared too, so the writer connection
    (which also serves reads while no write holds it) empties its cache when
    it wrote, except after a batch of puts in one partition (:func:`_write`),
    which forgets that partition's entries only (:meth:`wrote`).

    A result also depends on the clock: a partition whose ``expires_at`` has
    passed reads as empty. An entry is served only if it was read (the
    backend's clock just after the read) and is asked for before its
    partition's expiry. That expiry is read at the first hit, in the same
    statement as the version (one snapshot), not on the miss (which stays one
    statement more than without the cache), and kept in ``expiries`` for the
    version: at an unchanged version the stored expiry is the one the read
    saw. So an expired partition's empty result is never served, not even
    after a test clock is set back.

    No caller ever holds a cached object: entries are copies (:func:`_fresh`),
    and every hit returns a new list of new :class:`Record` objects with tags
    dicts of their own (``value`` is immutable ``bytes``, shared). Bounded by
    :data:`_CACHE_ENTRIES` and :data:`_CACHE_BYTES`, least recently used out first.
    """

    __slots__ = ("version", "changes", "entries", "size", "expiries")

    def __init__(self) -> None:
        self.version: int | None = None
        self.changes = -1
        #: key -> (result, bytes counted, the backend's clock when it was read)
        self.entries: dict[Any, tuple[list[Any], int, float]] = {}
        self.size = 0
        #: pkey -> its expiry at this version (None: never; -inf: not to be served, a damaged value)
        self.expiries: dict[str, float | None] = {}

    def reset(self, version: int, changes: int) -> None:
        """Forget everything: the file may have changed since (or this connection wrote)."""
        self.version, self.changes = version, changes
        self.entries.clear()
        self.expiries.clear()
        self.size = 0

    def wrote(self, pkey: str, before: int, after: int) -> None:
        """After this connection committed a batch of puts in ``pkey`` alone: forget that partition only.

        ``before`` and ``after`` are the connection's ``total_changes`` around
        the write. Every entry reads one partition (its key starts with the
        partition's key), so the others still hold what a read would return;
        a write by anyone else changes ``data_version``, which still empties
        everything. Only when the cache was current before the write
        (``before`` is the count it was read under): else the next read resets it.
        """
        if before != self.changes:
            return
        self.changes = after
        self.expiries.pop(pkey, None)
        entries = self.entries
        for key in [key for key in entries if key[0] == pkey]:
            self.size -= entries.pop(key)[1]

    def keep(self, key: Any, result: list[Any], read_at: float) -> None:
        """Remember a copy of ``result`` under ``key`` if it fits, evicting the least recently used."""
        size = _result_size(result)
        if size > _CACHE_ENTRY_BYTES:
            return
        entries = self.entries
        old = entries.pop(key, None)  # re-read (it was not servable): replaced
        if old is not None:
            self.size -= old[1]
        while entries and (len(entries) >= _CACHE_ENTRIES or self.size + size > _CACHE_BYTES):
            self.size -= entries.pop(next(iter(entries)))[1]
        entries[key] = (_fresh(result), size, read_at)
        self.size += size


_new_object = object.__new__
_set_attr = object.__setattr__  #: how a frozen dataclass sets its fields


def _result_size(result: Sequence[Any]) -> int:
    """The bytes a result of :func:`_get`, :func:`_list` or :func:`_many_reads` is counted for."""
    size = 0
    for item in result:
        if type(item) is Record:
            size += len(item.value) + len(item.name) + _RECORD_OVERHEAD
        elif item is not None:
            size += _result_size(item)
    return size


def _fresh(result: Sequence[Any]) -> list[Any]:
    """A copy of a read's result that shares no mutable object with it (records and their tags).

    Each record is copied by its ``__dict__`` (a frozen dataclass without
    slots), its tags into a dict of their own: a third fewer instructions than
    calling ``Record(...)`` with six attribute reads (callgrind).
    """
    out: list[Any] = []
    for item in result:
        if type(item) is Record:
            fields = item.__dict__.copy()
            tags = fields["tags"]
            fields["tags"] = dict(tags) if tags else {}
            copy = _new_object(Record)
            _set_attr(copy, "__dict__", fields)
            out.append(copy)
        elif item is None:
            out.append(None)
        else:
            out.append(_fresh(item))
    return out


def _read_through(conn: _Connection, read: Callable[..., list[Any]], key: Any, pkey: str, *args: Any) -> list[Any]:
    """``read(conn, *args)``, served from the connection's :class:`_ReadCache` while that is valid.

    ``pkey`` is the one partition the read reads (its expiry bounds the
    entry and is part of the cache key); ``key`` says what was read in it
    (hashable, equal only for reads that return equal results from one
    snapshot). A hit is one statement (``PRAGMA data_version``; at the first
    hit of a version, with the partition's expiry); a miss is that one and the read.
    """
    if conn.in_transaction:  # a snapshot of its own: not the cache's to judge
        return read(conn, *args)
    key = (pkey, key)  # the partition is always part of what was read: never served to another
    cache = conn.read_cache
    box = conn.retention  # the backend's clock (cp_now), set by SqliteBackend._connect
    entry = cache.entries.get(key)
    unknown = entry is not None and pkey not in cache.expiries
    if unknown:  # the version and the partition's expiry from one snapshot: one statement
        version, stored = conn.execute(_VERSION_EXPIRY_SQL, (pkey,)).fetchone()
    else:
        (version,) = conn.execute("PRAGMA data_version").fetchone()
    changes = conn.total_changes
    if version != cache.version or changes != cache.changes:
        cache.reset(version, changes)
    elif entry is not None:
        if unknown:
            cache.expiries[pkey] = _expiry_of(stored)
        expires = cache.expiries[pkey]
        if expires is None or max(entry[2], _box_now(box)) < expires:
            cache.entries[key] = cache.entries.pop(key)  # most recently used
            return _fresh(entry[0])
    # A statement of its own, at ``version`` or later: a commit in between
    # changes the next ``data_version``, which drops the entry unserved.
    result = read(conn, *args)
    cache.keep(key, result, _box_now(box))
    return result


def _expiry_of(stored: Any) -> float | None:
    """A ``partitions.expires_at`` for the cache: None (never), seconds, or -inf (damaged: never served)."""
    if stored is None:
        return None
    return float(stored) if type(stored) in (int, float) else -math.inf


def _query_key(query: ListQuery) -> tuple[Any, ...]:
    """What identifies a listing's result (:class:`ListQuery` holds a dict: not hashable itself)."""
    return (
        query.prefix, query.order, query.descending, query.limit, tuple(query.tags.items()),
        query.start, query.stop, query.values, query.depth, query.children,
    )  # fmt: skip


def _get_key(names: tuple[str, ...]) -> tuple[Any, ...] | None:
    """The cache key of a get of ``names``; None: not cached (more than one ``IN`` list: a transaction of its own)."""
    return None if len(names) > _CHUNK else ("get", names)


def _read_key(op: GetOp | ListOp) -> tuple[Any, ...] | None:
    """The cache key of one read of :meth:`SqliteBackend.many`; None: not cached (a get of many names)."""
    if isinstance(op, GetOp):
        return _get_key(tuple(op.names))
    return ("list", _query_key(op.query))


def _partitions(conn: sqlite3.Connection, user: str, space: str) -> list[str]:
    """The raw names of ``user``'s partitions in ``space``, each checked against its key.

    A ``partitions`` row keeps the raw name next to its key (``pkey``) because
    a hashed key cannot be decoded. A name that is not text-as-bytes, or
    whose partition key is not the row's ``pkey`` (damaged, or a row copied
    from another user or partition), raises :class:`CorruptItemError`: a
    listing never names a partition the caller cannot reach by that name.
    """
    user_key = Partition(user, space, "").user_key
    # every key of the user's partitions starts with ``user_key`` (which ends with "/"): a range of the table's key
    rows = conn.execute(
        "SELECT pkey, name, user_key FROM partitions WHERE pkey >= ? AND pkey < ? "
        "AND (expires_at IS NULL OR expires_at > cp_now())",
        (user_key, _prefix_upper_bound(user_key)),
    )
    names: list[str] = []
    for pkey, raw, owner in rows:
        if owner == "":  # the row v6 gave records that had none (v5 never listed them): no user's
            continue
        try:
            name = _unblob(raw) if type(raw) is bytes else None
        except UnicodeDecodeError:  # not what _blob wrote
            name = None
        # ``Partition.key`` is ``user_key + encode_component(name)``, spelled out here
        # (a Partition per row made the listing 5x slower); the property decides if not
        if name is None or owner != user_key or not (
            pkey == user_key + encode_component(name) or Partition(user, space, name).key == pkey
        ):
            raise CorruptItemError(
                str(pkey),
                f"the SQLite partitions row is damaged: its name column ({_shown(raw)}) "
                f"does not name the partition of its key",
            )
        names.append(name)
    return sorted(names)


def _drop(conn: sqlite3.Connection, pkey: str) -> int:
    with _transaction(conn, immediate=True):
        count, reclaimed = _purge(conn, pkey)
    if isinstance(conn, _Connection):
        conn.wrote(pkey, None, everywhere=True)  # the shared seq_counter may have risen
    _after_deletes(conn, *reclaimed)
    return count


def _purge(conn: sqlite3.Connection, pkey: str) -> tuple[int, tuple[int, bool]]:
    """Delete every row of partition ``pkey`` inside the caller's write transaction.

    Returns how many records went and what :func:`_reclaim` said.
    """
    found = conn.execute("SELECT id FROM partitions WHERE pkey = ?", (pkey,)).fetchone()
    pid = None if found is None else found[0]
    (top,) = conn.execute("SELECT MAX(seq) FROM records WHERE pid = ?", (pid,)).fetchone()
    if top is not None and (type(top) is not int or top > _MAX_SEQ):  # a damaged seq (see _intact_base)
        (top,) = conn.execute(
            "SELECT MAX(seq) FROM records WHERE pid = ? AND typeof(seq) = 'integer' AND seq <= ?",
            (pid, _MAX_SEQ),
        ).fetchone()
    if top is not None:
        _retire_seqs(conn, top)
    free_before = _free_pages(conn)
    count = conn.execute("DELETE FROM records WHERE pid = ?", (pid,)).rowcount
    conn.execute("DELETE FROM tags WHERE pid = ?", (pid,))
    conn.execute("DELETE FROM partitions WHERE pkey = ?", (pkey,))
    return count, _reclaim(conn, free_before)


# -- retention ---------------------------------------------------------------------

_DUE = (
    "SELECT pkey, user_key, name, expires_at FROM partitions "
    "WHERE expires_at <= cp_now() ORDER BY expires_at LIMIT ?"
)


def _expired(conn: sqlite3.Connection, limit: int) -> list[ExpiredPartition]:
    """Up to ``limit`` expired partitions, soonest expiry first (the ``partitions_expiry`` index)."""
    return [
        ExpiredPartition(str(pkey), str(user_key), _unblob(raw) if type(raw) is bytes else str(raw), float(at))
        for pkey, user_key, raw, at in conn.execute(_DUE, (limit,)).fetchall()
    ]


def _sweep(conn: sqlite3.Connection, limit: int) -> int:
    """Remove up to ``limit`` expired partitions, each in its own write transaction re-checking the expiry."""
    keys = [row[0] for row in conn.execute(_DUE, (limit,)).fetchall()]
    removed = 0
    for pkey in keys:
        with _transaction(conn, immediate=True):
            still = conn.execute(
                "SELECT 1 FROM partitions WHERE pkey = ? AND expires_at <= cp_now()", (pkey,)
            ).fetchone()
            reclaimed = _purge(conn, pkey)[1] if still else None
        if reclaimed is not None:
            removed += 1
            _after_deletes(conn, *reclaimed)
    if removed and isinstance(conn, _Connection):
        conn.wrote("", None, everywhere=True)
    return removed


def _users(conn: sqlite3.Connection, space: str | None) -> list[str]:
    rows = conn.execute(
        "SELECT DISTINCT user_key FROM partitions WHERE expires_at IS NULL OR expires_at > cp_now()"
    ).fetchall()
    return users_of((str(r[0]) for r in rows), space)


def _expiry(conn: sqlite3.Connection, pkey: str) -> float | None:
    row = conn.execute("SELECT expires_at FROM partitions WHERE pkey = ?", (pkey,)).fetchone()
    return None if row is None or row[0] is None else float(row[0])


def _refresh(conn: sqlite3.Connection, pkey: str, ttl: float) -> None:
    """Push a read partition's expiry back; the WHERE re-checks it is live and under half the ttl."""
    with _transaction(conn, immediate=True):
        conn.execute(
            "UPDATE partitions SET expires_at = cp_now() + ? WHERE pkey = ? "
            "AND expires_at > cp_now() AND expires_at < cp_now() + ? / 2",
            (ttl, pkey, ttl),
        )


# -- the backend -----------------------------------------------------------------


def _closed_error(path: str) -> BackendUnavailableError:
    return BackendUnavailableError(f"SqliteBackend({path!r}) is closed; open a new one")


class SqliteBackend(Backend):
    """Records in one SQLite file, safe for several threads and processes.

    ``path`` must name a file (``:memory:`` is refused: the point is that
    several processes share it); its directory must exist. ``timeout`` bounds
    how long a call waits for another connection's write lock before raising
    :class:`BackendUnavailableError`. ``synchronous`` is ``"NORMAL"`` (survives
    ``kill -9``; a power loss may lose the last commits) or ``"FULL"`` /
    ``"EXTRA"`` (also survives power loss, slower commits).

    The file is opened (and migrated) in the constructor, so a bad path fails
    here, not at the first write.

    >>> import tempfile, os
    >>> from checkpointers import Store
    >>> path = os.path.join(tempfile.mkdtemp(), "state.db")
    >>> with SqliteBackend(path) as backend:
    ...     Store(backend).for_user("alice").set_item("runs/r1", "plan", [1, 2]).value
    [1, 2]
    """

    kind = "sqlite"
    #: One more condition costs nothing: a batch's conditions are checked in
    #: its one ``BEGIN IMMEDIATE`` transaction (an unchanged ``IF_MATCH``
    #: re-put is checked and kept, not rewritten), so a write without a lease
    #: carries its guard instead of reading the lease record first.
    inline_conditions = True

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        timeout: float = 30.0,
        synchronous: str = "NORMAL",
        max_idle_connections: int = 4,
        ttl: float | None = None,
        refresh_on_read: bool = False,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self._retention_box: list[Retention] = [self.retention]  # what this backend's connections read
        self._set_retention(ttl, refresh_on_read, clock)
        self.path = os.fspath(path)
        if self.path in ("", ":memory:"):
            raise ValueError(
                f"SqliteBackend needs a file path, got {self.path!r}: in-memory databases "
                f"cannot be shared between processes (use MemoryBackend for that)"
            )
        if timeout <= 0:
            raise ValueError(f"timeout must be positive seconds, got {timeout}")
        if str(synchronous).upper() not in _SYNCHRONOUS:
            raise ValueError(f"synchronous must be one of {_SYNCHRONOUS}, got {synchronous!r}")
        self.timeout = float(timeout)
        self.synchronous = str(synchronous).upper()
        self._max_idle = max_idle_connections
        self._lock = threading.Lock()
        self._setup_lock = threading.Lock()
        # Writers of this process queue on a lock before BEGIN IMMEDIATE: SQLite's
        # busy handler sleeps in growing steps (1, 2, 5, 10 ms...) while another
        # connection holds the write lock, which made LangGraph's concurrent
        # background put/put_writes threads wait milliseconds for microseconds
        # of work. Other processes still meet the busy handler (busy timeout).
        self._writer = threading.Lock()
        self._wconn: sqlite3.Connection | None = None  # the writer connection, guarded by _writer
        self._ready = False
        self._closed = False
        self._idle: list[sqlite3.Connection] = []
        # The async face's thread. Its error names the path, not self: no cycle keeps
        # a backend the program dropped without close() (and its worker) alive.
        self._offload = Offload("checkpointers-sqlite", functools.partial(_closed_error, self.path))
        with translate_errors(self.path):
            self._idle.append(self._connect())

    @classmethod
    def from_url(cls, url: str, **options: Any) -> SqliteBackend:
        """Open ``sqlite:///relative/path.db`` or ``sqlite:////absolute/path.db``.

        As in SQLAlchemy, everything after ``sqlite:///`` is the path (so an
        absolute path gives four slashes). Query options ``timeout`` and
        ``synchronous`` are accepted (``?timeout=5&synchronous=FULL``);
        keyword ``options`` override them.
        """
        parts = urlsplit(url)
        if parts.scheme != "sqlite":
            raise ValueError(f"not a sqlite:// URL: {url!r}")
        if parts.netloc:
            raise ValueError(
                f"sqlite URL {url!r} names a host; use sqlite:///relative.db or "
                f"sqlite:////absolute/path.db (three slashes, then the path)"
            )
        path = unquote(parts.path[1:])
        if not path or path == ":memory:":
            raise ValueError(
                f"sqlite URL {url!r} names no file; in-memory databases cannot be shared "
                f"between processes: use sqlite:///state.db or memory://"
            )
        merged: dict[str, Any] = dict(query_options(url))
        unknown = set(merged) - {"timeout", "synchronous", "ttl", "refresh_on_read"}
        if unknown:
            raise ValueError(
                f"unknown sqlite URL option(s) {sorted(unknown)}; supported: timeout, synchronous, "
                f"ttl, refresh_on_read"
            )
        if "timeout" in merged:
            merged["timeout"] = float(merged["timeout"])
        merged.update(retention_options(merged))
        merged.update(options)
        return cls(Path(path), **merged)

    # -- the five operations, sync and async (the sync one on the worker): one line each --

    def get(self, partition: Partition, names: Sequence[str]) -> list[Record | None]:
        names = tuple(names)
        pkey = partition.key
        key = _get_key(names)
        if key is None:
            found = self._run(_get, pkey, names)
        else:
            found = self._run(_read_through, _get, key, pkey, pkey, names)
        self._read(partition)
        return found

    def write(
        self, partition: Partition, puts: Sequence[Put], deletes: Sequence[Delete] = ()
    ) -> WriteResult:
        result = self._run_write(_write, partition, tuple(puts), tuple(deletes))
        self._auto_sweep()
        return result

    def list(self, partition: Partition, query: ListQuery) -> list[Record]:
        pkey = partition.key
        found = self._run(_read_through, _list, ("list", _query_key(query)), pkey, pkey, query)
        self._read(partition)
        return found

    def _read(self, partition: Partition) -> None:
        """After a read, with ``refresh_on_read``: push the expiry back when under half the ttl is left."""
        if self.retention.refresh_on_read and self.retention.refresh_due(self._run(_expiry, partition.key)):
            self._run_write(_refresh, partition.key, self.retention.ttl)

    # -- retention (see the module docstring of .base) -----------------------------

    def set_retention(
        self, ttl: object = None, refresh_on_read: bool = False, clock: Callable[[], float] | None = None
    ) -> None:
        super().set_retention(ttl, refresh_on_read, clock)
        self._retention_box[:] = [self.retention]  # the connections' cp_now() and ttl follow

    def sweep(self, limit: int = 1000) -> int:
        return self._run_write(_sweep, limit)

    def expired(self, limit: int = 1000) -> builtins.list[ExpiredPartition]:
        return self._run(_expired, limit)

    def users(self, space: str | None = None) -> builtins.list[str]:
        return self._run(_users, space)

    def expiry(self, partition: Partition) -> float | None:
        return self._run(_expiry, partition.key)

    async def asweep(self, limit: int = 1000) -> int:
        return await self._offload.run(self.sweep, limit)

    async def aexpired(self, limit: int = 1000) -> builtins.list[ExpiredPartition]:
        return await self._offload.run(self.expired, limit)

    async def ausers(self, space: str | None = None) -> builtins.list[str]:
        return await self._offload.run(self.users, space)

    async def aexpiry(self, partition: Partition) -> float | None:
        return await self._offload.run(self.expiry, partition)

    def partitions(self, user: str, space: str) -> builtins.list[str]:
        return self._run(_partitions, user, space)

    def drop(self, partition: Partition) -> int:
        return self._run_write(_drop, partition.key)

    async def aget(self, partition: Partition, names: Sequence[str]) -> builtins.list[Record | None]:
        return await self._offload.run(self.get, partition, names)

    async def awrite(
        self, partition: Partition, puts: Sequence[Put], deletes: Sequence[Delete] = ()
    ) -> WriteResult:
        return await self._offload.run(self.write, partition, puts, deletes)

    async def alist(self, partition: Partition, query: ListQuery) -> builtins.list[Record]:
        return await self._offload.run(self.list, partition, query)

    async def apartitions(self, user: str, space: str) -> builtins.list[str]:
        return await self._offload.run(self.partitions, user, space)

    async def adrop(self, partition: Partition) -> int:
        return await self._offload.run(self.drop, partition)

    def many(self, ops: Sequence[Any]) -> builtins.list[Any]:
        """Reads (gets, listings) on one connection, prefix listings of a partition in one statement.

        Anything else runs one by one (:meth:`Backend.many`).
        """
        if len(ops) > 1 and all(isinstance(op, (GetOp, ListOp)) for op in ops):
            ops = tuple(ops)
            keys = tuple(_read_key(op) for op in ops)
            pkeys = {op.partition.key for op in ops}
            if None in keys or len(pkeys) != 1:  # cached: reads of one partition, none of many names
                results = self._run(_many_reads, ops)
            else:
                (pkey,) = pkeys
                results = self._run(_read_through, _many_reads, ("many", keys), pkey, ops)
            if self.retention.refresh_on_read:
                for partition in read_partitions(ops):
                    self._read(partition)
            return results
        return super().many(ops)

    async def amany(self, ops: Sequence[Any]) -> builtins.list[Any]:
        """Async :meth:`many`: reads in one call on the worker, anything else concurrently."""
        if len(ops) > 1 and all(isinstance(op, (GetOp, ListOp)) for op in ops):
            return await self._offload.run(self.many, ops)
        return await super().amany(ops)

    # -- connections -----------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        """Open and configure one connection; the first one also runs the migrations.

        ``isolation_level=None``: transactions are explicit (``_transaction``).
        ``check_same_thread=False``: the pool hands a connection to one thread
        at a time, and ``close()`` may run on another thread.
        """
        conn = sqlite3.connect(
            self.path,
            timeout=self.timeout,
            isolation_level=None,
            check_same_thread=False,
            factory=_Connection,
        )
        try:
            conn.create_function("cp_now", 0, functools.partial(_box_now, self._retention_box))
            conn.retention = self._retention_box
            conn.execute(f"PRAGMA synchronous={self.synchronous}")
            conn.execute(f"PRAGMA journal_size_limit={_WAL_SIZE_LIMIT}")
            if not self._ready:
                with self._setup_lock:
                    if not self._ready:
                        _retrying(self.timeout, _setup, conn)
                        self._ready = True
            (vacuum,) = conn.execute("PRAGMA auto_vacuum").fetchone()
            conn.vacuums = vacuum != _NO_VACUUM
        except BaseException:
            conn.close()
            raise
        return conn

    def _on_writer(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(writer connection, *args)``, under the writer lock.

        Runs on whatever thread calls it (the caller's for sync calls, the
        worker for async ones). Every write of this backend goes through one
        connection, so its page cache stays warm. A connection's cache is dropped whenever
        *another* connection has committed since its last transaction, and
        LangGraph's concurrent put/put_writes threads made the pool hand out
        alternating connections that re-read every page they touched.
        """
        with self._writer:
            conn = self._wconn
            if conn is None:
                if self._closed:
                    raise self._closed_error()
                conn = self._wconn = self._connect()
            try:
                return fn(conn, *args)
            finally:
                if conn.in_transaction or self._closed:  # broken, or closed meanwhile
                    self._wconn = None
                    conn.close()

    def _closed_error(self) -> BackendUnavailableError:
        return _closed_error(self.path)

    def _run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run the read ``fn(conn, *args)``, errors translated: on the writer connection if it is free, else pooled.

        The writer connection keeps its page cache across its own commits,
        while every other connection drops its cache at each of them
        (SQLite's WAL change counter), so a read right after this backend's
        write re-reads no page there. Taken only if no write holds it
        (never waited for); a write arriving meanwhile waits for one statement.
        """
        if self._writer.acquire(blocking=False):
            try:
                wconn = self._wconn
                if wconn is not None and not self._closed:
                    with translate_errors(self.path):
                        try:
                            return _retrying(self.timeout, fn, wconn, *args)
                        finally:
                            if wconn.in_transaction or self._closed:  # broken, or closed meanwhile
                                self._wconn = None
                                wconn.close()
            finally:
                self._writer.release()
        with self._lock:
            if self._closed:
                raise self._closed_error()
            conn = self._idle.pop() if self._idle else None
        with translate_errors(self.path):
            if conn is None:
                conn = self._connect()
            try:
                return _retrying(self.timeout, fn, conn, *args)
            finally:
                self._give_back(conn)

    def _run_write(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(conn, *args)`` on the writer connection (see :meth:`_on_writer`)."""
        if self._closed:
            raise self._closed_error()
        with translate_errors(self.path):
            # annotated: mypy does not carry T through the generic method passed as a callable
            result: T = _retrying(self.timeout, self._on_writer, fn, *args)
            return result

    def _give_back(self, conn: sqlite3.Connection) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < self._max_idle and not conn.in_transaction:
                self._idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        """Close every connection and stop the worker (async calls still queued find the backend closed)."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
        with self._writer:  # waits for a write in flight to finish
            wconn, self._wconn = self._wconn, None
        if wconn is not None:
            wconn.close()
        self._offload.close()

    async def aclose(self) -> None:
        """Close everything, awaiting the async calls already queued and the worker's end."""
        await self._offload.aclose()
        self.close()

    def __repr__(self) -> str:
        return f"SqliteBackend({self.path!r})"

