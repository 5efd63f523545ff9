"""Leases: one writer per scope (or thread), fencing tokens, and a recovery scan.

A lease is one record in the leased partition itself, under a reserved name
(:data:`LEASE_NAME`, ``"lease"``) that no item, checkpoint or write name can
be (those all start with ``i/``, ``c/``, ``w/`` or ``b/``). It holds the
owner, the **fencing token**, the expiry (wall-clock milliseconds) and a
released flag, sealed like every record (:mod:`checkpointers._integrity`).
Everything here is a flow (:mod:`checkpointers._flows`) over the five backend
operations, written once: no backend knows about leases.

**Acquire** reads the record. Held by another owner and unexpired:
:class:`~checkpointers.errors.LeaseHeldError` (who, token, until when). Else a
conditional write (create if absent, ``IF_MATCH`` the etag read) of a new
token ``max(previous + 1, floor)`` where ``floor`` is the acquirer's clock in
microseconds since the epoch. Tokens therefore strictly increase per scope
with every new holder (the same owner acquiring again is a new holder); when
the partition is deleted the record goes with it, and the next token starts
from the floor again, which is above every earlier token as long as the
clocks of the acquirers before and after the delete are less apart than the
time between the last acquire before it and the first after it (and fewer
than 1,000 takeovers per millisecond happened).

**Fenced writes.** A batch written with ``lease=L`` carries one more put:
the lease record re-put *unchanged* (same bytes, same etag) with
``Mode.IF_MATCH`` on the etag ``L`` holds. The backend checks that condition
with the batch's own, in the same atomic step, so the batch commits only if
the lease record is still the version ``L`` knows. The record's etag names a
*version of the lease* (holder and expiry), not a physical write: only
acquire, renew and release give it a new etag, so concurrent writes of one
holder never conflict with each other, and an etag once replaced never comes
back (etags are unique). When the condition fails the record is read again:
same token, not released (the holder renewed meanwhile) -> adopt that version
and retry; else :class:`~checkpointers.errors.LeaseLostError`, and nothing of
the batch is visible. A holder past its expiry that nobody has taken over is
still the holder: its writes commit (renew to keep the lease).

**Writes without a lease** (``unleased="refuse"``, the default) carry "nobody
holds the lease" as a condition of their own batch, so an acquire that lands
before the write refuses it atomically and one that lands after it comes
after it, whatever the timing. On a backend whose batches take one more
condition at no cost (``Backend.inline_conditions``: memory, and SQLite,
Redis, PostgreSQL once they declare it) that is **one backend write**, no read:
the batch carries the last version of the lease record this process saw
nobody holding (a bounded :class:`LeaseMemo`), re-put unchanged with
``IF_MATCH``; when it knows none, a **vacant** lease record (owner ``""``,
token 0, released) created with ``CREATE`` in the same batch, which later
writes then carry. When that condition fails, the record the conflict names
(else read) decides: held (unexpired, not released) -> ``LeaseHeldError``,
nothing written; else its version is adopted and the batch retried. A vacant
record is "no lease" everywhere: :func:`read_flow` and ``current_lease`` say
None, the recovery scans skip it (it is released), an acquire over it is a
conditional write like any other (token from the clock floor), and
``copy_thread`` does not copy it. A batch of deletes only, with no version
known, creates nothing (the vacant record would outlive the items deleted):
it reads the record first. On the other backends (S3, and any backend that
does not declare it) every write without a lease reads the record first: held -> ``LeaseHeldError``; expired or
released -> the batch carries the unchanged re-put as above; absent or
vacant -> the batch is written as is: a *first* acquire racing with it
(between the read and the write, one round trip) may see the write land
after it. ``unleased="allow"`` skips all this (the scope's lease is then
advisory for unleased writers).

**Renew / release** are conditional writes of the record (``IF_MATCH``);
on a lease taken over (other token), released, or gone: ``LeaseLostError``.
Releasing twice is a no-op. A released record keeps its token (the next
acquire goes above it) and is skipped by the recovery scan.

**Clocks.** Expiry is the holder's clock plus ``ttl``; an acquirer compares it
with its own clock, so a clock ``d`` ahead takes over ``d`` early. Safety does
not depend on clocks: a holder taken over early is fenced out all the same;
only *when* a takeover may happen does. Keep clocks synchronized (NTP) well
within the ttl.

**What is atomic with what, per backend.** Memory, SQLite, Redis (every
transport and Cluster: the lease lives in the partition, so in the thread's
hash slot): the lease condition and the batch are one lock / transaction /
Lua script, so a stale holder's batch commits nothing, whatever the timing.
S3: the lease record's re-put is the batch's *fence*, applied alone right
after the redo-log manifest and conditioned on the S3 ETag read; an acquire
landing before it (also inside the write call) refuses the whole batch
(``LeaseLostError``, nothing visible), one landing after it comes after the
batch. Assumes the writer reaches its fence within the backend's recovery
``lease`` (60 s). See ``s3.py``, "Fenced writes (leases)", and
``tests/test_leases.py`` (the S3 race tests).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ._flows import Flow, GetOp, WriteOp, arun, get, listing, new_etag, parallel, partitions, run, write
from ._names import Partition, decode_component, encode_component
from .backends.base import Conflict, Delete, ListQuery, Mode, Put, Record, WriteResult
from .errors import ConcurrencyError, CorruptItemError, InvalidArgumentError, LeaseHeldError, LeaseLostError

if TYPE_CHECKING:
    from ._integrity import Integrity
    from .backends.base import Backend

__all__ = [
    "ATTEMPTS",
    "HeldLease",
    "LeaseRegistry",
    "LEASE_NAME",
    "Clock",
    "Lease",
    "LeaseInfo",
    "LeaseMemo",
    "LeaseSite",
    "LeaseState",
    "acquire",
    "acquire_flow",
    "expired_flow",
    "expired_listed_flow",
    "guarded_write_flow",
    "listed_site",
    "read_flow",
    "release_flow",
    "renew_flow",
    "stored_flow",
    "unleased_write_flow",
]

#: The reserved record name of a partition's lease (no item/saver name can be it).
LEASE_NAME = "lease"
#: How often a lease operation reads the record again when it keeps moving under it.
ATTEMPTS = 64
#: A wall clock in seconds since the epoch (``time.time``); injectable for tests.
Clock = Callable[[], float]
#: The owner of a vacant lease record (no holder's owner is empty: :func:`check_owner`).
VACANT_OWNER = ""
#: How many lease records' versions a :class:`LeaseMemo` keeps by default.
MEMO_SIZE = 2048
_MAX_OWNER = 256


def now_ms(clock: Clock) -> int:
    """The clock's time in whole milliseconds since the epoch."""
    return int(clock() * 1000)


def check_owner(owner: object) -> str:
    """An owner is a non-empty string of at most 256 characters."""
    if not isinstance(owner, str) or not 1 <= len(owner) <= _MAX_OWNER:
        raise InvalidArgumentError("owner", f"must be a string of 1-{_MAX_OWNER} characters, got {owner!r}")
    return owner


def check_ttl(ttl: object) -> int:
    """A ttl in seconds (positive, finite), as whole milliseconds (at least 1)."""
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not 0 < ttl < 10**9:
        raise InvalidArgumentError("ttl", f"must be a number of seconds > 0, got {ttl!r}")
    return max(1, int(ttl * 1000))


@dataclass(frozen=True)
class LeaseSite:
    """Where one lease record lives: its partition, its record name, the caller's label for errors."""

    integrity: Integrity
    partition: Partition
    label: str
    name: str = LEASE_NAME


@dataclass(frozen=True)
class LeaseInfo:
    """A lease as stored: what :meth:`Store.current_lease` and the recovery scan return.

    ``expires_at`` is in seconds since the epoch (the holder's clock).
    """

    scope: str
    owner: str
    token: int
    expires_at: float
    released: bool


@dataclass(frozen=True)
class LeaseState:
    """One version of a lease record: its fields and the record as stored."""

    owner: str
    token: int
    expires_ms: int
    released: bool
    record: Record

    @property
    def vacant(self) -> bool:
        """A record written by writes without a lease, that no holder ever had: "no lease"."""
        return self.token == 0 and self.owner == VACANT_OWNER

    def held(self, at_ms: int) -> bool:
        """Whether the lease keeps others out at ``at_ms``: not released and not expired."""
        return not self.released and at_ms < self.expires_ms

    def guard(self) -> Put:
        """This version re-put unchanged, on condition that it is still the stored one.

        Built once per version and reused by every write that carries it (a
        Put is immutable, and no backend changes the tags it is given).
        """
        put: Put | None = self.__dict__.get("_guard")
        if put is None:
            r = self.record
            put = Put(r.name, r.value, r.digest, r.etag, dict(r.tags), Mode.IF_MATCH, r.etag)
            object.__setattr__(self, "_guard", put)  # a cache, not a field: equality and repr ignore it
        return put

    def info(self, scope: str) -> LeaseInfo:
        return LeaseInfo(scope, self.owner, self.token, self.expires_ms / 1000, self.released)


def _encode(owner: str, token: int, expires_ms: int, released: bool) -> bytes:
    body = {"owner": owner, "token": token, "expires_ms": expires_ms, "released": released}
    return json.dumps(body, separators=(",", ":"), sort_keys=True).encode()


def decode(site: LeaseSite, record: Record) -> LeaseState:
    """The lease in ``record`` (seal and fields checked), else :class:`CorruptItemError`."""
    label = f"{site.label} (lease record)"
    record = site.integrity.check(site.partition, record, label)
    try:
        body = json.loads(record.value)
        owner, token, expires, released = body["owner"], body["token"], body["expires_ms"], body["released"]
    except (ValueError, TypeError, KeyError) as exc:
        raise CorruptItemError(label, f"not a lease record: {exc}") from None
    if not (isinstance(owner, str) and type(token) is int and type(expires) is int and type(released) is bool):
        raise CorruptItemError(label, "a lease field has the wrong type")
    return LeaseState(owner, token, expires, released, record)


def stored_flow(site: LeaseSite) -> Flow[LeaseState | None]:
    """The stored lease record (a vacant one too), or None."""
    (record,) = yield from get(site.partition, [site.name])
    return None if record is None else decode(site, record)


def read_flow(site: LeaseSite) -> Flow[LeaseState | None]:
    """The stored lease, or None (also for a vacant record: nobody ever held it)."""
    state = yield from stored_flow(site)
    return None if state is None or state.vacant else state


def _write_flow(
    site: LeaseSite, owner: str, token: int, expires_ms: int, released: bool, current: LeaseState | None
) -> Flow[LeaseState | None]:
    """Write a new version over ``current`` (create if None); None when the record moved meanwhile."""
    value = _encode(owner, token, expires_ms, released)
    mode, match = (Mode.CREATE, None) if current is None else (Mode.IF_MATCH, current.record.etag)
    put = site.integrity.put(site.partition, site.name, value, etag=new_etag(), mode=mode, if_match=match)
    result: WriteResult = yield from write(site.partition, (put,))
    if result.conflict is not None:
        return None
    return LeaseState(owner, token, expires_ms, released, _as_stored(put, result.records[0].seq))


def acquire_flow(site: LeaseSite, owner: str, ttl_ms: int, clock: Clock) -> Flow[LeaseState]:
    """Take the lease for ``owner`` with a token above every earlier one; see the module docstring."""
    for _ in range(ATTEMPTS):
        current = yield from stored_flow(site)
        at = now_ms(clock)
        if current is not None and current.owner != owner and current.held(at):
            raise LeaseHeldError(site.label, current.owner, current.token, current.expires_ms / 1000)
        floor = at * 1000
        token = floor if current is None else max(current.token + 1, floor)
        state = yield from _write_flow(site, owner, token, at + ttl_ms, False, current)
        if state is not None:
            return state
    raise ConcurrencyError(f"{site.label} (lease record)", None)


def _lost(site: LeaseSite, ours: LeaseState, current: LeaseState | None) -> LeaseLostError:
    if current is not None and current.vacant:
        current = None
    if current is None:
        reason = "its record is gone (the scope was deleted)"
    elif current.token != ours.token:
        reason = f"owner {current.owner!r} took it over with fencing token {current.token}"
    else:
        reason = "it was released"
    return LeaseLostError(
        site.label,
        ours.owner,
        ours.token,
        None if current is None else current.owner,
        None if current is None else current.token,
        reason,
    )


def mine_flow(site: LeaseSite, ours: LeaseState, released_ok: bool = False) -> Flow[LeaseState]:
    """The stored version of *our* lease (same token, not released), else :class:`LeaseLostError`."""
    current = yield from read_flow(site)
    if current is None or current.token != ours.token or (current.released and not released_ok):
        raise _lost(site, ours, current)
    return current


def renew_flow(site: LeaseSite, ours: LeaseState, ttl_ms: int, clock: Clock) -> Flow[LeaseState]:
    """Extend our lease to now + ttl; :class:`LeaseLostError` if it is not ours any more (or released)."""
    if ours.released:
        raise _lost(site, ours, ours)
    state = ours
    for _ in range(ATTEMPTS):
        new = yield from _write_flow(site, state.owner, state.token, now_ms(clock) + ttl_ms, False, state)
        if new is not None:
            return new
        state = yield from mine_flow(site, ours)
    raise ConcurrencyError(f"{site.label} (lease record)", state.record.etag)


def release_flow(site: LeaseSite, ours: LeaseState, clock: Clock) -> Flow[LeaseState]:
    """Mark our lease released (idempotent); :class:`LeaseLostError` if it was taken over."""
    state = ours
    for _ in range(ATTEMPTS):
        if state.released:
            return state
        new = yield from _write_flow(site, state.owner, state.token, now_ms(clock), True, state)
        if new is not None:
            return new
        state = yield from mine_flow(site, ours, released_ok=True)
    raise ConcurrencyError(f"{site.label} (lease record)", state.record.etag)


def _refuse_held(site: LeaseSite, state: LeaseState | None, clock: Clock) -> LeaseState | None:
    """``state`` if nobody holds the lease by it; else LeaseHeldError (for a write without a lease)."""
    if state is not None and state.held(now_ms(clock)):
        raise LeaseHeldError(site.label, state.owner, state.token, state.expires_ms / 1000, writing=True)
    return state


def free_flow(site: LeaseSite, clock: Clock) -> Flow[LeaseState | None]:
    """For a write without a lease: the stored lease if nobody holds it (None: absent, vacant), else LeaseHeldError."""
    return _refuse_held(site, (yield from read_flow(site)), clock)


class LeaseMemo:
    """The last version of lease records seen nobody holding, by site; bounded, thread-safe.

    What lets a write without a lease carry its condition without reading the
    record first (:func:`unleased_write_flow`). A version is only ever used as
    a condition, checked by the backend in the write itself, never returned
    as data: a stale one (the lease acquired since, the partition deleted by
    another process) only makes that condition fail, and the write then looks
    at the record. At most ``size`` sites, the longest unused forgotten first.
    """

    def __init__(self, size: int = MEMO_SIZE) -> None:
        self.size = size
        self._states: dict[tuple[str, str], LeaseState] = {}
        self._lock = threading.Lock()

    @classmethod
    def for_backend(cls, backend: Backend) -> LeaseMemo | None:
        """A memo for writes without a lease on ``backend``, or None where they read the lease record first.

        Only a backend whose batches take one more condition at no cost
        (``Backend.inline_conditions``) gets one: what each face passes to
        :func:`guarded_write_flow` as its ``memo``.
        """
        return cls() if backend.inline_conditions else None

    def get(self, site: LeaseSite) -> LeaseState | None:
        """The version last seen at ``site``, or None."""
        return self._states.get((site.partition.key, site.name))

    def put(self, site: LeaseSite, state: LeaseState | None) -> None:
        """Remember ``state`` as the version at ``site`` (None: forget it)."""
        key = (site.partition.key, site.name)
        with self._lock:
            self._states.pop(key, None)
            if state is not None:
                self._states[key] = state
                if len(self._states) > self.size:
                    del self._states[next(iter(self._states))]

    def __len__(self) -> int:
        return len(self._states)


def _vacant_put(site: LeaseSite) -> Put:
    """A vacant lease record, created (``CREATE``) by a write without a lease that knows no version."""
    value = _encode(VACANT_OWNER, 0, 0, True)
    return site.integrity.put(site.partition, site.name, value, etag=new_etag(), mode=Mode.CREATE)


def _found_flow(site: LeaseSite, existing: Record | None) -> Flow[LeaseState | None]:
    """The lease record a refused condition found: the one the conflict carries, else read."""
    if existing is not None and existing.value:
        return decode(site, existing)
    return (yield from stored_flow(site))


def unleased_write_flow(
    site: LeaseSite, puts: Sequence[Put], deletes: Sequence[Delete], *, clock: Clock, memo: LeaseMemo
) -> Flow[WriteResult]:
    """A batch without a lease carrying "nobody holds it" itself: one backend write (module docstring).

    Results as :func:`guarded_write_flow`. Only for backends whose batches
    take one more condition at no cost (``Backend.inline_conditions``).
    """
    known = state = memo.get(site)
    if state is None and not puts:  # deletes only: create nothing, read first
        state = yield from free_flow(site, clock)
    for _ in range(ATTEMPTS):
        if state is None and not puts:
            return (yield from write(site.partition, (), tuple(deletes)))
        guard = _vacant_put(site) if state is None else state.guard()
        result: WriteResult = yield WriteOp(site.partition, (guard, *puts), tuple(deletes))  # the hot path: no helper
        c = result.conflict
        if c is None:
            if state is None:
                state = LeaseState(VACANT_OWNER, 0, 0, True, _as_stored(guard, result.records[0].seq))
            if state is not known:
                memo.put(site, state)
            return WriteResult(result.records[1:])
        if c.index > 0:
            return WriteResult((), Conflict(c.index - 1, c.name, c.existing))
        found = yield from _found_flow(site, c.existing)
        memo.put(site, None)
        known, state = None, _refuse_held(site, found, clock)
    raise ConcurrencyError(f"{site.label} (lease record)", None if state is None else state.record.etag)


def _as_stored(put: Put, seq: int) -> Record:
    """The record ``put`` stored, with the ``seq`` the backend gave it."""
    return Record(put.name, put.value, put.tags, put.etag, put.digest, seq)


def guarded_write_flow(
    site: LeaseSite,
    lease: Lease | None,
    puts: Sequence[Put],
    deletes: Sequence[Delete],
    *,
    clock: Clock,
    refuse_unleased: bool = True,
    memo: LeaseMemo | None = None,
) -> Flow[WriteResult]:
    """One atomic batch checked against the lease record, in the same backend write.

    Returns the batch's own result (records of ``puts``, or the conflict of
    one of *its* conditions, indexes as in ``puts`` then ``deletes``); lease
    problems raise :class:`LeaseLostError` / :class:`LeaseHeldError`. A
    write without a lease with a ``memo`` (the backend's batches take one
    more condition at no cost) is :func:`unleased_write_flow`; without one,
    it reads the lease record first.
    """
    if lease is not None:
        lease.check_site(site)
        state: LeaseState | None = lease.state
        if lease.state.released:
            raise _lost(site, lease.state, lease.state)
    elif refuse_unleased and memo is not None:
        return (yield from unleased_write_flow(site, puts, deletes, clock=clock, memo=memo))
    elif refuse_unleased:
        state = yield from free_flow(site, clock)
    else:
        return (yield from write(site.partition, tuple(puts), tuple(deletes)))
    for _ in range(ATTEMPTS):
        guard = () if state is None else (state.guard(),)
        result: WriteResult = yield from write(site.partition, guard + tuple(puts), tuple(deletes))
        c = result.conflict
        if c is None:
            return WriteResult(result.records[len(guard) :])
        if not guard or c.index > 0:
            return WriteResult((), Conflict(c.index - len(guard), c.name, c.existing))
        if lease is None:
            state = yield from free_flow(site, clock)
        else:
            state = yield from mine_flow(site, lease.state)
            lease.adopt(state)
    raise ConcurrencyError(f"{site.label} (lease record)", None if state is None else state.record.etag)


def expired_flow(
    integrity: Integrity, user: str, space: str, limit: int, clock: Clock, chunk: int = 64
) -> Flow[list[LeaseInfo]]:
    """Up to ``limit`` partitions of ``user`` in ``space`` whose lease expired unreleased, in name order.

    One ``partitions`` call, then the lease records read ``chunk`` at a time
    (one :class:`Parallel` of gets: one pipeline on Redis) until ``limit``
    are found: at most one get per partition.
    """
    names = sorted((yield from partitions(user, space)))
    found: list[LeaseInfo] = []
    for start in range(0, len(names), chunk):
        if len(found) >= limit:
            break
        sites = [LeaseSite(integrity, Partition(user, space, n), n) for n in names[start : start + chunk]]
        results = yield from parallel([GetOp(s.partition, [s.name]) for s in sites])
        at = now_ms(clock)
        for site, (record,) in zip(sites, results, strict=True):
            state = None if record is None else decode(site, record)
            if state is not None and not state.released and state.expires_ms <= at:
                found.append(state.info(site.label))
    return found[:limit]


def expired_listed_flow(
    integrity: Integrity, partition: Partition, prefix: str, limit: int, clock: Clock
) -> Flow[list[LeaseInfo]]:
    """Up to ``limit`` leases named ``<prefix><encoded label>`` in one partition that expired unreleased.

    For a face that keeps several leases in one partition (the Agent
    Framework storage: one partition per user, one lease per run, named with
    :func:`listed_site`): one listing of ``prefix``, in name order.
    """
    records = yield from listing(partition, ListQuery(prefix=prefix))
    at, found = now_ms(clock), []
    for record in records:
        label = decode_component(record.name[len(prefix) :]) or record.name
        state = decode(LeaseSite(integrity, partition, label, record.name), record)
        if not state.released and state.expires_ms <= at:
            found.append(state.info(label))
    return found[:limit]


def listed_site(integrity: Integrity, partition: Partition, prefix: str, label: str) -> LeaseSite:
    """The site of one of several leases in ``partition``: ``<prefix><encode_component(label)>``."""
    return LeaseSite(integrity, partition, label, prefix + encode_component(label))


class Lease:
    """A lease held on one scope (or thread): its owner, fencing token and expiry.

    Made by :meth:`Store.acquire_lease` (or a face's ``lease``). Pass it as
    ``lease=`` to writes to fence them. ``renew()`` / ``release()`` (and
    ``arenew`` / ``arelease``); ``with`` / ``async with`` releases on exit.
    Safe to share between threads: concurrent writes under one lease do not
    conflict with each other.
    """

    def __init__(self, site: LeaseSite, backend: Backend, clock: Clock, state: LeaseState, ttl_ms: int) -> None:
        self.site = site
        self._backend = backend
        self._clock = clock
        self._state = state
        self._ttl_ms = ttl_ms
        self._lock = threading.Lock()

    @property
    def state(self) -> LeaseState:
        """The version of the lease record this holder last saw."""
        return self._state

    def adopt(self, state: LeaseState) -> None:
        """Take ``state`` as the current version (same token: our own renewal seen by another thread)."""
        with self._lock:
            if state.token == self._state.token:
                self._state = state

    def check_site(self, site: LeaseSite) -> None:
        """Refuse a write to another partition (or user) than the one this lease is on."""
        if site.partition != self.site.partition or site.name != self.site.name:
            raise InvalidArgumentError(
                "lease", f"the lease is on {self.site.label!r}, not on {site.label!r} (or belongs to another user)"
            )

    @property
    def scope(self) -> str:
        return self.site.label

    @property
    def owner(self) -> str:
        return self._state.owner

    @property
    def token(self) -> int:
        """The fencing token: strictly greater than every earlier holder's on this scope."""
        return self._state.token

    @property
    def expires_at(self) -> float:
        """When the lease expires unless renewed, in seconds since the epoch (this holder's clock)."""
        return self._state.expires_ms / 1000

    @property
    def ttl(self) -> float:
        """The ttl in seconds that :meth:`renew` extends by default."""
        return self._ttl_ms / 1000

    @property
    def released(self) -> bool:
        return self._state.released

    def remaining(self) -> float:
        """Seconds until expiry by this holder's clock (negative once expired)."""
        return self.expires_at - self._clock()

    def _renew(self, ttl: float | None) -> Flow[LeaseState]:
        ttl_ms = self._ttl_ms if ttl is None else check_ttl(ttl)
        return renew_flow(self.site, self._state, ttl_ms, self._clock)

    def renew(self, ttl: float | None = None) -> Lease:
        """Extend the lease to now + ``ttl`` (default: the ttl it was acquired with); returns self."""
        self.adopt(run(self._renew(ttl), self._backend))
        return self

    async def arenew(self, ttl: float | None = None) -> Lease:
        """Async :meth:`renew`."""
        self.adopt(await arun(self._renew(ttl), self._backend))
        return self

    def release(self) -> None:
        """Release the lease (idempotent): the next acquire need not wait for the expiry."""
        self.adopt(run(release_flow(self.site, self._state, self._clock), self._backend))

    async def arelease(self) -> None:
        """Async :meth:`release`."""
        self.adopt(await arun(release_flow(self.site, self._state, self._clock), self._backend))

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        try:
            self.release()
        except LeaseLostError:
            if exc_type is None:
                raise

    async def __aenter__(self) -> Lease:
        return self

    async def __aexit__(self, exc_type: object, *exc: object) -> None:
        try:
            await self.arelease()
        except LeaseLostError:
            if exc_type is None:
                raise

    def __repr__(self) -> str:
        return f"Lease(scope={self.scope!r}, owner={self.owner!r}, token={self.token}, expires_at={self.expires_at})"


def acquire(site: LeaseSite, backend: Backend, owner: str, ttl: float, clock: Clock) -> Flow[Lease]:
    """The flow of acquiring a :class:`Lease` (for the faces: ``run``/``arun`` it)."""
    ttl_ms = check_ttl(ttl)
    state = yield from acquire_flow(site, check_owner(owner), ttl_ms, clock)
    return Lease(site, backend, clock, state, ttl_ms)


# The faces' holding of leases (a registry, background renewal) lives in
# _saver_leases, which builds on this module; its two public types are
# reachable from here so adapters import public names only.
from ._saver_leases import HeldLease, LeaseRegistry  # noqa: E402
