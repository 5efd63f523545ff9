"""Redis / Valkey 7+ backend: plain data structures, no modules, Cluster-ready.

Key layout
==========

Every key of one partition carries the partition's key as a Redis Cluster
hash tag, so all of them live in one slot and one Lua script can touch them
all (``P`` is the backend's ``prefix``, ``pk`` the :attr:`Partition.key`,
which only uses ``[A-Za-z0-9_%/-]``, never a brace)::

    P:{pk}:r      hash    "m:<name>" -> metadata, "v:<name>" -> value bytes
    P:{pk}:n      zset    every name, score 0          (name order, ZRANGEBYLEX)
    P:{pk}:x      zset    "<anc>|<seq16>|<name>"       (seq order, per ancestor)
    P:{pk}:t      zset    "s<tag>|<seq16>|<name>", "n<tag>|<name>"  (tag indexes)
    P:{pk}:seq    string  the partition's sequence counter (INCR)
    P:{<user_key>}:parts  hash  pk -> raw partition name (the user's registry)

* Metadata is ``seq \\n etag \\n digest \\n <tag pairs> \\n <tags JSON>``.
* ``<tag>`` is ``encode_component(k) + "=" + encode_component(v)``: tag keys
  and values are arbitrary strings, their encodings only use
  ``[A-Za-z0-9_%-]``, so they can break neither the member layout nor a key.
* ``<anc>`` is ``""`` (every record) and each of the first two
  ``/``-terminated prefixes of the name (``c/``, ``c/_ns/``). A query in
  seq order for a prefix uses the longest such ancestor of the prefix, so
  ``list(prefix="c/_ns/", order="seq", descending=True, limit=1)`` reads one
  member whatever the history length. Deeper prefixes (a checkpoint's
  writes) are listed in name order by every face; a seq-order query on one
  reads the names under it and sorts them, or walks the ancestor's index,
  whichever the counts say is cheaper. Every index member costs every
  write, so only these two levels are kept.
* ``<seq16>`` is the seq zero-padded to 16 digits, so lexicographic order is
  numeric order and every index is a plain score-0 zset read with
  ``ZRANGEBYLEX``.
* A fixed, small set of keys per partition (five) is what makes ``ttl``
  cheap: every write refreshes the expiry of all of them.

Operations and round trips
==========================

``get`` is one ``HMGET``; ``list`` is one Lua script; ``write`` is one
pipeline (registry ``HSET`` + the batch script), plus one ``HSET`` when it
is the partition's first write (on a standalone server, usually inside the
same pipeline: see the user registry) and two or three registry commands
when it leaves the partition empty; ``drop`` is one script plus those registry
commands. ``many`` drives independent operations together: each round trip
carries the next step of every one of them in one pipeline, so a batch of
reads costs one. The first use of a script on a server costs one more
(``NOSCRIPT``, then ``EVAL``, which also reloads the other scripts on a
standalone server). :attr:`RedisBackend.round_trips` counts every pipeline
or command sent (a cluster pipeline that talks to several nodes at once
counts as one).

On a standalone server a round trip is one ``sendall`` of the whole call
(packed by hiredis when it is installed) on a connection the backend keeps
between calls, out of the client's pool: the pool's hand-out and return cost
more client time than packing and parsing a small write. The pool's own
check runs on each reuse (a connection with something to read, e.g. closed
by the server, is reconnected); :meth:`RedisBackend.close` gives them back.
A client passed in gets each connection back after every round trip.
The async client's replies are read straight from the connection's hiredis
reader, under one timeout per round trip (see ``_around_trip``); redis-py's
per-reply path, which the sync client uses, is the fallback wherever hiredis
is not there.

``ListQuery.depth`` is a filter like the tags, checked on each candidate's
name before its metadata is read. A walk in name order whose chunk ends
inside the subtree of a name at the wanted depth jumps over the rest of that
subtree, so ``list(prefix="c/_ns/", depth=0, descending=True, limit=1,
children=True)`` (the newest checkpoint and its writes, which sort right
before it) runs the same few commands whatever the history. ``children``
costs each pick one ``ZRANGEBYLEX`` of ``[N/`` .. ``(N0`` on the names
(``0`` is the byte after ``/``) and one ``HMGET``, inside the same script.

Every write batch is ONE Lua script (``EVALSHA``, falling back to ``EVAL``
when the server lost its script cache) that checks every condition first
(the rules of :func:`~checkpointers.backends.base.evaluate`), then applies
every put and delete, assigns seqs with ``INCR``, maintains the indexes, and
returns the stored metadata or the conflict. It runs atomically on the
server; nothing is read on the client and written back.

Staged puts (content-addressed blobs, ``Put.staged`` in ``APPEND`` mode) do
not pass their value through Lua, where a large value costs far more than a
plain command: the same pipeline sends ``HSETNX r v:<name> <value>`` for each
before the script (a present field already holds the same bytes, since the
name is derived from the digest), and the script handles the record like any
other append (conditions, seq, metadata, indexes) without the value. So
``get``/``list``/``drop``/``ttl`` see no difference. Two edges:

* the script refuses the batch (a conflict elsewhere in it): it removes the
  values sent ahead whose record is absent, so a refused batch leaves the
  partition exactly as it was;
* a concurrent delete of the same blob ran between the ``HSETNX`` and the
  script: the script finds the value missing for a record it would create,
  applies nothing and says so, and the batch is re-sent with the values
  inside the script (one more round trip, never a record without its value).

The user registry
=================

``partitions(user, space)`` reads ``P:{<user_key>}:parts``. That hash lives
in another slot than the partitions it names, so a Cluster cannot update it
inside the batch script. It is kept right with idempotent commands instead:

* every write sends ``HSET parts pk name`` in the same pipeline as its
  script (before it; on a Cluster, to the other node at the same time), so
  a partition is registered when it holds a record, also if the client dies
  right after;
* a write that turns an empty partition non-empty (the script reports it)
  sends ``HSET`` again after the script: that repairs a registration removed
  by a concurrent ``drop``/emptying that ran between the two. On a
  standalone server, a write to a partition this backend has not yet seen
  holding records (a small bounded set of partition keys; likely a new one)
  appends that ``HSET`` to its own pipeline, after the script, where the
  server runs it after the script just the same, so filling a new partition
  costs no second round trip; on a Cluster the pipeline's commands for the
  other node are not ordered after the script, so there it is a round trip
  of its own;
* whoever empties a partition (a ``drop``, a batch deleting the last record,
  or ``partitions`` finding an expired one) sends ``HDEL`` and *then* checks
  whether the partition holds records again, re-registering it if so.

Either the writer's script ran before the remover's re-check (and the
remover re-registers), or after it, and then after the ``HDEL``, so the
writer's own second ``HSET`` comes last. ``partitions`` returns only names
whose partition holds records, so a registration that outlives its partition
for a moment is never visible.

Retention (``ttl``)
===================

With ``ttl`` set (seconds), every write sets the expiry of all five keys of
its partition (and of the user's registry) to ``ttl`` from now, in the same
script, so they expire together, at the same instant, ``ttl`` after the
partition's last write. Reads do not extend it. An expired partition simply
no longer exists: ``get`` finds nothing, ``partitions`` no longer names it.
Its sequence counter expires with it; so does it on ``drop``, and seqs then
start again at 1 in the new partition of the same name.

Errors and retries
==================

Transient driver errors (connection lost, timeouts, ``LOADING``,
``TRYAGAIN``, ``CLUSTERDOWN``, ``READONLY`` after a fail-over, ...) are
retried with bounded exponential backoff; after the last attempt they raise
:class:`~checkpointers.errors.BackendUnavailableError` with the driver's
error chained. Retrying a write is safe: upserts are idempotent, appends of
the same digest are no-ops, and a ``CREATE``/``IF_MATCH`` batch retried after
an attempt whose outcome is unknown recognises its own etag (etags are unique
per write) and reports success instead of a conflict with itself.

Damaged data
============

Stored bytes that are not what this backend wrote raise
:class:`~checkpointers.errors.CorruptItemError` naming the record (or, for a
whole key, the key), on every path: ``get``, ``list`` in every shape,
``partitions``, ``many``, sync and async. Never a raw ``ValueError`` or
``UnicodeDecodeError``, and never :class:`BackendUnavailableError`, which
reports an outage. That covers:

* metadata: a missing field or newline, a seq that is not an integer, an
  etag or digest that does not decode, tags that are not a JSON object of
  strings, a value missing beside its metadata. The client parses every
  record with cheap checks (``_record``) and works out what is wrong only
  when one fails;
* the indexes: a seq index entry whose seq is not the record's (so a seq
  order listing never puts a record out of place), a tag index entry for a
  record whose tags do not carry it;
* a key of ours holding another Redis type (``WRONGTYPE``), a sequence
  counter that is not an integer, a registry entry of a live partition that
  does not decode to its name (foreign entries stay skipped).

The scripts run their body under ``guarded()``: damage ends the script with
a reply ``{code, name, reason, meta}``, never an error reply, which the
client could not tell from an outage. A write whose condition needs a
record whose seq, etag or digest cannot be read (append, ``IF_MATCH``,
``CREATE``, a checked delete) applies nothing; one that only returns a
stored record (an append no-op) raises when the client parses it. An upsert
or unconditional delete replaces a damaged record (its index entries are
then found by scanning the indexes, paid only then), and ``drop`` clears a
partition whatever its keys hold. A key of the wrong type met in the middle
of a batch's apply step stops it there (Redis scripts do not roll back).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import inspect
import json
import os
import random
import sys
import threading
import time
import weakref
from collections.abc import AsyncIterator, Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

try:
    import redis
    import redis.asyncio
    import redis.asyncio.cluster
    import redis.cluster
    import redis.exceptions as rex
    from redis.backoff import NoBackoff
    from redis.retry import Retry
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "the Redis backend needs redis-py: pip install 'checkpointers[redis]'"
    ) from exc
try:
    from hiredis import Reader as _HiredisReader
    from hiredis import pack_command as _hiredis_pack
except ImportError:  # pragma: no cover - depends on the environment
    _HiredisReader = _hiredis_pack = None  # type: ignore[assignment,misc]
try:
    from hiredis import PushNotification as _Push  # RESP3 push messages (hiredis >= 3.2)
except ImportError:  # pragma: no cover - depends on the environment
    _Push = None  # type: ignore[assignment,misc]
try:
    # what redis-py's hiredis readers return while a reply is incomplete
    from redis._parsers.hiredis import NOT_ENOUGH_DATA as _NOT_ENOUGH_DATA
except ImportError:  # pragma: no cover - depends on the redis-py version
    _NOT_ENOUGH_DATA = None
if sys.version_info >= (3, 11):
    from asyncio import timeout as _atimeout
else:  # pragma: no cover - redis-py requires async-timeout before 3.11.3
    from async_timeout import timeout as _atimeout

from . import url_flag
from .ops import DropOp, GetOp, ListOp, PartitionsOp, WriteOp
from .._names import Partition, decode_component, encode_component
from ..errors import BackendUnavailableError, CorruptItemError
from .base import (
    Backend,
    Conflict,
    Delete,
    ListQuery,
    Mode,
    Put,
    Record,
    WriteResult,
    check_batch,
    content_digest,
    tags_json,
)

__all__ = ["DRIVER_ERRORS", "RedisBackend", "TRANSIENT_ERRORS", "is_transient", "translate_errors"]

#: How many ``/``-terminated ancestors of a name get their own seq index.
ANCESTOR_DEPTH = 2
_SEQ_DIGITS = 16
#: How many partitions a backend remembers having filled (then it starts over).
_FILLED_MAX = 10_000
_TOP = b"\xff"  # above every name byte: "p" + _TOP bounds the names starting with p

#: Driver errors worth retrying: the next attempt may well succeed.
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    rex.ConnectionError,
    rex.TimeoutError,
    rex.TryAgainError,
    rex.ClusterError,  # CLUSTERDOWN, MASTERDOWN, exhausted redirections
    rex.ReadOnlyError,  # we reached a replica during a fail-over
    rex.AskError,  # MOVED/ASK that escaped the cluster client during resharding
    rex.SlotNotCoveredError,
    rex.InvalidResponse,  # a connection left in a broken state
)
#: Connection errors that a retry cannot fix.
_PERMANENT_ERRORS: tuple[type[BaseException], ...] = (
    rex.AuthenticationError,
    rex.AuthorizationError,
    rex.ExternalAuthProviderError,
)
#: Everything the driver raises on its own account.
DRIVER_ERRORS: tuple[type[BaseException], ...] = (
    rex.RedisError,
    rex.RedisClusterException,
    rex.ChildDeadlockedError,
    rex.IncorrectPolicyType,
)


@contextlib.contextmanager
def translate_errors(what: str = "redis") -> Iterator[None]:
    """Turn every redis-py exception into :class:`BackendUnavailableError`.

    The driver's exception is chained as ``__cause__``. This is the only place
    the backend maps driver errors; the retry loop runs inside it.
    """
    try:
        yield
    except DRIVER_ERRORS as exc:
        raise BackendUnavailableError(
            f"{what}: {type(exc).__name__}: {exc}. Check that the Redis server is "
            f"reachable and healthy; transient errors were retried."
        ) from exc


def is_transient(exc: BaseException) -> bool:
    """Whether a driver error may go away on its own (and is worth a retry)."""
    return isinstance(exc, TRANSIENT_ERRORS) and not isinstance(exc, _PERMANENT_ERRORS)


# --------------------------------------------------------------------------
# Lua: one source for the sync and the async client (same SHA, one cache entry).

_LUA_COMMON = r"""
-- Damaged stored data aborts a script with corrupt(), caught by guarded(),
-- which replies {code, name, reason, meta}: the client raises
-- CorruptItemError naming the record. Never an error reply, which the client
-- cannot tell from an outage.
local function corrupt(name, reason, meta)
  error({corrupt = name, reason = reason, meta = meta or false}, 0)
end
-- seq, etag, digest, tag pairs of a record's metadata (the tags JSON is
-- parsed by the client), or nil when damaged (a missing field, a seq that
-- is not an integer)
local function parse_meta(meta)
  local a = string.find(meta, "\n", 1, true)
  local b = a and string.find(meta, "\n", a + 1, true)
  local c = b and string.find(meta, "\n", b + 1, true)
  local d = c and string.find(meta, "\n", c + 1, true)
  if not d then return nil end
  local seq = string.sub(meta, 1, a - 1)
  if not string.find(seq, "^%d+$") then return nil end
  return seq, string.sub(meta, a + 1, b - 1), string.sub(meta, b + 1, c - 1), string.sub(meta, c + 1, d - 1)
end
-- the same, damage aborting
local function meta_parts(name, meta)
  local seq, etag, digest, pairs = parse_meta(meta)
  if not seq then corrupt(name, "its metadata is not seq, etag, digest, tag pairs, tags", meta) end
  return seq, etag, digest, pairs
end
-- main() with damage turned into the reply {code, name, reason, meta}: what
-- corrupt() raised, or a key of ours holding the wrong type (the key named),
-- after on_damage() (if given) tidied up; any other error is raised on
-- unchanged. Only the damage path costs more than one pcall.
local KEY_TYPES = {"hash", "zset", "zset", "zset", "string"}  -- r n x t seq
local function damage(res)
  if type(res) == "table" and res.corrupt then return {res.corrupt, res.reason, res.meta} end
  local msg = type(res) == "table" and res.err or res
  if type(msg) ~= "string" then return nil end
  if string.sub(msg, 1, 9) ~= "WRONGTYPE" and not string.find(msg, "not an integer", 1, true) then return nil end
  for i, k in ipairs(KEYS) do
    local kind = redis.call("TYPE", k).ok
    if kind ~= "none" and kind ~= KEY_TYPES[i] then
      return {k, "the Redis key holds a " .. kind .. ", not a " .. KEY_TYPES[i], false}
    end
  end
  local seq = KEYS[5] and redis.call("GET", KEYS[5])
  if seq and not string.find(seq, "^%d+$") then return {KEYS[5], "the sequence counter is not an integer", false} end
  return nil
end
local function guarded(code, main, on_damage)
  local ok, res = pcall(main)
  if ok then return res end
  local found = damage(res)
  if not found then error(res, 0) end
  if on_damage then pcall(on_damage) end
  return {code, found[1], found[2], found[3]}
end
local function pad(seq)
  return string.format("%016d", tonumber(seq))
end
local function push(list, a, b)
  list[#list + 1] = a
  list[#list + 1] = b
end
-- one command over a long argument list, in chunks that unpack() can take;
-- returns the concatenated replies of the chunks
local function many(cmd, key, args)
  local out = {}
  for s = 1, #args, 4000 do
    local reply = redis.call(cmd, key, unpack(args, s, math.min(s + 3999, #args)))
    if type(reply) == "table" then
      for _, v in ipairs(reply) do out[#out + 1] = v end
    end
  end
  return out
end
-- the same for a command whose replies are not needed (no result table: a
-- Lua table costs as much as a short redis.call's argument handling)
local function apply(cmd, key, args)
  for s = 1, #args, 4000 do
    redis.call(cmd, key, unpack(args, s, math.min(s + 3999, #args)))
  end
end
"""

# KEYS: r n x t seq
# ARGV: ttl_ms nputs ndeletes, then 9 per put:
#         name mode(u/c/a/i/s) if_match etag digest pairs tags_json ancestors value
#       then 4 per delete: name has_if_match(0/1) if_match ancestors
# Mode "s" is a staged put (an append) whose value the client already sent
# with HSETNX into "v:<name>" in the same pipeline: its value argument is
# empty and the script never touches "v:<name>" on success.
# Returns {0, index, stored meta, stored value, now_empty} for a refused batch,
#         {2} when a staged value is not there (a concurrent delete removed it
#             between the HSETNX and the script; nothing was applied: re-send
#             with the values inline),
#         {3, name, reason, meta} when the batch meets damaged stored data
#             (nothing was applied; see guarded()),
#         {1, was_empty, now_empty, meta of put 1, meta of put 2, ...} otherwise.
# Append mode compares content digests: the part before the first "." (a
# seal may follow it; see backends.base.content_digest).
_WRITE_LUA = _LUA_COMMON + r"""
local r, n, x, t, seqkey = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local ttl, np, nd = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local PW, DW = 9, 4
local D0 = 3 + np * PW
-- after damage stopped the batch: the staged values it sent ahead whose
-- record is absent go again, as on a refusal
local function drop_orphans()
  for k = 0, np - 1 do
    local b = 3 + k * PW
    if ARGV[b + 2] == "s" and redis.call("HEXISTS", r, "m:" .. ARGV[b + 1]) == 0 then
      redis.call("HDEL", r, "v:" .. ARGV[b + 1])
    end
  end
end
return guarded(3, function()
-- 1. read what is stored (one HMGET) and check every condition; refuse the
--    whole batch at the first failure
local fields = {}
for i = 0, np - 1 do fields[#fields + 1] = "m:" .. ARGV[3 + i * PW + 1] end
for j = 0, nd - 1 do fields[#fields + 1] = "m:" .. ARGV[D0 + j * DW + 1] end
local stored = {}  -- 0-based like the conflict index; false where absent
for k, meta in ipairs(many("HMGET", r, fields)) do stored[k - 1] = meta end
-- every stored record's fields, parsed once. A damaged record can still be
-- replaced (upsert) or deleted without a condition: its index members are
-- then found by scanning the indexes. A condition on it cannot be checked:
-- damage aborts here, before anything is written.
local s_seq, s_etag, s_digest, s_pairs, s_damaged = {}, {}, {}, {}, {}
for k = 0, np + nd - 1 do
  local meta = stored[k]
  if meta then
    local seq, etag, digest, pairs = parse_meta(meta)
    if seq and not string.find(pairs, "[^%w_%%=%- ]") then
      s_seq[k], s_etag[k], s_digest[k], s_pairs[k] = seq, etag, digest, pairs
    else
      local name, unconditional
      if k < np then
        name, unconditional = ARGV[3 + k * PW + 1], ARGV[3 + k * PW + 2] == "u"
      else
        name, unconditional = ARGV[D0 + (k - np) * DW + 1], ARGV[D0 + (k - np) * DW + 2] == "0"
      end
      if not unconditional then corrupt(name, "its metadata is not seq, etag, digest, tag pairs, tags", meta) end
      s_damaged[k] = true
    end
  end
end
local noop = {}
local function refuse(i, name)
  local empty = redis.call("EXISTS", n) == 0 and 1 or 0
  local out = {0, i, stored[i], redis.call("HGET", r, "v:" .. name), empty}
  -- the staged values this batch sent ahead and nothing refers to: gone
  -- again (a concurrent batch that counted on one re-sends it, see {2})
  local orphans = {}
  for k = 0, np - 1 do
    if ARGV[3 + k * PW + 2] == "s" and not stored[k] then
      orphans[#orphans + 1] = "v:" .. ARGV[3 + k * PW + 1]
    end
  end
  apply("HDEL", r, orphans)
  return out
end
for i = 0, np - 1 do
  local b = 3 + i * PW
  local name, mode, meta = ARGV[b + 1], ARGV[b + 2], stored[i]
  if mode == "c" and meta then return refuse(i, name) end
  if mode == "i" then
    if not meta then return refuse(i, name) end
    if s_etag[i] ~= ARGV[b + 3] then return refuse(i, name) end
  end
  if (mode == "a" or mode == "s") and meta then
    local have, want = s_digest[i], ARGV[b + 5]
    if have ~= want and string.match(have, "^[^.]*") ~= string.match(want, "^[^.]*") then
      return refuse(i, name)
    end
    noop[i] = true
  end
end
for j = 0, nd - 1 do
  local b = D0 + j * DW
  local meta = stored[np + j]
  if ARGV[b + 2] == "1" then
    if not meta then return refuse(np + j, ARGV[b + 1]) end
    if s_etag[np + j] ~= ARGV[b + 3] then return refuse(np + j, ARGV[b + 1]) end
  end
end
for i = 0, np - 1 do
  local b = 3 + i * PW
  if ARGV[b + 2] == "s" and not noop[i] and redis.call("HEXISTS", r, "v:" .. ARGV[b + 1]) == 0 then
    return {2}
  end
end

-- 2. apply: collect every index change, then one command per key (old
--    index members go before new ones, which may be equal to them)
local x_old, t_old, x_new, t_new, n_new, r_new, gone = {}, {}, {}, {}, {}, {}, {}
local function unindex(name, k, ancestors)  -- the index members of stored record k
  if s_damaged[k] then
    -- members end with "|" .. name (a name has no "|"): a scan, paid only
    -- when damage is being overwritten
    local tail = "|" .. name
    for _, m in ipairs(redis.call("ZRANGE", x, 0, -1)) do
      if string.sub(m, -#tail) == tail then x_old[#x_old + 1] = m end
    end
    for _, m in ipairs(redis.call("ZRANGE", t, 0, -1)) do
      if string.sub(m, -#tail) == tail then t_old[#t_old + 1] = m end
    end
    return
  end
  local s, pairs = pad(s_seq[k]), s_pairs[k]
  x_old[#x_old + 1] = "|" .. s .. "|" .. name
  for a in string.gmatch(ancestors, "[^ ]+") do x_old[#x_old + 1] = a .. "|" .. s .. "|" .. name end
  for p in string.gmatch(pairs, "[^ ]+") do
    t_old[#t_old + 1] = "s" .. p .. "|" .. s .. "|" .. name
    t_old[#t_old + 1] = "n" .. p .. "|" .. name
  end
end
local applied = 0
for i = 0, np - 1 do if not noop[i] then applied = applied + 1 end end
-- was it empty? Its seq counter says so without one more command: every
-- applied put creates the counter, and whatever empties a partition removes
-- it too (step 3 below, drop, a ttl expiring all the keys at once). A batch
-- that applies no put cannot fill an empty partition: 0 is right for it.
local out = {1, 0, 0}
local seq = 0
if applied > 0 then
  seq = redis.call("INCRBY", seqkey, applied) - applied
  if seq == 0 then out[2] = 1 end
end
for i = 0, np - 1 do
  local b = 3 + i * PW
  local name, pairs, ancestors = ARGV[b + 1], ARGV[b + 6], ARGV[b + 8]
  if noop[i] then
    out[#out + 1] = stored[i]
  else
    if stored[i] then unindex(name, i, ancestors) end
    seq = seq + 1
    local s = pad(seq)
    local meta = seq .. "\n" .. ARGV[b + 4] .. "\n" .. ARGV[b + 5] .. "\n" .. pairs .. "\n" .. ARGV[b + 7]
    push(r_new, "m:" .. name, meta)
    if ARGV[b + 2] ~= "s" then push(r_new, "v:" .. name, ARGV[b + 9]) end
    -- scores are the string "0": a Lua number would be formatted for every member
    push(n_new, "0", name)
    push(x_new, "0", "|" .. s .. "|" .. name)
    for a in string.gmatch(ancestors, "[^ ]+") do push(x_new, "0", a .. "|" .. s .. "|" .. name) end
    for p in string.gmatch(pairs, "[^ ]+") do
      push(t_new, "0", "s" .. p .. "|" .. s .. "|" .. name)
      push(t_new, "0", "n" .. p .. "|" .. name)
    end
    out[#out + 1] = meta
  end
end
for j = 0, nd - 1 do
  local b = D0 + j * DW
  local name = ARGV[b + 1]
  if stored[np + j] then
    unindex(name, np + j, ARGV[b + 4])
    push(gone, "m:" .. name, "v:" .. name)
  end
end
apply("ZREM", x, x_old)
apply("ZREM", t, t_old)
local n_old = {}
for j = 0, nd - 1 do
  if stored[np + j] then n_old[#n_old + 1] = ARGV[D0 + j * DW + 1] end
end
apply("ZREM", n, n_old)
apply("HDEL", r, gone)
apply("HSET", r, r_new)
apply("ZADD", n, n_new)
apply("ZADD", x, x_new)
apply("ZADD", t, t_new)

-- 3. an empty partition keeps no keys; a live one gets its expiry refreshed
--    (a batch that stored a put cannot have left it empty)
if (nd > 0 or np == 0) and redis.call("EXISTS", n) == 0 then
  out[3] = 1
  redis.call("DEL", seqkey)
elseif ttl > 0 then
  for _, k in ipairs(KEYS) do redis.call("PEXPIRE", k, ttl) end
end
return out
end, drop_orphans)
"""

# KEYS: r n x t
# ARGV: order(name/seq) desc(0/1) limit(-1 = none) values(0/1) prefix
#       name_lo name_hi has_name_hi seq_lo seq_hi ancestor
#       depth(-1 = any) children(0/1) tag...
# Returns name, meta, value for every selected record, in order, each
# followed by its children (with children=1); {0, name, reason, meta} when it
# meets damaged stored data (see guarded()): a record whose value is missing,
# whose seq is not an integer or disagrees with the seq index entry it was
# found by, ... (the client parses and checks the rest of every record).
_LIST_LUA = _LUA_COMMON + r"""
return guarded(0, function()
local r, n, x, t = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local by_seq, desc = ARGV[1] == "seq", ARGV[2] == "1"
local limit, values, prefix = tonumber(ARGV[3]), ARGV[4] == "1", ARGV[5]
local nlo, nhi, has_nhi = ARGV[6], ARGV[7], ARGV[8] == "1"
local slo, shi, anc = ARGV[9], ARGV[10], ARGV[11]
local depth, children = tonumber(ARGV[12]), ARGV[13] == "1"
local tags = {}
for i = 14, #ARGV do tags[#tags + 1] = ARGV[i] end

local out, count = {}, 0
local function full() return limit >= 0 and count >= limit end
-- the children of name: "[name/" .. "(name0" in the names zset ("0" follows
-- "/"), ascending, unfiltered, not counted; one HMGET for all of them
local function emit_children(name)
  local kids = redis.call("ZRANGEBYLEX", n, "[" .. name .. "/", "(" .. name .. "0")
  if #kids == 0 then return end
  local fields = {}
  for _, kid in ipairs(kids) do
    fields[#fields + 1] = "m:" .. kid
    if values then fields[#fields + 1] = "v:" .. kid end
  end
  local got = many("HMGET", r, fields)
  local step = values and 2 or 1
  for i, kid in ipairs(kids) do
    local meta = got[(i - 1) * step + 1]
    if meta then
      local value = ""
      if values then
        value = got[i * 2]
        if not value then corrupt(kid, "its value is missing", false) end
      end
      out[#out + 1] = kid
      out[#out + 1] = meta
      out[#out + 1] = value
    end
  end
end
local function emit(name, meta)
  local value = ""
  if values then
    value = redis.call("HGET", r, "v:" .. name)
    if not value then corrupt(name, "its value is missing", false) end
  end
  out[#out + 1] = name
  out[#out + 1] = meta
  out[#out + 1] = value
  count = count + 1
  if children then emit_children(name) end
end
-- the seq field of a record's metadata, checked
local function seq_of(name, meta)
  local a = string.find(meta, "\n", 1, true)
  local seq = a and string.sub(meta, 1, a - 1)
  if not seq or not string.find(seq, "^%d+$") then corrupt(name, "its seq is not an integer", meta) end
  return seq
end
-- whether name (under prefix) has exactly depth "/" after the prefix; a
-- deeper name also returns where its ancestor at that depth ends (the
-- position of the "/" after it), so a walk in name order can skip the
-- ancestor's whole subtree
local function at_depth(name)
  if depth < 0 then return true end
  local at = #prefix
  for i = 0, depth do
    at = string.find(name, "/", at + 1, true)
    if not at then return i == depth end
  end
  return false, at
end
-- the record if it passes the filters its index did not apply, else nil;
-- seq16: the seq of the index entry it was found by (a seq index), which
-- must be the record's
local function check(name, skip_tag, check_prefix, seq16)
  if check_prefix and string.sub(name, 1, #prefix) ~= prefix then return nil end
  if not at_depth(name) then return nil end
  local meta = redis.call("HGET", r, "m:" .. name)
  if not meta then return nil end
  if seq16 and tonumber(seq_of(name, meta)) ~= tonumber(seq16) then
    corrupt(name, "its seq is not the one its seq index entry gives", meta)
  end
  if #tags > 0 then
    local _, _, _, pairs = meta_parts(name, meta)
    pairs = " " .. pairs .. " "
    for i, p in ipairs(tags) do
      if i ~= skip_tag and not string.find(pairs, " " .. p .. " ", 1, true) then return nil end
    end
  end
  return meta
end
-- walk one lex range in order, in growing chunks, until the limit is met;
-- by_name: the index is in name order, so a subtree is one run of members
local function scan(key, lo, hi, name_at, skip_tag, check_prefix, by_name)
  local chunk = 32
  if limit >= 0 then chunk = math.max(limit, 1) end
  while true do
    local members
    if desc then
      members = redis.call("ZREVRANGEBYLEX", key, hi, lo, "LIMIT", 0, chunk)
    else
      members = redis.call("ZRANGEBYLEX", key, lo, hi, "LIMIT", 0, chunk)
    end
    for _, m in ipairs(members) do
      local name = string.sub(m, name_at)
      local meta = check(name, skip_tag, check_prefix, not by_name and string.sub(m, name_at - 17, name_at - 2))
      if meta then
        emit(name, meta)
        if full() then return end
      end
    end
    if #members < chunk then return end
    local last = members[#members]
    if desc then hi = "(" .. last else lo = "(" .. last end
    if by_name then
      -- the chunk ended inside the subtree of a name at the query depth:
      -- jump over the rest of it (in descending order, a checkpoint's
      -- writes come right before it), so the walk reads a bounded number
      -- of names below the wanted depth
      local _, cut = at_depth(string.sub(last, name_at))
      if cut then
        local base = string.sub(last, 1, name_at + cut - 2)  -- index member of that name
        if desc then hi = "[" .. base else lo = "[" .. base .. "0" end
      end
    end
    chunk = math.min(chunk * 2, 1024)
  end
end
local function seq_range(family)  -- family ends with "|"; members family..seq16.."|"..name
  local top = string.sub(family, 1, #family - 1) .. "}"
  local hi = "(" .. top
  if shi ~= "" then hi = "(" .. family .. shi end
  return "[" .. family .. slo, hi
end

-- seq order under a prefix that is not an indexed ancestor: walking the
-- ancestor's index skips the names outside the prefix; reading every name
-- under the prefix and sorting them costs their number. Pick the cheaper.
local function index_is_cheaper()
  local under = redis.call("ZLEXCOUNT", n, "[" .. prefix, "(" .. prefix .. "\255")
  if under == 0 then return false end
  local family = redis.call("ZCARD", n)
  if anc ~= "" then family = redis.call("ZLEXCOUNT", n, "[" .. anc, "(" .. anc .. "\255") end
  local wanted = under
  if limit >= 0 and limit < under then wanted = limit end
  return wanted * family / under <= 2 * under
end

if #tags > 0 then
  -- walk the smallest tag index; check the other tags on each candidate
  local kind = by_seq and "s" or "n"
  local best, best_count = 1, -1
  for i, p in ipairs(tags) do
    local c = redis.call("ZLEXCOUNT", t, "[" .. kind .. p .. "|", "(" .. kind .. p .. "}")
    if best_count < 0 or c < best_count then best, best_count = i, c end
  end
  if best_count == 0 then return out end
  local family = kind .. tags[best] .. "|"
  if by_seq then
    local lo, hi = seq_range(family)
    scan(t, lo, hi, #family + 18, best, prefix ~= "", false)
  else
    local hi = "(" .. kind .. tags[best] .. "}"
    if has_nhi then hi = "(" .. family .. nhi end
    scan(t, "[" .. family .. nlo, hi, #family + 1, best, false, true)
  end
elseif not by_seq then
  local hi = "+"
  if has_nhi then hi = "(" .. nhi end
  local lo = "-"
  if nlo ~= "" then lo = "[" .. nlo end
  scan(n, lo, hi, 1, 0, false, true)
elseif prefix ~= anc and not index_is_cheaper() then
  -- few names under the prefix: read them all and sort by seq
  local rows = {}
  local lo_seq = tonumber(slo) or 0
  local hi_seq = tonumber(shi)
  for _, name in ipairs(redis.call("ZRANGEBYLEX", n, "[" .. prefix, "(" .. prefix .. "\255")) do
    local meta = at_depth(name) and redis.call("HGET", r, "m:" .. name)
    if meta then
      local seq = tonumber(seq_of(name, meta))
      if seq >= lo_seq and (hi_seq == nil or seq < hi_seq) then
        rows[#rows + 1] = {seq, name, meta}
      end
    end
  end
  if desc then
    table.sort(rows, function(a, b) return a[1] > b[1] end)
  else
    table.sort(rows, function(a, b) return a[1] < b[1] end)
  end
  for _, row in ipairs(rows) do
    if full() then break end
    emit(row[2], row[3])
  end
else
  -- the seq index of the prefix's longest indexed ancestor
  local lo, hi = seq_range(anc .. "|")
  scan(x, lo, hi, #anc + 19, 0, prefix ~= anc, false)
end
return out
end)
"""

# KEYS: r n x t seq ; returns how many records the partition held. A names
# key of the wrong type (damage) counts 0 and is dropped like the others:
# drop is how a damaged partition is cleared.
_DROP_LUA = r"""
local count = redis.pcall("ZCARD", KEYS[2])
if type(count) ~= "number" then count = 0 end
redis.call("UNLINK", unpack(KEYS))
return count
"""


@dataclass(frozen=True)
class _Script:
    """A Lua script; run with ``EVALSHA`` and re-sent with ``EVAL`` on ``NOSCRIPT``."""

    source: str

    @functools.cached_property
    def sha(self) -> str:
        return hashlib.sha1(self.source.encode()).hexdigest()


WRITE_SCRIPT = _Script(_WRITE_LUA)
LIST_SCRIPT = _Script(_LIST_LUA)
DROP_SCRIPT = _Script(_DROP_LUA)
_SCRIPTS = (WRITE_SCRIPT, LIST_SCRIPT, DROP_SCRIPT)


@dataclass(frozen=True)
class _Eval:
    """One script invocation inside a pipeline."""

    script: _Script
    keys: Sequence[str]
    args: Sequence[bytes | str | int]


#: One command (``("HGET", key, field)``) or one script call.
_Command = tuple[Any, ...] | _Eval


@dataclass(frozen=True)
class _Call:
    """What one round trip sends: one pipeline of commands."""

    commands: Sequence[_Command]


@dataclass(frozen=True)
class _Reply:
    """A round trip's results; ``retried`` when an earlier attempt failed.

    ``corrupt``: a command met a key of ours holding the wrong type; its
    reply is that error (see :meth:`RedisBackend._results`), also thrown
    into the operation that sent it.
    """

    values: list[Any]
    retried: bool
    corrupt: CorruptItemError | None = None


_Op = Generator[_Call, _Reply, Any]


# --------------------------------------------------------------------------
# Pure helpers: key names, arguments, parsing.


def _ancestors(name: str) -> list[str]:
    """The first :data:`ANCESTOR_DEPTH` ``/``-terminated prefixes of ``name``."""
    out: list[str] = []
    at = -1
    for _ in range(ANCESTOR_DEPTH):
        at = name.find("/", at + 1)
        if at < 0:
            break
        out.append(name[: at + 1])
    return out


def _tag_pairs(tags: Any) -> list[str]:
    """Index members of tags: ``enc(k)=enc(v)`` (no space, ``|``, ``{``, ``}``)."""
    return [_tag_pair(k, v) for k, v in sorted(tags.items())]


@functools.lru_cache(maxsize=4096)
def _tag_pair(key: str, value: str) -> str:
    return f"{encode_component(key)}={encode_component(value)}"


def _pad(seq: int) -> str:
    return f"{seq:0{_SEQ_DIGITS}d}"


def _record(name: str | bytes, meta: bytes, value: bytes | None) -> Record:
    """The record stored as ``meta`` and ``value``; damage raises :class:`CorruptItemError`.

    On every read, so only cheap checks; :func:`_damage` says what is wrong.
    """
    try:
        seq, etag, digest, _pairs, tags = meta.split(b"\n", 4)
        if tags == b"{}":
            parsed: Any = {}
        else:
            parsed = json.loads(tags)
            if parsed.__class__ is not dict:
                raise ValueError
            for v in parsed.values():
                if v.__class__ is not str:
                    raise ValueError
        if seq.isdigit() and value is not None:
            if name.__class__ is not str:
                name = name.decode("ascii")  # type: ignore[union-attr]
            return Record(name, value, parsed, etag.decode(), digest.decode("ascii"), int(seq))  # type: ignore[arg-type]
    except (ValueError, TypeError, AttributeError, RecursionError):  # UnicodeDecodeError, JSONDecodeError too
        pass
    raise CorruptItemError(_label(name), _damage(meta, value))


def _label(name: str | bytes) -> str:
    return name if isinstance(name, str) else name.decode("ascii", "backslashreplace")


def _damage(meta: Any, value: Any) -> str:
    """What is wrong with a record stored as ``meta`` and ``value`` (that :func:`_record` refused)."""
    if not isinstance(meta, bytes):
        return f"its metadata is a {type(meta).__name__}, not bytes"
    fields = meta.split(b"\n", 4)
    if len(fields) < 5:
        return f"its metadata has {len(fields)} of its 5 newline-separated fields (seq, etag, digest, tag pairs, tags)"
    seq, etag, digest, _pairs, tags = fields
    if not seq.isdigit():
        return f"its seq {seq[:40]!r} is not an integer"
    for what, raw, codec in (("etag", etag, "utf-8"), ("digest", digest, "ascii")):
        try:
            raw.decode(codec)
        except UnicodeDecodeError:
            return f"its {what} {raw[:40]!r} is not {codec.upper()}"
    try:
        parsed = json.loads(tags)
    except (ValueError, RecursionError) as exc:
        return f"its tags {tags[:60]!r} are not JSON ({type(exc).__name__}: {exc})"
    if not isinstance(parsed, dict):
        return f"its tags are a JSON {type(parsed).__name__}, not an object"
    for k, v in parsed.items():
        if not isinstance(v, str):
            return f"its tag {k!r} has a {type(v).__name__} value, not a string"
    if value is None:
        return "its value is missing (the metadata is there)"
    if not isinstance(value, bytes):
        return f"its value is a {type(value).__name__}, not bytes"
    return "its name is not ASCII"


def _script_damage(reply: Sequence[Any]) -> CorruptItemError:
    """The error a script's damage reply ``[code, name, reason, meta]`` stands for (see ``guarded``).

    With the record's metadata, the client's own parse says what is wrong
    when it finds something too.
    """
    name, reason, meta = _label(reply[1]), reply[2], reply[3]
    if meta is not None:
        try:
            _record(name, meta, b"")
        except CorruptItemError as exc:
            return exc
    return CorruptItemError(name, reason.decode("utf-8", "replace") if isinstance(reason, bytes) else str(reason))


def _wrong_type(command: Any, exc: BaseException) -> CorruptItemError:
    """A command's WRONGTYPE reply (a key of ours holding another type) as the damage it is.

    Names the first record the command reads (an ``HMGET``/``HGET`` of
    ``m:``/``v:`` fields), else the key.
    """
    if isinstance(command, _Eval):
        return CorruptItemError(str(command.keys[0]), f"a key of this partition has the wrong type ({exc})")
    key = command[1] if len(command) > 1 else "?"
    key = key.decode("utf-8", "replace") if isinstance(key, bytes) else str(key)
    if command[0] in ("HMGET", "HGET") and len(command) > 2 and str(command[2])[:2] in ("m:", "v:"):
        return CorruptItemError(str(command[2])[2:], f"the Redis key {key!r} holding it is not a hash ({exc})")
    return CorruptItemError(key, f"the Redis key has the wrong type for {command[0]} ({exc})")


def _written(put: Put, meta: bytes) -> Record:
    """The record a successful batch returns for ``put`` (``meta`` as the script returned it).

    A record carrying the put's etag holds exactly the put's fields (etags are
    unique per write), so only its seq is parsed; an append that found the
    same digest stored keeps what was there, parsed in full.
    """
    seq, etag, _ = meta.split(b"\n", 2)
    if etag == put.etag.encode():
        return Record(put.name, put.value, dict(put.tags), put.etag, put.digest, int(seq))
    return _record(put.name, meta, put.value)


_MODES = {Mode.UPSERT: "u", Mode.CREATE: "c", Mode.APPEND: "a", Mode.IF_MATCH: "i"}
_PREFIX_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-.:")
_OUR_URL_OPTIONS = ("prefix", "ttl", "cluster")


def _sent_ahead(put: Put) -> bool:
    """Whether ``put``'s value goes ahead of the script, set-if-absent (staged appends)."""
    return put.staged and put.mode is Mode.APPEND


def _write_args(
    ttl_ms: int, puts: Sequence[Put], deletes: Sequence[Delete], ahead: bool
) -> list[Any]:
    """The write script's arguments; ``ahead``: staged values are sent ahead (mode ``s``)."""
    args: list[Any] = [ttl_ms, len(puts), len(deletes)]
    for put in puts:
        if "\n" in put.etag or "\n" in put.digest:
            raise ValueError(f"put {put.name!r}: etag and digest must not contain a newline")
        staged = ahead and _sent_ahead(put)
        args += [
            put.name,
            "s" if staged else _MODES[put.mode],
            put.if_match if put.if_match is not None else "",
            put.etag,
            put.digest,
            " ".join(_tag_pairs(put.tags)) if put.tags else "",
            tags_json(put.tags),
            " ".join(_ancestors(put.name)),
            b"" if staged else put.value,
        ]
    for d in deletes:
        args += [d.name, "0" if d.if_match is None else "1", d.if_match or "", " ".join(_ancestors(d.name))]
    return args


def _list_args(query: ListQuery) -> list[Any] | None:
    """Script arguments for ``query``, or ``None`` when it selects nothing."""
    if query.order not in ("name", "seq"):
        raise ValueError(f"ListQuery.order must be 'name' or 'seq', got {query.order!r}")
    if query.limit is not None and query.limit <= 0:
        return None
    prefix = query.prefix.encode()
    name_lo, name_hi = prefix, (prefix + _TOP if prefix else None)
    seq_lo = seq_hi = ""
    if query.order == "name":
        if query.start is not None:
            name_lo = max(name_lo, _as_bytes(query.start))
        if query.stop is not None:
            stop = _as_bytes(query.stop)
            name_hi = stop if name_hi is None else min(name_hi, stop)
        if name_hi is not None and name_hi <= name_lo:
            return None
    else:
        start, stop = _as_int(query.start), _as_int(query.stop)
        if start is not None and start > 0:
            if start >= 10**_SEQ_DIGITS:
                return None
            seq_lo = _pad(start)
        if stop is not None:
            if stop <= max(start or 0, 0):
                return None
            if stop < 10**_SEQ_DIGITS:
                seq_hi = _pad(stop)
    ancestors = _ancestors(query.prefix)
    return [
        query.order,
        "1" if query.descending else "0",
        -1 if query.limit is None else query.limit,
        "1" if query.values else "0",
        prefix,
        name_lo,
        name_hi or b"",
        "0" if name_hi is None else "1",
        seq_lo,
        seq_hi,
        ancestors[-1] if ancestors else "",
        -1 if query.depth is None else query.depth,
        "1" if query.children else "0",
        *_tag_pairs(query.tags),
    ]


def _as_bytes(bound: object) -> bytes:
    if not isinstance(bound, str):
        raise ValueError(f"a name-order ListQuery bound must be a str, got {bound!r}")
    return bound.encode()


def _as_int(bound: object) -> int | None:
    if bound is not None and (not isinstance(bound, int) or isinstance(bound, bool)):
        raise ValueError(f"a seq-order ListQuery bound must be an int, got {bound!r}")
    return bound


def _applied_before(
    puts: Sequence[Put], deletes: Sequence[Delete], stored: Sequence[Record | None]
) -> bool:
    """Whether what is stored is exactly what this batch writes (so it was applied).

    Etags are unique per write, so a stored record carrying a put's own etag
    was written by this batch, and the batch is atomic.
    """
    own = False
    for put, rec in zip(puts, stored):
        if rec is None:
            return False
        if rec.etag == put.etag:
            own = True
        elif not (put.mode is Mode.APPEND and content_digest(rec.digest) == content_digest(put.digest)):
            return False
    if any(rec is not None for rec in stored[len(puts) :]):
        return False
    return own or not puts


def _pack(conn: Any, wire: list[tuple[Any, ...]]) -> list[bytes]:
    """``wire`` as one buffer for ``conn.send_packed_command`` (one ``sendall``).

    With hiredis, every command is packed by ``hiredis.pack_command`` in one
    pass, as redis-py's sync hiredis serializer does (utf-8 for ``str``), minus
    its per-argument checks; redis-py's own packing is the fallback.
    """
    if _hiredis_pack is not None:
        try:
            return [b"".join(map(_hiredis_pack, wire))]
        except TypeError:
            pass  # an argument type only redis-py converts (bytearray, ...)
    packed = conn.pack_commands(wire)
    return packed if len(packed) == 1 else [b"".join(packed)]


def _hiredis_parts(conn: Any) -> tuple[Any, Any, asyncio.StreamReader, asyncio.StreamWriter] | None:
    """``(parser, hiredis reader, stream reader, stream writer)`` of a
    connected ``redis.asyncio`` connection whose replies this module may read
    itself, else ``None``.

    That is a connection parsing with hiredis, as ``redis[hiredis]`` gives.
    Anything else (the pure-Python parser, a hiredis too old to mark RESP3
    push messages, a redis-py whose internals moved) is read by redis-py.
    """
    parser = getattr(conn, "_parser", None)
    reader = getattr(parser, "_reader", None)
    stream, writer = getattr(conn, "_reader", None), getattr(conn, "_writer", None)
    if (
        _NOT_ENOUGH_DATA is None
        or _HiredisReader is None
        or not isinstance(reader, _HiredisReader)
        or (_Push is None and getattr(conn, "protocol", None) not in (2, "2"))
        or not hasattr(parser, "handle_push_response")
        or not isinstance(stream, asyncio.StreamReader)
        or not isinstance(writer, asyncio.StreamWriter)
    ):
        return None
    return parser, reader, stream, writer


def _take_replies(reader: Any, replies: list[Any], want: int, pushes: list[Any]) -> bool:
    """Move the complete replies buffered in ``reader`` to ``replies``; whether all ``want`` are there.

    As redis-py's parsers do: an error reply is its exception, returned in
    place, except a connection-level one (``LOADING`` and the like), raised;
    a RESP3 push message is no reply: it goes to ``pushes``, for the parser's
    push handler.
    """
    while len(replies) < want:
        reply = reader.gets()
        if reply is _NOT_ENOUGH_DATA:
            return False
        if isinstance(reply, rex.ConnectionError):
            raise reply
        if isinstance(reply, list) and reply and isinstance(reply[0], rex.ConnectionError):
            raise reply[0]
        if _Push is not None and isinstance(reply, _Push):
            pushes.append(reply)
        else:
            replies.append(reply)
    return True


def _callback(client: Any, command: Any, reply: Any) -> Any:
    """``reply`` as ``client.parse_response`` returns it (the client's response callback applied)."""
    if isinstance(reply, BaseException):
        return reply
    callback = client.response_callbacks.get(command)
    return reply if callback is None else callback(reply)


def _release_idle(idle: list[tuple[Any, Any]]) -> None:
    """Hand the idle connections of a backend back to their pools (this process's only)."""
    pid = os.getpid()
    while True:
        try:
            pool, conn = idle.pop()
        except IndexError:
            return
        if conn.pid == pid:
            pool.release(conn)


async def _loop_guard(client: Any) -> AsyncIterator[None]:
    """Close ``client`` when its event loop shuts down.

    A loop finalizes the async generators started in it before it closes
    (``loop.shutdown_asyncgens()``, called by ``asyncio.run`` and
    ``asyncio.Runner``), which runs this ``finally`` while the loop can still
    close the connections.
    """
    try:
        yield
    finally:
        with contextlib.suppress(*DRIVER_ERRORS, RuntimeError):
            await client.aclose()


# --------------------------------------------------------------------------


class RedisBackend(Backend):
    """Partitions in plain Redis / Valkey 7+ (no modules), standalone or Cluster.

    Build it with :meth:`from_url` (``redis://``, ``rediss://``, ``valkey://``,
    ``unix://``; add ``?cluster=true`` or ``cluster=True`` for a Cluster), or
    hand it your own clients: ``client`` a ``redis.Redis``/``RedisCluster``
    for the sync methods, ``aclient`` a ``redis.asyncio`` one for the async
    methods (both with ``decode_responses=False``; clients you pass are not
    closed by :meth:`close`).

    * ``prefix``: the root of every key (``[A-Za-z0-9_.:-]``, no glob
      characters), so several applications or test runs share one server.
    * ``ttl``: optional retention in seconds. All keys of a partition expire
      together ``ttl`` seconds after its last write; every write (an append
      no-op included) refreshes them; reads do not. Without ``ttl`` nothing
      expires.
    * ``retry_attempts`` / ``retry_backoff`` / ``retry_backoff_max``: transient
      errors are retried up to ``retry_attempts`` times, sleeping
      ``retry_backoff * 2**n`` seconds (at most ``retry_backoff_max``) between
      attempts, then raise :class:`BackendUnavailableError`.

    :attr:`round_trips` counts the pipelines and commands sent to the server
    (failed attempts included) and :attr:`retries` the retried attempts, for
    benchmarks. See the module docstring for the key layout.
    """

    kind = "redis"

    def __init__(
        self,
        client: Any = None,
        *,
        aclient: Any = None,
        url: str | None = None,
        cluster: bool = False,
        client_options: dict[str, Any] | None = None,
        prefix: str = "checkpointers",
        ttl: float | None = None,
        retry_attempts: int = 6,
        retry_backoff: float = 0.05,
        retry_backoff_max: float = 2.0,
    ) -> None:
        if not prefix or len(prefix) > 100 or not set(prefix) <= _PREFIX_CHARS:
            raise ValueError(
                f"prefix {prefix!r} must be 1-100 characters from [A-Za-z0-9_.:-] "
                f"(no braces or glob characters)"
            )
        if ttl is not None and ttl <= 0:
            raise ValueError(f"ttl must be a positive number of seconds or None, got {ttl!r}")
        if retry_attempts < 0 or retry_backoff < 0 or retry_backoff_max < 0:
            raise ValueError("retry_attempts, retry_backoff and retry_backoff_max must be >= 0")
        if client is None and aclient is None and url is None:
            raise ValueError("pass client= and/or aclient=, or use RedisBackend.from_url(url)")
        for c in (client, aclient):
            if c is not None and c.get_encoder().decode_responses:
                raise ValueError("the Redis client must use decode_responses=False (values are bytes)")
        self.prefix = prefix
        self.ttl = ttl
        self.cluster = cluster
        self.retry_attempts = retry_attempts
        self.retry_backoff = retry_backoff
        self.retry_backoff_max = retry_backoff_max
        #: Network round trips so far (a pipeline or script counts once).
        self.round_trips = 0
        #: Attempts that failed with a transient error and were retried.
        self.retries = 0
        self._ttl_ms = 0 if ttl is None else max(1, int(ttl * 1000))
        self._url = url
        self._options = dict(client_options or {})
        self._client = client
        self._owns_client = client is None
        self._aclient = aclient
        self._aclients: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, tuple[Any, AsyncIterator[None]]
        ] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        #: Idle sync connections held out of their pool: (pool, connection).
        self._idle: list[tuple[Any, Any]] = []
        weakref.finalize(self, _release_idle, self._idle)  # never closed: back to the pool
        #: The same for the async clients we create, per pool (each belongs to one
        #: event loop; closing one of them closes its connections, in use or not).
        self._aidle: weakref.WeakKeyDictionary[Any, list[Any]] = weakref.WeakKeyDictionary()
        #: Partition keys this backend saw holding records (see _write_op).
        self._filled: dict[str, None] = {}

    @classmethod
    def from_url(cls, url: str, **options: Any) -> RedisBackend:
        """A backend on the server ``url`` names.

        ``valkey://`` and ``valkeys://`` are read as ``redis://`` and
        ``rediss://``. The URL's query may carry ``prefix``, ``ttl`` and
        ``cluster=true``; keyword arguments win. Other keyword arguments that
        are not constructor options go to the redis-py client
        (``socket_timeout=``, ``max_connections=``, ...).
        """
        parts = urlsplit(url)
        scheme = {"valkey": "redis", "valkeys": "rediss"}.get(parts.scheme, parts.scheme)
        if scheme not in ("redis", "rediss", "unix"):
            raise ValueError(f"not a Redis URL: {url!r} (use redis://, rediss://, valkey:// or unix://)")
        query = parse_qsl(parts.query)
        ours = {k: v for k, v in query if k in _OUR_URL_OPTIONS}
        rest = [(k, v) for k, v in query if k not in _OUR_URL_OPTIONS]
        clean = urlunsplit((scheme, parts.netloc, parts.path, urlencode(rest), parts.fragment))
        own = {
            "prefix", "ttl", "cluster", "retry_attempts", "retry_backoff", "retry_backoff_max",
        }  # fmt: skip
        kwargs: dict[str, Any] = {}
        if "prefix" in ours:
            kwargs["prefix"] = ours["prefix"]
        if "ttl" in ours:
            kwargs["ttl"] = float(ours["ttl"])
        if "cluster" in ours:
            kwargs["cluster"] = url_flag("cluster", ours["cluster"])
        kwargs.update({k: v for k, v in options.items() if k in own})
        client_options = {k: v for k, v in options.items() if k not in own}
        return cls(url=clean, client_options=client_options, **kwargs)

    # -- clients -----------------------------------------------------------

    def _client_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"socket_timeout": 10.0, "socket_connect_timeout": 5.0}
        if not self.cluster:
            # Our own loop retries (bounded, counted); the driver's would multiply it.
            kwargs["retry"] = Retry(NoBackoff(), 0)
        kwargs.update(self._options)
        kwargs["decode_responses"] = False
        return kwargs

    def _sync_client(self) -> Any:
        if self._client is None:
            if self._url is None:
                raise RuntimeError(
                    "this RedisBackend has only an async client: use the a-prefixed methods, "
                    "or pass client= (a redis.Redis) too"
                )
            with self._lock:
                if self._client is None:
                    kind = redis.cluster.RedisCluster if self.cluster else redis.Redis
                    with translate_errors("connecting to Redis"):
                        self._client = kind.from_url(self._url, **self._client_kwargs())
        return self._client

    async def _async_client(self) -> Any:
        if self._aclient is not None:
            return self._aclient
        if self._url is None:
            raise RuntimeError(
                "this RedisBackend has only a sync client: use the sync methods, or pass "
                "aclient= (a redis.asyncio.Redis) too"
            )
        # redis.asyncio connections belong to the loop that opened them: one
        # client per loop, closed when that loop shuts down (see _loop_guard).
        loop = asyncio.get_running_loop()
        entry = self._aclients.get(loop)
        if entry is None:
            kind = redis.asyncio.cluster.RedisCluster if self.cluster else redis.asyncio.Redis
            client = kind.from_url(self._url, **self._client_kwargs())
            guard = _loop_guard(client)
            await guard.__anext__()
            entry = self._aclients[loop] = (client, guard)
        return entry[0]

    def close(self) -> None:
        """Close the clients this backend created (idempotent).

        Each async client is closed by its event loop's shutdown
        (``asyncio.run`` and test runners shut loops down), or here when its
        loop is open but idle; inside a running loop, use :meth:`aclose`.
        """
        _release_idle(self._idle)
        if self._owns_client and self._client is not None:
            client, self._client = self._client, None
            with contextlib.suppress(*DRIVER_ERRORS):
                client.close()
        for loop, (_, guard) in list(self._aclients.items()):
            if not loop.is_closed() and not loop.is_running():
                del self._aclients[loop]
                loop.run_until_complete(guard.aclose())

    async def aclose(self) -> None:
        """Close the clients this backend created, the current loop's async one included."""
        self.close()
        entry = self._aclients.pop(asyncio.get_running_loop(), None)
        if entry is not None:
            await entry[1].aclose()

    # -- keys --------------------------------------------------------------

    def _keys(self, partition: Partition) -> list[str]:
        """The partition's keys: r, n, x, t, seq (one hash slot)."""
        base = f"{self.prefix}:{{{partition.key}}}:"
        return [base + "r", base + "n", base + "x", base + "t", base + "seq"]

    def _registry(self, user_key: str) -> str:
        return f"{self.prefix}:{{{user_key}}}:parts"

    def keys_of(self, partition: Partition) -> list[str]:
        """Every key that may hold data of ``partition`` (for tests and tools)."""
        return self._keys(partition)

    def match_pattern(self, partition: Partition) -> str:
        """A ``SCAN MATCH`` pattern that matches exactly ``partition``'s keys."""
        return f"{self.prefix}:{{{partition.key}}}:*"

    # -- running operations -------------------------------------------------

    @staticmethod
    def _args(command: _Command, use_sha: bool) -> tuple[Any, ...]:
        """The wire arguments of ``command``."""
        if isinstance(command, _Eval):
            head = ("EVALSHA", command.script.sha) if use_sha else ("EVAL", command.script.source)
            return (*head, len(command.keys), *command.keys, *command.args)
        return tuple(command)

    def _wire(self, call: _Call, use_sha: bool) -> list[tuple[Any, ...]]:
        """Every command of ``call`` as wire arguments, plus the script reloads an EVAL round carries."""
        args = [self._args(c, use_sha) for c in call.commands]
        if not use_sha and not self.cluster:
            # The server lost its script cache (restart, fail-over, FLUSH):
            # reload the other scripts on the way, so they do not each cost
            # a NOSCRIPT round trip of their own. (A cluster routes SCRIPT
            # LOAD to one node only: there each script reloads on first use.)
            used = {c.script for c in call.commands if isinstance(c, _Eval)}
            args += [("SCRIPT", "LOAD", script.source) for script in _SCRIPTS if script not in used]
        return args

    def _take(self, pool: Any) -> Any:
        """A connection for one round trip: an idle one of ours, else the pool's.

        Connections stay checked out of the client's pool between calls, on
        :attr:`_idle` (a LIFO shared by the threads; ``pop``/``append`` are
        atomic): ``pool.get_connection()``/``release()`` cost a lock, metrics
        and events per round trip, several times the rest of the client's
        work for a small write. What the pool checks before handing out a
        connection is done here too: same process, nothing unread, else
        reconnect. :meth:`close` hands them back. Only for a client the
        backend created: a client passed in may share a bounded pool with
        the rest of the application, which must not find it drained.
        """
        if not self._owns_client:
            return pool.get_connection()
        pid = os.getpid()
        while True:
            try:
                owner, conn = self._idle.pop()
            except IndexError:
                return pool.get_connection()
            if owner is not pool or conn.pid != pid:
                # another client's (closed and replaced) or inherited from the
                # parent process, whose socket it must never touch
                if conn.pid == pid:
                    owner.release(conn)
                continue
            try:
                stale = conn.can_read()  # closed by the server, or a stray reply
            except (rex.ConnectionError, rex.TimeoutError, OSError):
                stale = True
            if stale:
                conn.disconnect()  # the send reconnects
            return conn

    def _give_back(self, pool: Any, conn: Any) -> None:
        if self._owns_client:
            self._idle.append((pool, conn))
        else:
            pool.release(conn)

    def _direct(self, client: Any, call: _Call, use_sha: bool) -> list[Any]:
        """Send ``call`` as one packed write on a connection of ours and read every reply.

        What ``pipeline(transaction=False).execute(raise_on_error=False)``
        does for a standalone client, without the pipeline object: the same
        packing (sent with one ``sendall``, not one per large argument), reply
        parsing and callbacks, error replies returned in place. A connection
        that failed mid-way is dropped, never reused.
        """
        wire = self._wire(call, use_sha)
        pool = client.connection_pool
        self.round_trips += 1  # an attempt counts, as a pipeline did, even if connecting fails
        conn = self._take(pool)
        try:
            conn.send_packed_command(_pack(conn, wire))
            replies: list[Any] = []
            for args in wire:
                try:
                    replies.append(client.parse_response(conn, args[0]))
                except rex.ResponseError as exc:
                    replies.append(exc)
        except BaseException:
            conn.disconnect()
            pool.release(conn)
            raise
        self._give_back(pool, conn)
        return replies

    async def _adirect(self, client: Any, call: _Call, use_sha: bool) -> list[Any]:
        """Async :meth:`_direct` (``redis.asyncio`` standalone client)."""
        wire = self._wire(call, use_sha)
        pool = client.connection_pool
        self.round_trips += 1
        # kept only for the clients we create (see _take); a user's pool gets
        # each connection back after the call
        idle = [] if client is self._aclient else self._aidle.get(pool)
        if idle is None:
            idle = self._aidle.setdefault(pool, [])
        try:
            conn = idle.pop()
        except IndexError:
            conn = await pool.get_connection()
        else:
            try:  # what the pool checks: closed by the server, or a stray reply
                stale = await conn.can_read()
            except (rex.ConnectionError, rex.TimeoutError, OSError):
                stale = True
            if stale:
                await conn.disconnect()  # the send below reconnects
        try:
            if not conn.is_connected:
                await conn.connect()  # before reading the parser: it is set up on connect
            parts = _hiredis_parts(conn)
            replies: list[Any] = []
            if parts is not None:
                await self._around_trip(conn, *parts, _pack(conn, wire), replies, len(wire))
                for i, args in enumerate(wire):
                    reply = _callback(client, args[0], replies[i])
                    replies[i] = await reply if inspect.isawaitable(reply) else reply
            else:
                await conn.send_packed_command(_pack(conn, wire))
                for args in wire:
                    try:
                        replies.append(await client.parse_response(conn, args[0]))
                    except rex.ResponseError as exc:
                        replies.append(exc)
        except BaseException:
            await conn.disconnect()
            await pool.release(conn)
            raise
        if client is self._aclient:
            await pool.release(conn)
        else:
            idle.append(conn)
        return replies

    @staticmethod
    async def _around_trip(
        conn: Any,
        parser: Any,
        reader: Any,
        stream: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        packed: list[bytes],
        replies: list[Any],
        want: int,
    ) -> None:
        """Send ``packed`` on a connected ``redis.asyncio`` connection and read ``want`` replies.

        What ``send_packed_command`` and ``parse_response`` per reply do
        (health check, ``socket_timeout``, error replies, RESP3 push messages
        to the parser's handler; the caller connects), with one timeout for
        the whole round trip and no task: redis-py (with a ``socket_timeout``,
        which the backend always sets) runs each send in a task of its own
        (``asyncio.wait_for``) and arms a timer per reply, so a small write
        took five event-loop turns instead of two, and about a third more
        client CPU (145 vs 93, 194 vs 144, 266 vs 180 µs in three runs, each
        the medians of 10 interleaved rounds of 1,000 writes).
        """
        if conn.health_check_interval:
            await conn.check_health()
        pushes: list[Any] = []
        try:
            async with _atimeout(conn.socket_timeout):
                writer.writelines(packed)
                await writer.drain()
                while not _take_replies(reader, replies, want, pushes):
                    chunk = await stream.read(65536)
                    if not chunk:
                        raise rex.ConnectionError("Connection closed by server.")
                    reader.feed(chunk)
                for push in pushes:
                    await parser.handle_push_response(push)
        except asyncio.TimeoutError as exc:
            raise rex.TimeoutError("Timeout reading from or writing to socket") from exc
        except OSError as exc:
            raise rex.ConnectionError(f"Error while reading from or writing to socket: {exc.args}") from exc

    @staticmethod
    def _results(call: _Call, results: list[Any], use_sha: bool, retried: bool) -> _Reply | None:
        """The reply, ``None`` to re-send with EVAL, or raise the first error.

        A ``WRONGTYPE`` error (a key of ours holding another type: damage,
        not an outage) is no driver error: it stays in place as a
        :class:`CorruptItemError` and is thrown into the operation that sent
        the command (:meth:`_deliver`).
        """
        for res in results:
            if isinstance(res, rex.NoScriptError) and use_sha:
                return None
        corrupt = None
        for i, res in enumerate(results):
            if isinstance(res, BaseException):
                if not (isinstance(res, rex.ResponseError) and str(res).startswith("WRONGTYPE")):
                    raise res
                results[i] = _wrong_type(call.commands[i], res)
                corrupt = corrupt or results[i]
        return _Reply(results, retried, corrupt)

    @staticmethod
    def _deliver(op: _Op, reply: _Reply) -> _Call:
        """Send ``reply`` into ``op`` (throw the damage it met) and return its next call."""
        if reply.corrupt is not None:
            return op.throw(reply.corrupt)
        return op.send(reply)

    def _delay(self, exc: BaseException, attempt: int) -> float:
        """Seconds to wait before retry ``attempt`` (0-based), or re-raise ``exc``."""
        if not is_transient(exc) or attempt >= self.retry_attempts:
            raise exc
        self.retries += 1
        return min(self.retry_backoff * 2**attempt, self.retry_backoff_max) * (0.5 + random.random() / 2)

    def _pipeline(self, client: Any, call: _Call, use_sha: bool) -> Any:
        """The cluster pipeline that sends ``call`` (counted as one round trip)."""
        pipe = client.pipeline(transaction=False)
        for args in self._wire(call, use_sha):
            pipe.execute_command(*args)
        self.round_trips += 1
        return pipe

    def _execute(self, call: _Call) -> _Reply:
        with translate_errors("redis"):
            attempt = 0
            while True:
                try:
                    for use_sha in (True, False):
                        client = self._sync_client()
                        if self.cluster:
                            replies = self._pipeline(client, call, use_sha).execute(raise_on_error=False)
                        else:
                            replies = self._direct(client, call, use_sha)
                        reply = self._results(call, replies[: len(call.commands)], use_sha, attempt > 0 or not use_sha)
                        if reply is not None:
                            return reply
                except DRIVER_ERRORS as exc:
                    time.sleep(self._delay(exc, attempt))
                    attempt += 1

    async def _aexecute(self, call: _Call) -> _Reply:
        with translate_errors("redis"):
            attempt = 0
            while True:
                try:
                    for use_sha in (True, False):
                        client = await self._async_client()
                        if self.cluster:
                            replies = await self._pipeline(client, call, use_sha).execute(raise_on_error=False)
                        else:
                            replies = await self._adirect(client, call, use_sha)
                        reply = self._results(call, replies[: len(call.commands)], use_sha, attempt > 0 or not use_sha)
                        if reply is not None:
                            return reply
                except DRIVER_ERRORS as exc:
                    await asyncio.sleep(self._delay(exc, attempt))
                    attempt += 1

    def _run(self, op: _Op, raw: bool = False) -> Any:
        """Drive ``op`` to its result; ``raw``: replies go in as they are (:meth:`_parallel_op`)."""
        try:
            call = next(op)
            while True:
                reply = self._execute(call)
                call = op.send(reply) if raw else self._deliver(op, reply)
        except StopIteration as done:
            return done.value

    async def _arun(self, op: _Op, raw: bool = False) -> Any:
        """Async :meth:`_run`."""
        try:
            call = next(op)
            while True:
                reply = await self._aexecute(call)
                call = op.send(reply) if raw else self._deliver(op, reply)
        except StopIteration as done:
            return done.value

    # -- operations, written once as generators of round trips --------------

    def _get_op(self, partition: Partition, names: Sequence[str]) -> _Op:
        if not names:
            return []
        fields = [f"{kind}:{name}" for name in names for kind in ("m", "v")]
        reply = yield _Call([("HMGET", self._keys(partition)[0], *fields)])
        values = reply.values[0]
        return [
            None if meta is None else _record(name, meta, value)
            for name, meta, value in zip(names, values[0::2], values[1::2])
        ]

    def _write_op(self, partition: Partition, puts: Sequence[Put], deletes: Sequence[Delete]) -> _Op:
        check_batch(puts, deletes)
        registry = self._registry(partition.user_key)
        raw_name = partition.name.encode("utf-8", "surrogatepass")
        keys = self._keys(partition)
        commands: list[_Command] = [("HSET", registry, partition.key, raw_name)]
        if self._ttl_ms:
            commands.append(("PEXPIRE", registry, self._ttl_ms))
        # Staged values go ahead of the script, set-if-absent (content-addressed:
        # a present field holds the same bytes), so they never pass through Lua.
        ahead = [("HSETNX", keys[0], f"v:{put.name}", put.value) for put in puts if _sent_ahead(put)]
        if ahead and self._ttl_ms:
            # only matters if the script never runs: a new hash must not live forever
            ahead.append(("PEXPIRE", keys[0], self._ttl_ms, "NX"))
        # A partition this backend has not seen filled may well be new: on a
        # standalone server the registration that must follow the script (see
        # the module docstring) rides in the same pipeline, after it, instead
        # of costing its own round trip when the script reports was_empty.
        after = not self.cluster and partition.key not in self._filled
        tail = [("HSET", registry, partition.key, raw_name)] if after else []
        args = _write_args(self._ttl_ms, puts, deletes, ahead=True)
        reply = yield _Call([*commands, *ahead, _Eval(WRITE_SCRIPT, keys, args), *tail])
        out = reply.values[-1 - len(tail)]  # the script's reply
        if out[0] == 2:
            # A concurrent delete removed a staged value between our HSETNX and
            # the script, which then applied nothing: send the values inline.
            args = _write_args(self._ttl_ms, puts, deletes, ahead=False)
            reply = yield _Call([*commands, _Eval(WRITE_SCRIPT, keys, args), *tail])
            out = reply.values[-1 - len(tail)]
        if out[0] == 3:  # damaged stored data: nothing applied (see guarded())
            raise _script_damage(out)
        if out[0] == 0:
            index, meta, value, now_empty = int(out[1]), out[2], out[3], out[4]
            names = [p.name for p in puts] + [d.name for d in deletes]
            if reply.retried:
                # An earlier attempt may have applied this very batch before its
                # reply was lost: then the stored records carry our etags.
                stored = yield from self._get_op(partition, names)
                if _applied_before(puts, deletes, stored):
                    self._seen_filled(partition)
                    return WriteResult(records=[r for r in stored[: len(puts)] if r is not None])
            if now_empty:
                self._filled.pop(partition.key, None)
                yield from self._unregister_op(partition)
            existing = None if meta is None else _record(names[index], meta, value)
            return WriteResult(records=[], conflict=Conflict(index, names[index], existing))
        was_empty, now_empty, metas = out[1], out[2], out[3:]
        records = [_written(put, meta) for put, meta in zip(puts, metas)]
        if now_empty:
            self._filled.pop(partition.key, None)
            yield from self._unregister_op(partition)
            return WriteResult(records=records)
        if was_empty and not after:
            yield _Call([("HSET", registry, partition.key, raw_name)])
        self._seen_filled(partition)
        return WriteResult(records=records)

    def _seen_filled(self, partition: Partition) -> None:
        """Remember that ``partition`` holds records (a bounded set: a guess, never relied on)."""
        if len(self._filled) >= _FILLED_MAX:
            self._filled.clear()
        self._filled[partition.key] = None

    def _unregister_op(self, partition: Partition) -> _Op:
        """Remove ``partition`` from its user's registry, unless it refilled meanwhile."""
        registry = self._registry(partition.user_key)
        yield _Call([("HDEL", registry, partition.key)])
        reply = yield _Call([("EXISTS", self._keys(partition)[1])])
        if reply.values[0]:
            raw_name = partition.name.encode("utf-8", "surrogatepass")
            yield _Call([("HSET", registry, partition.key, raw_name)])

    def _list_op(self, partition: Partition, query: ListQuery) -> _Op:
        args = _list_args(query)
        if args is None:
            return []
        reply = yield _Call([_Eval(LIST_SCRIPT, self._keys(partition)[:4], args)])
        out = reply.values[0]
        if out and out[0].__class__ is int:  # damaged stored data (see guarded())
            raise _script_damage(out)
        records = [_record(out[i], out[i + 1], out[i + 2]) for i in range(0, len(out), 3)]
        if query.tags:
            # the script filters on the metadata's tag pairs (and indexes): the
            # tags a record returns must say the same (children are unfiltered)
            for rec in records:
                if (not query.children or query.at_depth(rec.name)) and any(
                    rec.tags.get(k) != v for k, v in query.tags.items()
                ):
                    raise CorruptItemError(rec.name, "its tags do not match the tag index it was found by")
        return records

    def _partitions_op(self, user: str, space: str) -> _Op:
        """The registry's entries whose partition holds records.

        An entry is ``pk -> raw name``. One whose ``pk`` is not this user's
        (not even ASCII) is foreign and never trusted: skipped. One of this
        user's whose name does not decode or does not give back ``pk`` is
        damaged: :class:`CorruptItemError` if its partition holds records
        (else it names nothing and is skipped).
        """
        probe = Partition(user, space, "")
        reply = yield _Call([("HGETALL", self._registry(probe.user_key))])
        candidates: list[Partition] = []
        damaged: list[str] = []
        for pk, raw in reply.values[0].items():
            try:
                key = pk.decode("ascii")
            except UnicodeDecodeError:
                continue
            if not key.startswith(probe.user_key):
                continue  # never trust a foreign entry
            try:
                part = Partition(user, space, raw.decode("utf-8", "surrogatepass"))
            except UnicodeDecodeError:
                part = None
            if part is not None and part.key == key:
                candidates.append(part)
            else:
                damaged.append(key)
        if not candidates and not damaged:
            return []
        exists = [("EXISTS", self._keys(p)[1]) for p in candidates]
        exists += [("EXISTS", f"{self.prefix}:{{{key}}}:n") for key in damaged]
        reply = yield _Call(exists)
        live = [p for p, exists in zip(candidates, reply.values) if exists]
        for part in candidates:
            if part not in live:  # expired (ttl) or emptied by a client that died
                yield from self._unregister_op(part)
        for key, found in zip(damaged, reply.values[len(candidates) :]):
            if found:
                raise CorruptItemError(
                    decode_component(key[len(probe.user_key) :]) or key,
                    f"the entry of partition {key!r} in the user's registry does not decode to its name",
                )
        return sorted(p.name for p in live)

    def _drop_op(self, partition: Partition) -> _Op:
        reply = yield _Call([_Eval(DROP_SCRIPT, self._keys(partition), [])])
        yield from self._unregister_op(partition)
        return int(reply.values[0])

    def _parallel_op(self, ops: Sequence[_Op]) -> _Op:
        """Drive independent operations together: each round trip sends the
        next call of every one still running, in one pipeline.

        An operation that fails once the round trips started (damaged data
        it read) does not stop the others, which may be writes in the middle
        of their protocol: they run to their end, then the first failure (in
        the order of ``ops``) is raised. A failure before any I/O (invalid
        input) is raised at once, with nothing sent.
        """
        results: list[Any] = [None] * len(ops)
        failed: dict[int, Exception] = {}
        pending: dict[int, _Call] = {}
        for i, op in enumerate(ops):
            try:
                pending[i] = next(op)
            except StopIteration as done:
                results[i] = done.value
        while pending:
            reply = yield _Call([c for call in pending.values() for c in call.commands])
            at, running = 0, {}
            for i, call in pending.items():
                values = reply.values[at : at + len(call.commands)]
                at += len(call.commands)
                corrupt = None
                if reply.corrupt is not None:
                    corrupt = next((v for v in values if isinstance(v, CorruptItemError)), None)
                try:
                    running[i] = self._deliver(ops[i], _Reply(values, reply.retried, corrupt))
                except StopIteration as done:
                    results[i] = done.value
                except Exception as exc:  # noqa: BLE001 - raised below, once the others are done
                    failed[i] = exc
            pending = running
        if failed:
            raise failed[min(failed)]
        return results

    def _op_of(self, op: Any) -> _Op:
        """The round trips of one flow operation (see :class:`checkpointers._flows.Parallel`)."""
        if isinstance(op, GetOp):
            return self._get_op(op.partition, op.names)
        if isinstance(op, ListOp):
            return self._list_op(op.partition, op.query)
        if isinstance(op, WriteOp):
            return self._write_op(op.partition, op.puts, op.deletes)
        if isinstance(op, PartitionsOp):
            return self._partitions_op(op.user, op.space)
        if isinstance(op, DropOp):
            return self._drop_op(op.partition)
        raise TypeError(f"RedisBackend.many cannot run {type(op).__name__} (nested Parallel?)")

    # -- the Backend interface ----------------------------------------------

    def many(self, ops: Sequence[Any]) -> list[Any]:
        """Independent operations in one pipeline per round trip (one for reads)."""
        return self._run(self._parallel_op([self._op_of(op) for op in ops]), raw=True)  # type: ignore[no-any-return]

    async def amany(self, ops: Sequence[Any]) -> list[Any]:
        """Async :meth:`many`."""
        return await self._arun(self._parallel_op([self._op_of(op) for op in ops]), raw=True)  # type: ignore[no-any-return]

    def get(self, partition: Partition, names: Sequence[str]) -> list[Record | None]:
        """Records by name, one ``HMGET``."""
        return self._run(self._get_op(partition, names))  # type: ignore[no-any-return]

    def write(
        self, partition: Partition, puts: Sequence[Put], deletes: Sequence[Delete] = ()
    ) -> WriteResult:
        """One atomic batch: one pipeline carrying one Lua script."""
        return self._run(self._write_op(partition, puts, deletes))  # type: ignore[no-any-return]

    def list(self, partition: Partition, query: ListQuery) -> list[Record]:
        """Records selected by ``query``: one Lua script over the indexes."""
        return self._run(self._list_op(partition, query))  # type: ignore[no-any-return]

    def partitions(self, user: str, space: str) -> list[str]:
        """Raw names of the user's non-empty partitions in ``space``, sorted."""
        return self._run(self._partitions_op(user, space))  # type: ignore[no-any-return]

    def drop(self, partition: Partition) -> int:
        """Delete the partition's keys (no SCAN: the five keys are known)."""
        return self._run(self._drop_op(partition))  # type: ignore[no-any-return]

    async def aget(self, partition: Partition, names: Sequence[str]) -> list[Record | None]:
        """Async :meth:`get`."""
        return await self._arun(self._get_op(partition, names))  # type: ignore[no-any-return]

    async def awrite(
        self, partition: Partition, puts: Sequence[Put], deletes: Sequence[Delete] = ()
    ) -> WriteResult:
        """Async :meth:`write`."""
        return await self._arun(self._write_op(partition, puts, deletes))  # type: ignore[no-any-return]

    async def alist(self, partition: Partition, query: ListQuery) -> list[Record]:
        """Async :meth:`list`."""
        return await self._arun(self._list_op(partition, query))  # type: ignore[no-any-return]

    async def apartitions(self, user: str, space: str) -> list[str]:
        """Async :meth:`partitions`."""
        return await self._arun(self._partitions_op(user, space))  # type: ignore[no-any-return]

    async def adrop(self, partition: Partition) -> int:
        """Async :meth:`drop`."""
        return await self._arun(self._drop_op(partition))  # type: ignore[no-any-return]
