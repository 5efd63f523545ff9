"""PostgreSQL backend: psycopg 3, sync and native async, pooled, one round trip per operation.

Every operation is ONE SQL statement, built once by a pure function and sent
by either face: the sync one on a :class:`psycopg_pool.ConnectionPool`, the
async one on native :class:`psycopg.AsyncConnection` objects kept per event
loop (:class:`_LoopConnections`: psycopg_pool's async pool keeps worker tasks
on its loop, and a loop ending with them pending, as ``asyncio.run`` per
request does, hangs in their cancellation). Connections are in autocommit
mode, so a statement is its own transaction.

Schema (in its own PostgreSQL schema, ``checkpointers`` unless ``schema=``)
---------------------------------------------------------------------------

``records(pkey, name, seq, etag, digest, tags, value)``
    one row per record, primary key ``(pkey, name)`` (``pkey`` is
    :attr:`Partition.key`, names in ``"C"`` collation: byte order, which is
    the contract's name order); index ``(pkey || '', seq)``, which only
    the reads in seq order name (migration 6). ``tags`` is the
    record's canonical tags JSON (:func:`~.base.tags_json`), ``value`` bytea
    (compressed with LZ4 when the row is large, since migration 7, where the
    server has LZ4; pglz before).
``tags(pkey, name, k, v, seq)``
    one row per tag (key and value JSON-encoded, so any string is stored
    injectively), primary key ``(pkey, k, v, name)`` and index ``(pkey, k, v,
    seq)``: a tag query walks the index of its order inside one partition and
    stops at its limit; it never reads another partition's tags. A record's
    tag rows are deleted by their keys, read from its ``tags`` column
    (``tag_pairs``, migration 8).
``partitions(pkey, user_key, name)``
    one row per non-empty partition: its raw name (``Partition.key`` may be a
    hash) and its expiry.
``seq`` (a sequence), ``schema_migrations(v)``.

The schema is created and migrated by the backend itself, on first use or by
:meth:`PostgresBackend.migrate`: :data:`MIGRATIONS` (read from
``postgres_schema.sql``), applied in one transaction under
``pg_advisory_xact_lock``, so several processes starting at once apply each
migration exactly once.

Writes
------

A batch is one call of the SQL function ``write_batch`` (one statement, one
transaction, one round trip). It first takes the partition's **write lock**,
a transaction-scoped advisory lock (``pg_advisory_xact_lock`` on a hash of
the schema and the partition key, released at commit: nothing held across
transactions, so PgBouncer's transaction mode is fine), so writers of one
partition queue there and each sees the last one's commit. It then checks
every condition (create: absent; append: absent, or same content digest ->
no-op; if_match: the stored etag; delete if_match) against the rows as
committed, and only then writes. A refused batch leaves nothing written; a
batch whose puts are all kept (a lease guard, an append of the same content)
writes nothing at all: it takes no transaction id and no WAL, so its commit
waits for no flush. A partition that can expire also has its ``partitions`` row
locked (``FOR UPDATE``) while it is written, so a sweep (``FOR UPDATE SKIP
LOCKED``) skips it; so does every partition for an hour after a schema that
already had writers migrated to the advisory lock (``row_lock_until``: a
batch begun under the row lock alone may still be running then). Seqs are
drawn from one sequence while the lock is held, so they grow strictly within
a partition, also across a drop.

Reads, pipelines, PgBouncer
---------------------------

``get`` is one ``SELECT`` reading each name by its key; ``list`` one
``SELECT`` (with ``children``, one statement with a materialized CTE: one
snapshot). A limited ``list`` with at most one tag reads its records with
``pick_records`` / ``pick_tagged`` (plpgsql, ``SET enable_sort = off``: the
walk of the index in its order, stopped at the limit, is the only plan
without a sort); other records read by name (``get``, children, tag joins)
are read by key in ``LATERAL (... OFFSET 0)`` subqueries. So no plan reads
the whole partition, whatever the planner believes of its size
(``docs/postgres.md``). ``partitions`` reads the registry by ``user_key``.
:meth:`PostgresBackend.many` sends independent reads in one
psycopg pipeline (one round trip). Nothing relies on session state across
transactions. Statements are prepared on the server from their first use
(``prepare_threshold=0``, as ``PostgresSaver``'s connections do: the latest
read's plan alone costs more than its execution). psycopg prepares them with
protocol-level named statements, which PgBouncer 1.21 and later tracks per
server connection in transaction mode (``max_prepared_statements`` > 0, the
default since 1.22); behind an older pooler, or one that cannot, pass
``prepare_threshold=None`` (URL ``?prepare_threshold=none``): nothing is
then prepared on the server. Pass ``pipeline=False`` if your pooler cannot
forward pipelined statements.

Existing connections
--------------------

``PostgresBackend(conn)`` (as ``PostgresSaver(conn)``) takes a
:class:`psycopg.Connection` or :class:`psycopg_pool.ConnectionPool` (the
sync face; the async face runs it in a worker thread), or a
:class:`psycopg.AsyncConnection` or :class:`psycopg_pool.AsyncConnectionPool`
(the async face; the sync face refuses). The backend never closes it. Its
row factory and prepare threshold are the caller's; a connection without
autocommit gets one transaction per operation (inside the caller's own
transaction if one is open, whose commit then decides). One connection is
used by one operation at a time (a lock); a broken one is not reopened.

Errors and retries
------------------

Connection loss, server shutdown or start-up, too many connections and
serialization failures are retried ``retry_attempts`` times with a growing
backoff (the pool's idle connections are checked after a failure). A write
whose attempt may have been applied before its reply was lost is retried,
and a conflict it then meets is checked against the stored records: if they
carry this batch's own etags (etags are unique per write) the batch is
reported applied. Then :class:`~checkpointers.errors.BackendUnavailableError`
is raised, the driver's exception chained. Driver errors that mean a bug
(syntax, a type, a constraint) are a plain
:class:`~checkpointers.errors.CheckpointerError`, never retried.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import functools
import json
import random
import re
import struct
import threading
import time
from collections.abc import AsyncIterator, Callable, Generator, Iterator, Sequence
from dataclasses import dataclass
from importlib import resources
from json.encoder import encode_basestring_ascii as _json_str
from typing import Any, Literal, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg.rows import tuple_row
from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolTimeout

from .._names import Partition
from ..errors import BackendUnavailableError, CheckpointerError, CorruptItemError
from . import retention_options, url_flag
from .base import (
    Backend,
    Conflict,
    Delete,
    ExpiredPartition,
    ListQuery,
    Mode,
    Put,
    Record,
    WriteResult,
    check_batch,
    content_digest,
    read_partitions,
    tags_json,
    users_of,
)
from .ops import GetOp, ListOp, PartitionsOp

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "Connectable", "PostgresBackend"]

T = TypeVar("T")

#: The rows a statement returned.
_Rows = builtins.list[tuple[Any, ...]]
#: A caller's connection or pool (``PostgresBackend(conn)``), sync or async.
Connectable = psycopg.Connection[Any] | ConnectionPool | psycopg.AsyncConnection[Any] | AsyncConnectionPool


@dataclass(frozen=True)
class _Stmt:
    """One SQL statement and its parameters.

    Placeholders are ``%b``: every parameter is sent in binary. psycopg dumps
    the text arrays of a write batch in binary with no per-element escaping
    (text arrays go through regular expressions), about half the client CPU
    of dumping a batch's parameters.
    """

    sql: str
    params: Sequence[Any] = ()


@dataclass(frozen=True)
class _Batch:
    """Independent statements sent in one pipeline; the reply is each one's rows, in order."""

    statements: tuple[_Stmt, ...]


#: An operation: yields statements, receives each one's rows, returns its result.
_Op = Generator[Any, Any, T]


def _load_migrations() -> builtins.list[builtins.list[str]]:
    """The ``-- migration N`` blocks of ``postgres_schema.sql``, each a list of statements."""
    text = resources.files(__package__).joinpath("postgres_schema.sql").read_text("utf-8")
    blocks = re.split(r"^-- migration (\d+):.*$", text, flags=re.MULTILINE)
    out: builtins.list[builtins.list[str]] = []
    for number, body in zip(blocks[1::2], blocks[2::2], strict=True):
        if int(number) != len(out) + 1:
            raise RuntimeError(f"postgres_schema.sql: migration {number} out of order")
        out.append([s.strip() for s in re.split(r"^;;$", body, flags=re.MULTILINE) if s.strip()])
    return out


#: Schema migrations, version = position + 1 (see ``postgres_schema.sql``: append only).
MIGRATIONS = _load_migrations()
#: The schema version this module writes.
SCHEMA_VERSION = len(MIGRATIONS)

_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_URL_OPTIONS = (
    "schema", "min_size", "max_size", "timeout", "retry_attempts", "pipeline", "prepare_threshold", "ttl",
    "refresh_on_read",
)
_MODES = {Mode.UPSERT: "u", Mode.CREATE: "c", Mode.APPEND: "a", Mode.IF_MATCH: "i"}
_COLUMNS = "r.name, r.seq, r.etag, r.digest, r.tags, r.value"
_META_COLUMNS = "r.name, r.seq, r.etag, r.digest, r.tags, ''::bytea AS value"
#: SQLSTATE classes of errors a retry cannot fix although the driver calls them operational.
_PERMANENT_CLASSES = ("28", "3D", "42", "53100")

# -- errors ----------------------------------------------------------------------------


def _transient(exc: BaseException) -> bool:
    """Whether a driver error may go away on its own (connection loss, shutdown, a rollback)."""
    if isinstance(exc, PoolTimeout):  # the pool already waited its timeout for a connection
        return False
    if not isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError | psycopg.errors.TransactionRollback):
        return False
    state = getattr(exc, "sqlstate", None) or ""
    return not state.startswith(_PERMANENT_CLASSES)


class _translate_errors:  # noqa: N801 - used as a function: ``with _translate_errors(where):``
    """psycopg errors raised in the block become library errors, the driver's chained."""

    __slots__ = ("where",)

    def __init__(self, where: str) -> None:
        self.where = where

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> Literal[False]:
        if not isinstance(exc, psycopg.Error):
            return False
        detail = f"{type(exc).__name__}: {str(exc).strip()}"
        if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError | psycopg.errors.TransactionRollback):
            raise BackendUnavailableError(
                f"PostgreSQL {self.where} is unavailable ({detail}); check that the server is up and "
                f"reachable (transient errors were retried)"
            ) from exc
        raise CheckpointerError(
            f"PostgreSQL {self.where}: the server refused the operation ({detail}). This is not an "
            f"outage and retrying will not help: check the schema's privileges, or report a bug."
        ) from exc


# -- records ---------------------------------------------------------------------------


def _record(row: Sequence[Any]) -> Record:
    """The :class:`Record` of a ``name, seq, etag, digest, tags, value`` row."""
    name, seq, etag, digest, tags, value = row
    try:
        parsed = {} if tags == "{}" else json.loads(tags)
    except (TypeError, ValueError):
        parsed = None
    if type(parsed) is not dict or not all(type(v) is str for v in parsed.values()):
        raise CorruptItemError(str(name), f"the PostgreSQL row's tags are not a JSON object of strings: {tags!r}")
    return Record(name, bytes(value), parsed, etag, digest, int(seq))


def _written(put: Put, seq: int) -> Record:
    return Record(put.name, put.value, dict(put.tags), put.etag, put.digest, seq)


def _applied_before(puts: Sequence[Put], deletes: Sequence[Delete], stored: Sequence[Record | None]) -> bool:
    """After a retried write met a conflict: whether the lost attempt applied this very batch.

    Etags are unique per write: a stored record with a put's own etag was
    written by this batch (atomic, so all of it); a deleted name is absent.
    """
    puts_stored, deletes_stored = stored[: len(puts)], stored[len(puts) :]
    if any(rec is not None for rec in deletes_stored) or any(rec is None for rec in puts_stored):
        return False
    own = False
    for put, rec in zip(puts, puts_stored, strict=True):
        assert rec is not None  # checked above
        if rec.etag == put.etag:
            own = True
        elif not (put.mode is Mode.APPEND and content_digest(rec.digest) == content_digest(put.digest)):
            return False
    return own or not puts


def _text(value: str) -> str:
    """Injective ASCII form of any string (tag keys and values in the ``tags`` table): its JSON."""
    return _json_str(value)


def _name_range(prefix: str) -> tuple[str, str | None] | None:
    """``[prefix, upper)`` in byte order, or ``None`` when no ASCII name can start with ``prefix``."""
    if not prefix.isascii() or "\x00" in prefix:
        return None
    stripped = prefix.rstrip("\x7f")
    if not stripped:
        return prefix, None
    return prefix, stripped[:-1] + chr(ord(stripped[-1]) + 1)


# -- statements (pure) -----------------------------------------------------------------


def _live(s: str) -> str:
    """The term every read carries: the partition (its key, then the time: two parameters) has not expired."""
    return f"NOT EXISTS (SELECT 1 FROM {s}.partitions AS e WHERE e.pkey = %b AND e.expires_at <= %b)"


def _by_key(s: str, cols: str, name: str) -> str:
    """The record of the partition (a parameter) named ``name`` (a column of the outer query), for ``LATERAL``.

    Not joined: a join lets a planner that believes the partition holds
    about one row scan it once per outer row and filter on the name, where
    this subquery (kept apart by ``OFFSET 0``) can only look the key up.
    """
    return f"SELECT {cols} FROM {s}.records AS r WHERE r.pkey = %b AND r.name = {name} OFFSET 0"


def _get_op(s: str, partition: Partition, names: Sequence[str], now: float) -> _Op[builtins.list[Record | None]]:
    if not names:
        return []
    rows = yield _Stmt(
        f"SELECT r.* FROM unnest(%b::text[]) AS n (name) CROSS JOIN LATERAL ({_by_key(s, _COLUMNS, 'n.name')}) AS r "
        f"WHERE {_live(s)}",
        (builtins.list(names), partition.key, partition.key, now),
    )
    found = {row[0]: _record(row) for row in rows}
    return [found.get(n) for n in names]


class _Texts(builtins.list[str | None]):
    """A ``text[]`` parameter, dumped in one pass by :class:`_TextsDumper`."""


class _Bytes(builtins.list[bytes]):
    """A ``bytea[]`` parameter, dumped in one pass by :class:`_BytesDumper`."""


_ARRAY_HEAD = struct.Struct("!iiiii")  # dimensions (1), has NULLs, element type, length, lower bound (1)
_EMPTY_ARRAY_HEAD = struct.Struct("!iii")  # no dimensions: an empty array
_NULL_ELEMENT = (-1).to_bytes(4, "big", signed=True)
_TEXT, _BYTEA = psycopg.postgres.types["text"], psycopg.postgres.types["bytea"]


def _binary_array(items: Sequence[Any], element_oid: int, encode: Callable[[Any], bytes]) -> bytes:
    """PostgreSQL's binary form of a one-dimensional array (``array_recv``): the header, then each
    element as its length and bytes (-1 for NULL)."""
    if not items:
        return _EMPTY_ARRAY_HEAD.pack(0, 0, element_oid)
    parts: builtins.list[bytes] = []
    nulls = 0
    for item in items:
        if item is None:
            parts.append(_NULL_ELEMENT)
            nulls = 1
        else:
            data = encode(item)
            parts.append(len(data).to_bytes(4, "big", signed=True))
            parts.append(data)
    return _ARRAY_HEAD.pack(1, nulls, element_oid, len(items), 1) + b"".join(parts)


class _TextsDumper(psycopg.adapt.Dumper):
    """Dumps a :class:`_Texts` as a binary ``text[]``, in the connection's encoding.

    psycopg's generic list dumper inspects the elements of every list to pick
    their type and goes through several calls per array; a write batch sends
    twelve text or bytea arrays, and dumping its parameters takes about half
    the time this way (``docs/postgres.md``, "Where the time of a call goes").
    A connection whose adapters were customised before this module registered
    it dumps the list with psycopg's own dumper
    (``_Texts`` is a ``list``): the same bytes on the server.
    """

    format = psycopg.pq.Format.BINARY
    oid = _TEXT.array_oid

    def __init__(self, cls: type, context: Any = None) -> None:
        super().__init__(cls, context)
        self._encoding = self.connection.info.encoding if self.connection is not None else "utf-8"

    def dump(self, obj: Any) -> bytes:
        encoding = self._encoding
        return _binary_array(obj, _TEXT.oid, lambda text: text.encode(encoding))


class _BytesDumper(psycopg.adapt.Dumper):
    """Dumps a :class:`_Bytes` as a binary ``bytea[]``."""

    format = psycopg.pq.Format.BINARY
    oid = _BYTEA.array_oid

    def dump(self, obj: Any) -> bytes:
        return _binary_array(obj, _BYTEA.oid, bytes)


psycopg.adapters.register_dumper(_Texts, _TextsDumper)  # our own types only: nothing else is dumped differently
psycopg.adapters.register_dumper(_Bytes, _BytesDumper)


def _write_params(
    partition: Partition, puts: Sequence[Put], deletes: Sequence[Delete], times: tuple[float, float | None]
) -> builtins.list[Any]:
    tag_keys = _Texts()
    tag_values = _Texts()
    for put in puts:
        for k, v in put.tags.items():
            tag_keys.append(_text(k))
            tag_values.append(_text(v))
    return [
        partition.key,
        partition.user_key,
        partition.name.encode("utf-8", "surrogatepass"),
        *times,
        _Texts([p.name for p in puts]),
        _Texts([_MODES[p.mode] for p in puts]),
        _Texts([p.if_match for p in puts]),
        _Texts([p.etag for p in puts]),
        _Texts([p.digest for p in puts]),
        _Texts([content_digest(p.digest) for p in puts]),
        _Texts([tags_json(p.tags) for p in puts]),
        _Bytes([p.value for p in puts]),
        [len(p.tags) for p in puts],
        tag_keys,
        tag_values,
        _Texts([d.name for d in deletes]),
        _Texts([d.if_match for d in deletes]),
    ]


_WRITE_SQL = (
    "SELECT st, i, name, seq, etag, digest, tags, value FROM {s}.write_batch(%b, %b, %b, %b, %b, "
    "%b::text[], %b::text[], %b::text[], %b::text[], %b::text[], %b::text[], %b::text[], %b::bytea[], "
    "%b::int[], %b::text[], %b::text[], %b::text[], %b::text[])"
)


@functools.lru_cache(maxsize=64)
def _write_sql(s: str) -> str:
    """Schema ``s``'s write statement, one string object per schema.

    A cursor keeps its adapters (its ``Transformer``, with the dumpers it
    looked up) only while it runs the very query object it ran last, so the
    writes on one connection's cursor (:func:`_own_cursor`) dump their
    parameters with the dumpers of the previous write.
    """
    return _WRITE_SQL.format(s=s)


def _write_op(
    s: str,
    partition: Partition,
    puts: Sequence[Put],
    deletes: Sequence[Delete],
    retried: bool,
    times: tuple[float, float | None],
) -> _Op[WriteResult]:
    """One batch; ``times``: now and the expiry it sets (``None``: none), on the backend's clock."""
    check_batch(puts, deletes)
    if not puts and not deletes:
        return WriteResult(records=[])
    rows = yield _Stmt(_write_sql(s), _write_params(partition, puts, deletes, times))
    if rows and rows[0][0] == 1:
        _, index, name, seq, *_ = rows[0]
        if retried:  # an earlier attempt may have applied this batch before its reply was lost
            names = [p.name for p in puts] + [d.name for d in deletes]
            stored = yield from _get_op(s, partition, names, times[0])
            if _applied_before(puts, deletes, stored):
                return WriteResult(records=[r for r in stored[: len(puts)] if r is not None])
        existing = None if seq is None else _record(rows[0][2:])
        return WriteResult(records=[], conflict=Conflict(index, name, existing))
    by_index = {row[1]: row for row in rows}
    return WriteResult(
        records=[
            _written(put, by_index[i][3]) if by_index[i][0] == 0 else _record(by_index[i][2:])
            for i, put in enumerate(puts)
        ]
    )


def _list_where(
    s: str, alias: str, partition: Partition, query: ListQuery, now: float
) -> tuple[builtins.list[str], builtins.list[Any]]:
    """``WHERE`` terms on ``alias`` (records or tags rows) for partition (live at ``now``), prefix, depth and range."""
    where: builtins.list[str] = [f"{alias}.pkey = %b", _live(s)]
    params: builtins.list[Any] = [partition.key, partition.key, now]
    bounds = _name_range(query.prefix)
    assert bounds is not None  # checked by the caller
    if query.prefix:
        where.append(f"{alias}.name >= %b")
        params.append(bounds[0])
        if bounds[1] is not None:
            where.append(f"{alias}.name < %b")
            params.append(bounds[1])
    if query.depth is not None:  # the '/' in the name: the prefix's own plus ``depth``
        where.append(f"length({alias}.name) - length(replace({alias}.name, '/', '')) = %b")
        params.append(query.prefix.count("/") + query.depth)
    cast = "::text" if query.order == "name" else "::bigint"
    if query.start is not None:
        where.append(f"{alias}.{query.order} >= %b{cast}")
        params.append(query.start)
    if query.stop is not None:
        where.append(f"{alias}.{query.order} < %b{cast}")
        params.append(query.stop)
    return where, params


#: Above every name (names are ASCII, see :mod:`.base`): the upper end of a name range that has none.
_ABOVE_NAMES = "\x80"
#: The seqs of a seq range that has no lower or upper end (bigint).
_FIRST_SEQ, _LAST_SEQ = -(2**63), 2**63 - 1


def _walk_sql(s: str, partition: Partition, query: ListQuery, now: float) -> tuple[str, builtins.list[Any]]:
    """A limited read without tags or with one: ``pick_records`` or ``pick_tagged`` (migration 6)
    walks the index in the query's order to the limit.

    Whatever the planner believes of the partition's size, the walk reads
    the limit's entries and those its filters skip, never the whole range.
    """
    bounds = _name_range(query.prefix)
    assert bounds is not None  # checked by the caller
    low, high = bounds
    first, last = _FIRST_SEQ, _LAST_SEQ
    if query.order == "name":
        if query.start is not None:
            low = max(low, str(query.start))
        if query.stop is not None:
            high = str(query.stop) if high is None else min(high, str(query.stop))
    else:
        if query.start is not None:
            first = int(query.start)
        if query.stop is not None:
            last = int(query.stop) - 1
    slashes = None if query.depth is None else query.prefix.count("/") + query.depth
    walk: builtins.list[Any] = [partition.key]
    pick = "pick_records(%b, "
    if query.tags:
        ((k, v),) = query.tags.items()
        walk += [_text(k), _text(v)]
        pick = "pick_tagged(%b, %b, %b, "
    walk += [low, _ABOVE_NAMES if high is None else high, slashes, query.order == "seq", first, last]
    sql = (
        f"SELECT {_COLUMNS} FROM {s}.{pick}%b, %b, %b::int, %b, %b::bigint, %b::bigint, %b::bigint, %b, %b) "
        f"WITH ORDINALITY AS r (name, seq, etag, digest, tags, value, i) WHERE {_live(s)} ORDER BY r.i"
    )
    return sql, [*walk, query.limit, query.descending, query.values, partition.key, now]


def _pick_sql(s: str, partition: Partition, query: ListQuery, now: float) -> tuple[str, builtins.list[Any]]:
    """The ``SELECT`` of the records ``query`` selects, ordered and limited, every filter in SQL."""
    cols = _COLUMNS if query.values else _META_COLUMNS
    direction = "DESC" if query.descending else "ASC"
    if query.limit is not None and len(query.tags) <= 1:
        return _walk_sql(s, partition, query, now)
    if not query.tags:
        where, params = _list_where(s, "r", partition, query, now)
        if query.order == "seq":
            where[0] = "(r.pkey || '') = %b"  # the key of records_seq, and of no other index
        sql = f"SELECT {cols} FROM {s}.records AS r WHERE {' AND '.join(where)} ORDER BY r.{query.order} {direction}"
    else:
        # walk the first tag's index in the query's order; the others are checked per row
        (k0, v0), *others = query.tags.items()
        where, params = _list_where(s, "t", partition, query, now)
        where += ["t.k = %b", "t.v = %b"]
        params += [_text(k0), _text(v0)]
        for k, v in others:
            where.append(
                f"EXISTS (SELECT 1 FROM {s}.tags AS o WHERE o.pkey = t.pkey AND o.name = t.name "
                "AND o.k = %b AND o.v = %b)"
            )
            params += [_text(k), _text(v)]
        sql = (
            f"SELECT r.* FROM {s}.tags AS t CROSS JOIN LATERAL ({_by_key(s, cols, 't.name')}) AS r "
            f"WHERE {' AND '.join(where)} ORDER BY t.{query.order} {direction}"
        )
        params.insert(0, partition.key)  # _by_key's
    if query.limit is not None:
        sql += " LIMIT %b"
        params.append(query.limit)
    return sql, params


def _list_op(s: str, partition: Partition, query: ListQuery, now: float) -> _Op[builtins.list[Record]]:
    if query.order not in ("name", "seq"):
        raise ValueError(f"ListQuery.order must be 'name' or 'seq', got {query.order!r}")
    if _name_range(query.prefix) is None or query.limit == 0:
        return []  # names are ASCII: nothing starts with this prefix
    sql, params = _pick_sql(s, partition, query, now)
    if not query.children:
        picks = [_record(row) for row in (yield _Stmt(sql, params))]
        _check_tagged(query, picks)
        return picks
    cols = _COLUMNS if query.values else _META_COLUMNS
    rows = yield _Stmt(
        f"WITH p AS MATERIALIZED ({sql}) "
        "SELECT 0, p.name, p.* FROM p UNION ALL "
        f"SELECT 1, p.name, c.* FROM p CROSS JOIN LATERAL (SELECT {cols} FROM {s}.records AS r "
        "WHERE r.pkey = %b AND r.name >= p.name || '/' AND r.name < p.name || '0' OFFSET 0) AS c",
        (*params, partition.key),
    )
    return _with_children(query, rows)


def _with_children(query: ListQuery, rows: _Rows) -> builtins.list[Record]:
    """Picks in the query's order, each followed by its children in name order."""
    picks = sorted((_record(r[2:]) for r in rows if r[0] == 0), key=query.sort_key, reverse=query.descending)
    _check_tagged(query, picks)
    children: dict[str, builtins.list[Record]] = {}
    for r in rows:
        if r[0] == 1:
            children.setdefault(r[1], []).append(_record(r[2:]))
    out: builtins.list[Record] = []
    for pick in picks:
        out.append(pick)
        out.extend(sorted(children.get(pick.name, ()), key=lambda c: c.name))
    return out


def _check_tagged(query: ListQuery, picks: Sequence[Record]) -> None:
    """Every record a tag query found through the ``tags`` table carries those tags in its own row."""
    for rec in picks:
        if any(rec.tags.get(k) != v for k, v in query.tags.items()):
            raise CorruptItemError(rec.name, "the PostgreSQL tags table lists it under tags its own row does not carry")


def _partitions_op(s: str, user: str, space: str, now: float) -> _Op[builtins.list[str]]:
    user_key = Partition(user, space, "").user_key
    rows = yield _Stmt(
        f"SELECT p.pkey, p.name FROM {s}.partitions AS p WHERE p.user_key = %b "
        "AND (p.expires_at IS NULL OR p.expires_at > %b)",
        (user_key, now),
    )
    names: builtins.list[str] = []
    for pkey, raw in rows:
        try:
            name: str | None = bytes(raw).decode("utf-8", "surrogatepass")
        except UnicodeDecodeError:
            name = None
        if name is None or Partition(user, space, name).key != pkey:
            raise CorruptItemError(str(pkey), "the PostgreSQL partitions row does not name the partition of its key")
        names.append(name)
    return sorted(names)


def _sweep_op(s: str, now: float, limit: int) -> _Op[int]:
    """Up to ``limit`` expired partitions deleted in one statement.

    Rows a writer holds are skipped (``SKIP LOCKED``), and a locked row is
    re-checked on its newest version: a write that refreshed the expiry
    meanwhile keeps its partition.
    """
    rows = yield _Stmt(
        f"WITH due AS (SELECT p.pkey FROM {s}.partitions AS p WHERE p.expires_at <= %b "
        "ORDER BY p.expires_at LIMIT %b FOR UPDATE SKIP LOCKED), "
        f"gone AS (DELETE FROM {s}.partitions AS p USING due WHERE p.pkey = due.pkey AND p.expires_at <= %b "
        "RETURNING p.pkey), "
        f"t AS (DELETE FROM {s}.tags AS t USING gone WHERE t.pkey = gone.pkey), "
        f"r AS (DELETE FROM {s}.records AS r USING gone WHERE r.pkey = gone.pkey) "
        "SELECT count(*) FROM gone",
        (now, limit, now),
    )
    return int(rows[0][0])


def _expired_op(s: str, now: float, limit: int) -> _Op[builtins.list[ExpiredPartition]]:
    rows = yield _Stmt(
        f"SELECT p.pkey, p.user_key, p.name, p.expires_at FROM {s}.partitions AS p WHERE p.expires_at <= %b "
        "ORDER BY p.expires_at LIMIT %b",
        (now, limit),
    )
    return [
        ExpiredPartition(str(pk), str(uk), bytes(raw).decode("utf-8", "surrogatepass"), float(at))
        for pk, uk, raw, at in rows
    ]


def _users_op(s: str, now: float, space: str | None) -> _Op[builtins.list[str]]:
    rows = yield _Stmt(
        f"SELECT DISTINCT p.user_key FROM {s}.partitions AS p WHERE p.expires_at IS NULL OR p.expires_at > %b",
        (now,),
    )
    return users_of((str(r[0]) for r in rows), space)


def _expiry_op(s: str, partition: Partition) -> _Op[float | None]:
    rows = yield _Stmt(f"SELECT p.expires_at FROM {s}.partitions AS p WHERE p.pkey = %b", (partition.key,))
    return None if not rows or rows[0][0] is None else float(rows[0][0])


def _refresh_op(s: str, partition: Partition, now: float, ttl: float) -> _Op[None]:
    """Push a read partition's expiry back, if it is live and under half the ttl is left (one UPDATE)."""
    yield _Stmt(
        f"UPDATE {s}.partitions AS p SET expires_at = %b WHERE p.pkey = %b AND p.expires_at > %b "
        "AND p.expires_at < %b",
        (now + ttl, partition.key, now, now + ttl / 2),
    )
    return None


def _drop_op(s: str, partition: Partition) -> _Op[int]:
    rows = yield _Stmt(f"SELECT {s}.drop_partition(%b)", (partition.key,))
    return int(rows[0][0])


def _migrate_op(s: str) -> _Op[int]:
    """Apply the missing migrations (run inside one transaction); returns the version found first."""
    rows = yield _Stmt("SELECT to_regclass(%b)", (f"{s}.schema_migrations",))
    if rows[0][0] is not None:
        (version,) = (yield _Stmt(f"SELECT coalesce(max(v), 0) FROM {s}.schema_migrations"))[0]
        if version == SCHEMA_VERSION:
            return int(version)
    yield _Stmt("SELECT pg_advisory_xact_lock(hashtextextended(%b, 0))", (f"checkpointers.migrate.{s}",))
    yield _Stmt(f"CREATE SCHEMA IF NOT EXISTS {s}")
    yield _Stmt(f"CREATE TABLE IF NOT EXISTS {s}.schema_migrations (v int PRIMARY KEY, at timestamptz DEFAULT now())")
    (version,) = (yield _Stmt(f"SELECT coalesce(max(v), 0) FROM {s}.schema_migrations"))[0]
    if version > SCHEMA_VERSION:
        raise CheckpointerError(
            f"the PostgreSQL schema {s!r} has version {version}, newer than this release understands "
            f"({SCHEMA_VERSION}); upgrade checkpointers to use it"
        )
    for v in range(version + 1, SCHEMA_VERSION + 1):
        for statement in MIGRATIONS[v - 1]:
            yield _Stmt(statement.replace("@schema", s))
        yield _Stmt(f"INSERT INTO {s}.schema_migrations (v) VALUES (%b)", (v,))
    return int(version)


def _start(op: _Op[T]) -> tuple[Any, T | None]:
    """The first statement of ``op``, or its result if it needs none."""
    try:
        return next(op), None
    except StopIteration as stop:
        return None, stop.value


def _step(op: _Op[T], rows: Any) -> tuple[Any, T | None]:
    """Hand ``rows`` to ``op``: its next statement, or its result."""
    try:
        return op.send(rows), None
    except StopIteration as stop:
        return None, stop.value


#: Operations :meth:`PostgresBackend.many` may send in one pipeline (reads).
_READS = (GetOp, ListOp, PartitionsOp)


# -- the backend -------------------------------------------------------------------------


class PostgresBackend(Backend):
    """Records in PostgreSQL tables, shared by any number of threads, processes and hosts.

    ``conninfo`` is a libpq connection string or URL, or a caller's
    connection or pool (:data:`Connectable`, see "Existing connections" in
    the module docstring; ``min_size``/``max_size``/``prepare_threshold`` are
    then the caller's). ``schema`` names the
    PostgreSQL schema holding the tables (created if missing; lowercase
    letters, digits, ``_``). ``min_size`` / ``max_size`` size each pool (one
    sync, one per event loop used); ``timeout`` bounds the wait for a
    connection; ``retry_attempts`` and ``retry_backoff`` bound the retries of
    transient errors (see the module docstring); ``pipeline=False`` sends the
    reads of :meth:`many` one by one; ``prepare_threshold`` is psycopg's (``0``:
    statements prepared on the server from their first use; ``None``: never,
    for a pooler that cannot track prepared statements).

    Nothing connects until the first operation (or :meth:`migrate`), which
    also creates or migrates the schema.
    """

    kind = "postgres"
    #: One more condition costs nothing: ``write_batch`` checks every condition
    #: of a batch in its one transaction, under the partition's lock (an
    #: unchanged ``IF_MATCH`` re-put is checked and kept, not rewritten), so a
    #: write without a lease carries its guard instead of reading it first.
    inline_conditions = True

    def __init__(
        self,
        conninfo: str | Connectable = "",
        *,
        schema: str = "checkpointers",
        min_size: int = 1,
        max_size: int = 8,
        timeout: float = 10.0,
        retry_attempts: int = 4,
        retry_backoff: float = 0.05,
        pipeline: bool = True,
        prepare_threshold: int | None = 0,
        ttl: float | None = None,
        refresh_on_read: bool = False,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self._set_retention(ttl, refresh_on_read, clock)
        if not _SCHEMA_NAME.fullmatch(schema):
            raise ValueError(
                f"schema must be 1-63 lowercase letters, digits or '_', not starting with a digit; got {schema!r}"
            )
        if timeout <= 0 or retry_attempts < 0 or not 0 < min_size <= max_size:
            raise ValueError("need timeout > 0, retry_attempts >= 0 and 0 < min_size <= max_size")
        self.conninfo = conninfo if isinstance(conninfo, str) else ""
        self.schema, self.timeout, self.prepare_threshold = schema, float(timeout), prepare_threshold
        self.min_size, self.max_size, self.pipeline = min_size, max_size, pipeline
        self._given: _Shared | _ASharedSource | None = _shared(conninfo)
        self.retry_attempts, self.retry_backoff = retry_attempts, retry_backoff
        self._where = f"schema {schema!r}"
        self._lock = threading.Lock()
        self._pool: ConnectionPool | None = None
        self._loops: dict[asyncio.AbstractEventLoop, _LoopConnections] = {}
        self._ready = False
        self._closed = False

    @classmethod
    def from_url(cls, url: str, **options: Any) -> PostgresBackend:
        """Open ``postgresql://user@host:5432/db?schema=x`` (``postgres://`` too).

        Query options :data:`_URL_OPTIONS` (``schema``, ``min_size``,
        ``max_size``, ``timeout``, ``retry_attempts``, ``pipeline``,
        ``prepare_threshold`` (a number or ``none``)) are the
        backend's; every other one (``sslmode``, ``connect_timeout``,
        ``application_name``...) is passed to libpq. Keyword ``options``
        override the URL's.
        """
        parts = urlsplit(url)
        if parts.scheme not in ("postgresql", "postgres"):
            raise ValueError(f"not a postgresql:// URL: {url!r}")
        ours: dict[str, Any] = {}
        libpq: builtins.list[tuple[str, str]] = []
        for key, value in parse_qsl(parts.query, keep_blank_values=True):
            (ours.__setitem__(key, value) if key in _URL_OPTIONS else libpq.append((key, value)))
        for key in ("min_size", "max_size", "retry_attempts"):
            if key in ours:
                ours[key] = int(ours[key])
        if "timeout" in ours:
            ours["timeout"] = float(ours["timeout"])
        if "pipeline" in ours:
            ours["pipeline"] = url_flag("pipeline", ours["pipeline"])
        if "prepare_threshold" in ours:
            raw = ours["prepare_threshold"].strip().lower()
            ours["prepare_threshold"] = None if raw in ("none", "") else int(raw)
        ours.update(retention_options(ours))
        ours.update(options)
        return cls(urlunsplit(parts._replace(query=urlencode(libpq))), **ours)

    # -- the five operations: one line each, the statements are the functions above --

    def get(self, partition: Partition, names: Sequence[str]) -> builtins.list[Record | None]:
        found = self._run(lambda retried: _get_op(self.schema, partition, names, self.retention.now()))
        self._read(partition)
        return found

    def write(self, partition: Partition, puts: Sequence[Put], deletes: Sequence[Delete] = ()) -> WriteResult:
        result = self._run(lambda retried: _write_op(self.schema, partition, puts, deletes, retried, self._times()))
        self._auto_sweep()
        return result

    def partitions(self, user: str, space: str) -> builtins.list[str]:
        return self._run(lambda retried: _partitions_op(self.schema, user, space, self.retention.now()))

    def _times(self) -> tuple[float, float | None]:
        """A write's now and the expiry it sets, on this backend's clock."""
        now = self.retention.now()
        return now, self.retention.deadline(now)

    def _read(self, partition: Partition) -> None:
        """After a read, with ``refresh_on_read``: one conditional UPDATE of the expiry."""
        ttl = self.retention.ttl
        if self.retention.refresh_on_read and ttl is not None:
            self._run(lambda retried: _refresh_op(self.schema, partition, self.retention.now(), ttl))

    async def _aread(self, partition: Partition) -> None:
        """Async :meth:`_read`."""
        ttl = self.retention.ttl
        if self.retention.refresh_on_read and ttl is not None:
            await self._arun(lambda retried: _refresh_op(self.schema, partition, self.retention.now(), ttl))

    # -- retention (see .base) -----------------------------------------------------------

    def sweep(self, limit: int = 1000) -> int:
        return self._run(lambda retried: _sweep_op(self.schema, self.retention.now(), limit))

    async def asweep(self, limit: int = 1000) -> int:
        return await self._arun(lambda retried: _sweep_op(self.schema, self.retention.now(), limit))

    def expired(self, limit: int = 1000) -> builtins.list[ExpiredPartition]:
        return self._run(lambda retried: _expired_op(self.schema, self.retention.now(), limit))

    async def aexpired(self, limit: int = 1000) -> builtins.list[ExpiredPartition]:
        return await self._arun(lambda retried: _expired_op(self.schema, self.retention.now(), limit))

    def users(self, space: str | None = None) -> builtins.list[str]:
        return self._run(lambda retried: _users_op(self.schema, self.retention.now(), space))

    async def ausers(self, space: str | None = None) -> builtins.list[str]:
        return await self._arun(lambda retried: _users_op(self.schema, self.retention.now(), space))

    def expiry(self, partition: Partition) -> float | None:
        return self._run(lambda retried: _expiry_op(self.schema, partition))

    async def aexpiry(self, partition: Partition) -> float | None:
        return await self._arun(lambda retried: _expiry_op(self.schema, partition))

    def drop(self, partition: Partition) -> int:
        return self._run(lambda retried: _drop_op(self.schema, partition))

    async def aget(self, partition: Partition, names: Sequence[str]) -> builtins.list[Record | None]:
        found = await self._arun(lambda retried: _get_op(self.schema, partition, names, self.retention.now()))
        await self._aread(partition)
        return found

    async def awrite(self, partition: Partition, puts: Sequence[Put], deletes: Sequence[Delete] = ()) -> WriteResult:
        result = await self._arun(
            lambda retried: _write_op(self.schema, partition, puts, deletes, retried, self._times())
        )
        await self._aauto_sweep()
        return result

    async def apartitions(self, user: str, space: str) -> builtins.list[str]:
        return await self._arun(lambda retried: _partitions_op(self.schema, user, space, self.retention.now()))

    async def adrop(self, partition: Partition) -> int:
        return await self._arun(lambda retried: _drop_op(self.schema, partition))

    def migrate(self) -> int:
        """Create or migrate the schema now (idempotent); returns the version found before."""
        version = self._run(lambda retried: _migrate_op(self.schema), transaction=True, setup=False)
        self._ready = True
        return version

    async def amigrate(self) -> int:
        """Async :meth:`migrate`."""
        version = await self._arun(lambda retried: _migrate_op(self.schema), transaction=True, setup=False)
        self._ready = True
        return version

    # -- sync execution ------------------------------------------------------------------

    def _sync_pool(self) -> ConnectionPool | _Shared:
        with self._lock:
            if self._closed:
                raise BackendUnavailableError(f"PostgresBackend({self._where}) is closed; open a new one")
            if isinstance(self._given, _ASharedSource):
                raise CheckpointerError(
                    f"PostgresBackend({self._where}) was given an async connection or pool: use the async "
                    "methods (aget_tuple, aput...), or give it a psycopg.Connection or ConnectionPool"
                )
            if self._given is not None:
                return self._given
            if self._pool is None:
                # Opened with its first connection ready: a first call that waited would make the pool grow
                # to two, and psycopg_pool hands idle connections out oldest first, so one thread's calls
                # would alternate between two server processes, each with its caches cold (docs/postgres.md).
                pool = ConnectionPool(self.conninfo, **self._pool_options(), open=False)
                try:
                    pool.open(wait=True, timeout=self.timeout)
                except BaseException:
                    pool.close()
                    raise
                self._pool = pool
            return self._pool

    def _pool_options(self) -> dict[str, Any]:
        return {
            "min_size": self.min_size,
            "max_size": self.max_size,
            "timeout": self.timeout,
            "kwargs": {"autocommit": True, "prepare_threshold": self.prepare_threshold},
            "name": f"checkpointers-{self.schema}",
        }

    def _run(self, make: Callable[[bool], _Op[T]], transaction: bool = False, setup: bool = True) -> T:
        """Run the operation ``make(retried)`` builds, retrying transient errors (a fresh op each time)."""
        if setup and not self._ready:
            self.migrate()
        with _translate_errors(self._where):
            for attempt in range(self.retry_attempts + 1):
                pool: ConnectionPool | _Shared | None = None
                try:
                    pool = self._sync_pool()  # opening it is retried as a call is
                    with pool.connection() as conn:
                        if not transaction and conn.autocommit:
                            return _drive(conn, make(attempt > 0))
                        with conn.transaction():  # a caller's connection without autocommit: one per operation
                            return _drive(conn, make(attempt > 0))
                except psycopg.Error as exc:
                    delay = self._delay(exc, attempt)
                if pool is not None:
                    pool.check()  # drop the idle connections a restart or a network cut left dead
                time.sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover - the last attempt returns or raises

    def _delay(self, exc: psycopg.Error, attempt: int) -> float:
        """Seconds before retry ``attempt`` (0-based), or re-raise ``exc`` when it is not worth one."""
        if not _transient(exc) or attempt >= self.retry_attempts:
            raise exc
        return self.retry_backoff * 2.0**attempt * (0.5 + random.random() / 2)

    # -- async execution -----------------------------------------------------------------

    def _async_pool(self) -> _LoopConnections | _ASharedSource:
        """This event loop's connections (those of loops that have closed are let go), or the caller's."""
        if self._closed:
            raise BackendUnavailableError(f"PostgresBackend({self._where}) is closed; open a new one")
        if isinstance(self._given, _ASharedSource):
            return self._given
        loop = asyncio.get_running_loop()
        conns = self._loops.get(loop)
        if conns is None:
            for old in [lp for lp in self._loops if lp.is_closed()]:
                self._loops.pop(old).finish()
            conns = self._loops[loop] = _LoopConnections(
                self.conninfo, self.max_size, self.timeout, self.prepare_threshold
            )
        return conns

    async def _arun(self, make: Callable[[bool], _Op[T]], transaction: bool = False, setup: bool = True) -> T:
        """Async :meth:`_run` (on a caller's sync connection or pool: :meth:`_run` in a worker thread)."""
        if isinstance(self._given, _Shared):
            return await asyncio.to_thread(self._run, make, transaction, setup)
        if setup and not self._ready:
            await self.amigrate()
        with _translate_errors(self._where):
            for attempt in range(self.retry_attempts + 1):
                pool = self._async_pool()
                try:
                    async with pool.connection() as conn:
                        if not transaction and conn.autocommit:
                            return await _adrive(conn, make(attempt > 0))
                        async with conn.transaction():
                            return await _adrive(conn, make(attempt > 0))
                except psycopg.Error as exc:
                    delay = self._delay(exc, attempt)
                pool.finish()  # drop the idle connections a restart or a network cut left dead
                await asyncio.sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover

    # -- many: independent reads in one pipeline -------------------------------------------

    def _reads(self, ops: Sequence[Any]) -> builtins.list[_Op[Any]] | None:
        """The operations of ``ops`` as statements' generators, if all are reads worth a pipeline."""
        if not self.pipeline or len(ops) < 2 or not all(isinstance(op, _READS) for op in ops):
            return None
        out: builtins.list[_Op[Any]] = []
        for op in ops:
            now = self.retention.now()
            if isinstance(op, GetOp):
                out.append(_get_op(self.schema, op.partition, op.names, now))
            elif isinstance(op, ListOp):
                out.append(_list_op(self.schema, op.partition, op.query, now))
            else:
                out.append(_partitions_op(self.schema, op.user, op.space, now))
        return out

    def many(self, ops: Sequence[Any]) -> builtins.list[Any]:
        """Independent reads in one psycopg pipeline (one round trip); anything else one by one."""
        if self._reads(ops) is None:
            return super().many(ops)
        results = self._run(lambda retried: _parallel(self._reads(ops) or []))
        for partition in read_partitions(ops) if self.retention.refresh_on_read else ():
            self._read(partition)
        return results

    async def amany(self, ops: Sequence[Any]) -> builtins.list[Any]:
        """Async :meth:`many`: reads pipelined, anything else concurrently."""
        if self._reads(ops) is None:
            return await super().amany(ops)
        results = await self._arun(lambda retried: _parallel(self._reads(ops) or []))
        for partition in read_partitions(ops) if self.retention.refresh_on_read else ():
            await self._aread(partition)
        return results

    # -- lifecycle -----------------------------------------------------------------------

    def close(self) -> None:
        """Close the sync pool and every idle async connection (idempotent); a caller's connection stays open."""
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
            loops, self._loops = self._loops, {}
        for conns in loops.values():
            conns.finish()
        if pool is not None:
            pool.close()

    async def aclose(self) -> None:
        """:meth:`close`, without blocking the event loop on the sync pool's threads."""
        if self._pool is not None:
            await asyncio.to_thread(self.close)
        self.close()

    def __repr__(self) -> str:
        return f"PostgresBackend({self._where})"

    # (list and alist come last: below them, ``list`` in this class body names the method)

    def list(self, partition: Partition, query: ListQuery) -> builtins.list[Record]:
        found = self._run(lambda retried: _list_op(self.schema, partition, query, self.retention.now()))
        self._read(partition)
        return found

    async def alist(self, partition: Partition, query: ListQuery) -> builtins.list[Record]:
        found = await self._arun(lambda retried: _list_op(self.schema, partition, query, self.retention.now()))
        await self._aread(partition)
        return found


# -- the async face's connections ------------------------------------------------------------


class _LoopConnections:
    """The async connections of one event loop: idle ones kept, at most ``size`` open, no background task.

    A connection is opened when none is idle and handed back after use unless
    it is broken or inside a transaction. Nothing runs between calls, so the
    loop may end at any time (``finish`` then closes the idle sockets).
    """

    def __init__(self, conninfo: str, size: int, timeout: float, prepare_threshold: int | None) -> None:
        self.conninfo, self.size, self.timeout, self.prepare_threshold = conninfo, size, timeout, prepare_threshold
        self.idle: builtins.list[psycopg.AsyncConnection[Any]] = []
        self.slots = asyncio.Semaphore(size)

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        if not self.slots.locked():  # a slot is free: taken at once (wait_for would run a task for it, ~10 us)
            await self.slots.acquire()
        else:
            try:
                await asyncio.wait_for(self.slots.acquire(), self.timeout)
            except asyncio.TimeoutError:  # not the builtin before Python 3.11
                raise PoolTimeout(f"no connection free within {self.timeout} s ({self.size} in use)") from None
        conn: psycopg.AsyncConnection[Any] | None = None
        try:
            conn = self.idle.pop() if self.idle else await self._connect()
            yield conn
        finally:
            self.slots.release()
            if conn is not None:
                self._hand_back(conn)

    async def _connect(self) -> psycopg.AsyncConnection[Any]:
        connect = psycopg.AsyncConnection.connect(
            self.conninfo, autocommit=True, prepare_threshold=self.prepare_threshold
        )
        try:
            return await asyncio.wait_for(connect, self.timeout)
        except asyncio.TimeoutError:  # not the builtin before Python 3.11
            raise PoolTimeout(f"could not connect within {self.timeout} s") from None

    def _hand_back(self, conn: psycopg.AsyncConnection[Any]) -> None:
        idle = conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        if idle and not conn.broken and len(self.idle) < self.size:
            self.idle.append(conn)
        else:
            conn.pgconn.finish()

    def finish(self) -> None:
        """Close the idle connections (sockets only: no round trip, no event loop needed)."""
        idle, self.idle = self.idle, []
        for conn in idle:
            conn.pgconn.finish()


# -- a caller's connection or pool ------------------------------------------------------------


class _Shared:
    """A caller's sync connection or pool, used as the backend's pool (never closed by it)."""

    def __init__(self, conn: psycopg.Connection[Any] | ConnectionPool) -> None:
        self.conn = conn
        self._lock = threading.Lock()  # one operation at a time on one connection

    @contextlib.contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        if isinstance(self.conn, ConnectionPool):
            with self.conn.connection() as conn:
                yield conn
        else:
            with self._lock:
                yield self.conn

    def check(self) -> None:
        """After a failure: let a pool drop its dead idle connections (a lone connection stays as it is)."""
        if isinstance(self.conn, ConnectionPool):
            self.conn.check()


class _ASharedSource:
    """A caller's async connection or pool, used as the backend's per-loop connections."""

    def __init__(self, conn: psycopg.AsyncConnection[Any] | AsyncConnectionPool) -> None:
        self.conn = conn
        self._lock: asyncio.Lock | None = None

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        if isinstance(self.conn, AsyncConnectionPool):
            async with self.conn.connection() as conn:
                yield conn
            return
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:  # one operation at a time on one connection
            yield self.conn

    def finish(self) -> None:
        """Nothing to drop: a pool checks what it gets back, a lone connection is the caller's."""


def _shared(conn: str | Connectable) -> _Shared | _ASharedSource | None:
    """The source a caller's connection or pool makes (``None`` for a conninfo string)."""
    if isinstance(conn, str):
        return None
    if isinstance(conn, psycopg.Connection | ConnectionPool):
        return _Shared(conn)
    if isinstance(conn, psycopg.AsyncConnection | AsyncConnectionPool):
        return _ASharedSource(conn)
    raise TypeError(
        "PostgresBackend takes a conninfo string or URL, a psycopg (Async)Connection or a psycopg_pool "
        f"(Async)ConnectionPool, not {type(conn).__name__}"
    )


# -- drivers: run an operation's statements on one connection ------------------------------


def _drive(conn: psycopg.Connection[Any], op: _Op[T]) -> T:
    stmt, result = _start(op)
    while stmt is not None:
        if isinstance(stmt, _Batch):
            with conn.pipeline():
                cursors = [_cursor(conn).execute(s.sql, s.params, binary=True) for s in stmt.statements]
            rows: Any = [_fetched(cur) for cur in cursors]
        else:
            rows = _fetched(_own_cursor(conn).execute(stmt.sql, stmt.params, binary=True))
        stmt, result = _step(op, rows)
    return result  # type: ignore[return-value]


async def _adrive(conn: psycopg.AsyncConnection[Any], op: _Op[T]) -> T:
    stmt, result = _start(op)
    while stmt is not None:
        if isinstance(stmt, _Batch):
            async with conn.pipeline():
                cursors = [await _acursor(conn).execute(s.sql, s.params, binary=True) for s in stmt.statements]
            rows: Any = [await _afetched(cur) for cur in cursors]
        else:
            rows = await _afetched(await _own_cursor(conn).execute(stmt.sql, stmt.params, binary=True))
        stmt, result = _step(op, rows)
    return result  # type: ignore[return-value]


#: The attribute of a connection holding the backend's cursor of it (see :func:`_own_cursor`).
_OWN_CURSOR = "_checkpointers_cursor"


def _own_cursor(conn: Any) -> Any:
    """The connection's cursor of tuple rows (whatever row factory a caller's connection has), made once.

    Reused by every single statement on that connection (one operation at a
    time uses a connection), so a statement run again, as the write is
    (:func:`_write_sql`), keeps its dumpers: a new cursor per statement
    looked up and built a dumper for each of a write's seventeen parameters
    again. A pipeline's statements each take a new cursor (:func:`_cursor`).
    """
    cur = getattr(conn, _OWN_CURSOR, None)
    if cur is None or cur.closed:
        cur = _cursor(conn)
        setattr(conn, _OWN_CURSOR, cur)
    return cur


def _cursor(conn: psycopg.Connection[Any]) -> psycopg.Cursor[Any]:
    """A new cursor of tuple rows, whatever row factory a caller's connection has."""
    return conn.cursor(row_factory=tuple_row)


def _acursor(conn: psycopg.AsyncConnection[Any]) -> psycopg.AsyncCursor[Any]:
    return conn.cursor(row_factory=tuple_row)


def _returned_rows(cur: psycopg.Cursor[Any] | psycopg.AsyncCursor[Any]) -> bool:
    """Whether the statement returned rows (DDL returns none), read off its result's status.

    ``cur.description`` would answer too, but builds a column object per
    column on every call (~7 us a statement).
    """
    result = cur.pgresult
    return result is not None and result.status == psycopg.pq.ExecStatus.TUPLES_OK


def _fetched(cur: psycopg.Cursor[Any]) -> _Rows:
    """The rows of a statement (none for DDL)."""
    return cur.fetchall() if _returned_rows(cur) else []


async def _afetched(cur: psycopg.AsyncCursor[Any]) -> _Rows:
    return await cur.fetchall() if _returned_rows(cur) else []


def _parallel(ops: Sequence[_Op[Any]]) -> _Op[builtins.list[Any]]:
    """Run independent operations: their first statements in one pipeline, any later ones in turn."""
    started = [_start(op) for op in ops]
    pending = [i for i, (stmt, _) in enumerate(started) if stmt is not None]
    results = [result for _, result in started]
    if pending:
        batch = _Batch(tuple(started[i][0] for i in pending))
        replies: Any = yield batch
        for i, rows in zip(pending, replies, strict=True):
            stmt, results[i] = _step(ops[i], rows)
            while stmt is not None:  # not one of the reads of many(): each has one statement
                stmt, results[i] = _step(ops[i], (yield stmt))
    return results
