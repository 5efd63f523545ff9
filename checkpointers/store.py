"""The item API: scopes, items, tags, etags, append-only steps, atomic batches.

A :class:`Store` is bound to one user (``for_user``) and reaches only that
user's partitions. Every check (names, the size cap, the tag limit) runs
before the first backend call, so a bad item never reaches storage.

>>> from checkpointers import Store
>>> from checkpointers.backends.memory import MemoryBackend
>>> store = Store(MemoryBackend()).for_user("alice")
>>> item = store.create_item("runs/r1", "plan", {"todo": 3}, tags={"kind": "plan"})
>>> store.get_item("runs/r1", "plan").value
{'todo': 3}
>>> store.append_step("runs/r1", "1", "fetched").key
'steps/1'
>>> store.append_step("runs/r1", "1", "fetched").value   # identical: a no-op
'fetched'

One writer per scope: a lease with a fencing token fences every write made
under it (see :mod:`checkpointers.leases`):

>>> with store.acquire_lease("runs/r1", owner="worker-1", ttl=30) as lease:
...     _ = store.set_item("runs/r1", "plan", {"todo": 2}, lease=lease)
...     store.acquire_lease("runs/r1", owner="worker-2", ttl=30)  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
checkpointers.errors.LeaseHeldError: 'runs/r1' is leased by owner 'worker-1' (fencing token ...
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ._flows import DELETE_ATTEMPTS, Flow, arun, get, listing, new_etag, raise_conflict, run
from ._integrity import Integrity, IntegrityKeys
from ._names import (
    ANONYMOUS_USER,
    DEFAULT_MAX_ITEM_BYTES,
    Partition,
    check_size,
    check_tags,
    decode_component,
    encode_prefixable,
    validate_key,
    validate_scope,
    validate_user,
)
from .backends.base import Backend, Delete, ListQuery, Mode, Put, Record, WriteResult
from .errors import ConcurrencyError, CorruptItemError, InvalidArgumentError, IsolationError, UnserializableValueError
from .leases import Clock, Lease, LeaseInfo, LeaseMemo, LeaseSite, acquire, expired_flow, guarded_write_flow, read_flow

if TYPE_CHECKING:
    from .effects import EffectBlock

__all__ = ["Batch", "Item", "STEP_PREFIX", "Store", "item_name"]

SPACE = "items"
STEP_PREFIX = "steps/"
_BYTES, _JSON = b"b", b"j"


@dataclass(frozen=True)
class Item:
    """A stored item as callers see it.

    ``value`` is ``bytes`` if bytes were stored, else the decoded JSON value.
    ``etag`` changes on every write; ``digest`` is the SHA-256 (hex) of the
    stored bytes; ``seq`` is the store-assigned write sequence (higher = newer).
    """

    scope: str
    key: str
    value: Any
    tags: Mapping[str, str]
    etag: str
    digest: str
    seq: int


def encode_value(key: str, value: Any, limit: int) -> bytes:
    """Serialize ``value`` (bytes or JSON-able) and enforce the size cap.

    The cap applies to the serialized payload; the one-byte type marker in
    front of it is not counted.
    """
    if isinstance(value, (bytes, bytearray, memoryview)):
        payload, marker = bytes(value), _BYTES
    else:
        try:
            payload = json.dumps(
                value, ensure_ascii=False, allow_nan=False, separators=(",", ":"), sort_keys=True
            ).encode("utf-8", "strict")
        except (TypeError, ValueError, RecursionError, UnicodeEncodeError) as exc:
            reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)[:200]
            raise UnserializableValueError(
                f"item {key!r}",
                f"a value of type {type(value).__name__} is neither bytes nor JSON-serializable: {reason}",
            ) from None
        marker = _JSON
    check_size(key, len(payload), limit)
    return marker + payload


def decode_value(key: str, data: bytes) -> Any:
    """Inverse of :func:`encode_value`; damaged data raises CorruptItemError."""
    marker, payload = data[:1], data[1:]
    if marker == _BYTES:
        return payload
    if marker == _JSON:
        try:
            return json.loads(payload)
        except ValueError as exc:
            raise CorruptItemError(key, f"JSON decode failed: {exc}") from exc
    raise CorruptItemError(key, f"unknown value marker {marker!r}")


def item_name(key: str) -> str:
    """The backend record name of item ``key`` (inside its scope's partition); for tools and the conformance kit."""
    return "i/" + encode_prefixable(key)


_name = item_name


def _to_item(integrity: Integrity, partition: Partition, scope: str, key: str, record: Record) -> Item:
    record = integrity.check(partition, record, key)
    return Item(
        scope,
        key,
        decode_value(key, record.value),
        dict(record.tags),
        record.etag,
        record.digest.split(".", 1)[0],
        record.seq,
    )


def _key_of(record: Record) -> str:
    """The caller's key of an item record (inverse of :func:`_name`)."""
    key = decode_component(record.name[2:]) if record.name.startswith("i/_") else None
    if key is None:
        raise CorruptItemError(record.name, "not the name of an item record")
    return key


def _check_etag(if_match: object) -> str | None:
    """``if_match`` must be None or a non-empty etag string."""
    if if_match is None:
        return None
    if not isinstance(if_match, str) or not if_match:
        raise InvalidArgumentError(
            "if_match", f"must be a non-empty etag string from a stored item, or None; got {if_match!r}"
        )
    return if_match


def _check_limit(limit: object) -> int | None:
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise InvalidArgumentError("limit", f"must be None or an int >= 0, got {limit!r}")
    return limit


class Batch:
    """Writes collected for one scope and applied atomically: all or nothing.

    Use ``with store.batch(scope) as b:`` (or ``async with store.abatch(...)``);
    the batch is applied when the block exits without an exception. Each
    method checks its input at once, so a bad item raises before anything is
    written.
    """

    def __init__(self, store: Store, scope: str, lease: Lease | None = None) -> None:
        self._store = store
        self.scope = validate_scope(scope)
        self._partition = store.partition(self.scope)
        self._site = store.lease_site(self.scope)
        if lease is not None:
            if not isinstance(lease, Lease):
                raise InvalidArgumentError("lease", f"must be a Lease from acquire_lease() or None, got {lease!r}")
            lease.check_site(self._site)
        self._lease = lease
        self._names: set[str] = set()
        self._puts: list[Put] = []
        self._deletes: list[Delete] = []
        self._put_labels: list[str] = []
        self._delete_labels: list[str] = []
        #: The stored items, in put order, once the batch is applied.
        self.items: list[Item] = []

    def create(self, key: str, value: Any, *, tags: Mapping[str, str] | None = None) -> Batch:
        """Add a create (fails the batch if ``key`` exists)."""
        return self._put(key, value, tags, Mode.CREATE, None)

    def set(
        self, key: str, value: Any, *, tags: Mapping[str, str] | None = None, if_match: str | None = None
    ) -> Batch:
        """Add an upsert, or an etag-checked write when ``if_match`` is given."""
        if_match = _check_etag(if_match)
        return self._put(key, value, tags, Mode.UPSERT if if_match is None else Mode.IF_MATCH, if_match)

    def append_step(self, step: str, value: Any, *, tags: Mapping[str, str] | None = None) -> Batch:
        """Add an append-only write of ``steps/<step>``."""
        return self._put(STEP_PREFIX + step, value, tags, Mode.APPEND, None)

    def delete(self, key: str, *, if_match: str | None = None) -> Batch:
        """Add a delete (absent is fine unless ``if_match`` is given)."""
        validate_key(key)
        self._deletes.append(Delete(self._claim(key), _check_etag(if_match)))
        self._delete_labels.append(key)
        return self

    def _claim(self, key: str) -> str:
        """The record name of ``key``; a key named twice in one batch is refused here."""
        name = _name(key)
        if name in self._names:
            raise InvalidArgumentError(
                "key", f"{key!r} is already in this batch; a batch may name each key once"
            )
        self._names.add(name)
        return name

    def _put(self, key: str, value: Any, tags: Any, mode: Mode, if_match: str | None) -> Batch:
        validate_key(key)
        tags = check_tags(key, tags)
        data = encode_value(key, value, self._store.max_item_bytes)
        name = self._claim(key)
        put = self._store.integrity.put(
            self._partition, name, data, etag=new_etag(), tags=tags, mode=mode, if_match=if_match
        )
        self._puts.append(put)
        self._put_labels.append(key)
        return self

    def flow(self) -> Flow[list[Item]]:
        """The write flow of this batch (used by ``Store.batch``/``abatch``)."""
        result = yield from self._store.write_flow(self._site, self._puts, self._deletes, self._lease)
        raise_conflict(result, self._puts, self._deletes, self._put_labels + self._delete_labels)
        integrity = self._store.integrity
        # result.records[i] is the stored record of puts[i] (WriteResult), one per put label
        self.items = [
            _to_item(integrity, self._partition, self.scope, k, r)
            for k, r in zip(self._put_labels, result.records, strict=True)
        ]
        return self.items

    def __enter__(self) -> Batch:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            run(self.flow(), self._store.backend)

    async def __aenter__(self) -> Batch:
        return self

    async def __aexit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            await arun(self.flow(), self._store.backend)


class Store:
    """Scopes and items for one user over any :class:`Backend`.

    ``max_item_bytes`` caps each serialized value (default 1 MiB).
    ``require_user=True`` makes the unbound store refuse every call with
    :class:`IsolationError` until ``for_user()`` names a user.
    ``integrity_key`` (one secret, or a list: the first signs, all verify;
    default: the ``CHECKPOINTERS_INTEGRITY_KEY`` environment variable) makes
    every record's seal an HMAC that storage-level writers cannot forge;
    without it the seal still binds each record to its place (see
    :mod:`checkpointers._integrity`). ``accept_unsealed`` reads records
    without a trustworthy seal (default: only without a key).

    Leases (:meth:`acquire_lease`, :mod:`checkpointers.leases`): ``clock``
    (seconds since the epoch, default ``time.time``) dates them;
    ``unleased="refuse"`` (default) refuses a write without ``lease=`` to a
    scope another owner holds (:class:`LeaseHeldError`): the write carries
    that condition itself (one backend write where the backend declares
    ``inline_conditions``, else one read of the lease record first);
    ``"allow"`` skips the check.

    Retention is the backend's, not the store's: a scope expires ``ttl``
    seconds after its last write when the backend was opened with a ttl
    (``Store(open_backend("sqlite:///s.db?ttl=86400"))``, or
    ``SqliteBackend(path, ttl=..., refresh_on_read=...)``); an expired scope
    reads as empty and its next write starts afresh. See
    :class:`~checkpointers.backends.base.Retention`. (The lease clock above
    is separate: it dates leases, not expiries.)
    """

    def __init__(
        self,
        backend: Backend,
        *,
        user: str | None = None,
        max_item_bytes: int = DEFAULT_MAX_ITEM_BYTES,
        require_user: bool = False,
        integrity_key: IntegrityKeys = None,
        accept_unsealed: bool | None = None,
        integrity: Integrity | None = None,
        clock: Clock = time.time,
        unleased: Literal["refuse", "allow"] = "refuse",
    ) -> None:
        if unleased not in ("refuse", "allow"):
            raise InvalidArgumentError("unleased", f"must be 'refuse' or 'allow', got {unleased!r}")
        if isinstance(max_item_bytes, bool) or not isinstance(max_item_bytes, int) or max_item_bytes <= 0:
            raise InvalidArgumentError("max_item_bytes", f"must be a positive int, got {max_item_bytes!r}")
        self.backend = backend
        self.user = None if user is None else validate_user(user)
        self.max_item_bytes = max_item_bytes
        self.require_user = require_user
        self.integrity = integrity or Integrity(integrity_key, accept_unsealed=accept_unsealed)
        self.clock = clock
        self.unleased: Literal["refuse", "allow"] = unleased
        #: Lease record versions seen nobody holding (shared by the views; None: the backend reads the
        #: lease record first): see :class:`LeaseMemo`.
        self.lease_memo = LeaseMemo.for_backend(backend)

    def for_user(self, user: str) -> Store:
        """A view of the same backend bound to ``user`` (shares connections and integrity keys)."""
        view = Store(
            self.backend,
            user=user,
            max_item_bytes=self.max_item_bytes,
            require_user=self.require_user,
            integrity=self.integrity,
            clock=self.clock,
            unleased=self.unleased,
        )
        view.lease_memo = self.lease_memo
        return view

    def partition(self, scope: str) -> Partition:
        """The backend partition of ``scope`` for this store's user."""
        return Partition(self._user(), SPACE, scope)

    def _user(self) -> str:
        """The user this store reaches (the anonymous space if unbound), or IsolationError."""
        if self.user is None:
            if self.require_user:
                raise IsolationError(
                    "this store requires a user (require_user=True): call for_user(user_id) first"
                )
            return ANONYMOUS_USER
        return self.user

    def lease_site(self, scope: str) -> LeaseSite:
        """Where the lease of ``scope`` lives: its partition's reserved lease record."""
        return LeaseSite(self.integrity, self.partition(validate_scope(scope)), scope)

    # -- flows (no I/O of their own) ------------------------------------

    def write_flow(
        self, site: LeaseSite, puts: list[Put], deletes: list[Delete], lease: Lease | None
    ) -> Flow[WriteResult]:
        """One atomic batch, fenced by ``lease`` (or checked for no other holder); see :mod:`.leases`."""
        refuse, memo = self.unleased == "refuse", self.lease_memo
        return guarded_write_flow(site, lease, puts, deletes, clock=self.clock, refuse_unleased=refuse, memo=memo)

    def _get_flow(self, scope: str, key: str) -> Flow[Item | None]:
        validate_scope(scope)
        validate_key(key)
        partition = self.partition(scope)
        (record,) = yield from get(partition, [_name(key)])
        return None if record is None else _to_item(self.integrity, partition, scope, key, record)

    def _single_flow(self, batch: Batch) -> Flow[Item]:
        items = yield from batch.flow()
        return items[0]

    def _delete_flow(self, scope: str, key: str, if_match: str | None, lease: Lease | None) -> Flow[bool]:
        """Delete ``key``; without ``if_match`` conditioned on the etag read, read again if it moved."""
        validate_scope(scope)
        name = _name(validate_key(key))
        if_match = _check_etag(if_match)
        site = Batch(self, scope, lease)._site
        for _ in range(1 if if_match is not None else DELETE_ATTEMPTS):
            etag = if_match
            if etag is None:
                (record,) = yield from get(site.partition, [name])
                if record is None:
                    return False
                etag = record.etag
            deletes = [Delete(name, etag)]
            result = yield from self.write_flow(site, [], deletes, lease)
            if result.conflict is None:
                return True
            if if_match is not None:  # refused unless the item is there with that etag
                raise_conflict(result, [], deletes, [key])
        found = result.conflict.existing if result.conflict else None
        raise ConcurrencyError(key, etag, found.etag if found else None)

    def _list_flow(
        self,
        scope: str,
        prefix: str,
        tags: Mapping[str, str] | None,
        newest_first: bool,
        limit: int | None,
    ) -> Flow[list[Item]]:
        validate_scope(scope)
        if prefix:
            validate_key(prefix)
        tags = check_tags(prefix or "<query>", tags)
        limit = _check_limit(limit)
        partition = self.partition(scope)
        query = ListQuery(
            prefix=_name(prefix) if prefix else "i/_",
            order="seq",
            descending=newest_first,
            limit=limit,
            tags=tags,
        )
        records = yield from listing(partition, query)
        return [_to_item(self.integrity, partition, scope, _key_of(r), r) for r in records]

    # -- sync API ---------------------------------------------------------

    def create_item(
        self,
        scope: str,
        key: str,
        value: Any,
        *,
        tags: Mapping[str, str] | None = None,
        lease: Lease | None = None,
    ) -> Item:
        """Store a new item; :class:`ConcurrencyError` if ``key`` exists.

        Every write method takes ``lease=``: the write then commits only if
        that lease is still current (else :class:`LeaseLostError`, nothing
        written); see :meth:`acquire_lease`.
        """
        batch = Batch(self, scope, lease).create(key, value, tags=tags)
        return run(self._single_flow(batch), self.backend)

    def set_item(
        self,
        scope: str,
        key: str,
        value: Any,
        *,
        tags: Mapping[str, str] | None = None,
        if_match: str | None = None,
        lease: Lease | None = None,
    ) -> Item:
        """Create or replace an item (its value and its tags: tags not given are dropped).

        With ``if_match``, only if the stored etag is still that one, else
        :class:`ConcurrencyError`.
        """
        batch = Batch(self, scope, lease).set(key, value, tags=tags, if_match=if_match)
        return run(self._single_flow(batch), self.backend)

    def append_step(
        self,
        scope: str,
        step: str,
        value: Any,
        *,
        tags: Mapping[str, str] | None = None,
        lease: Lease | None = None,
    ) -> Item:
        """Write ``steps/<step>`` once.

        The same value again returns the stored item (no-op); a different value
        raises :class:`StepMismatchError` with both digests and keeps the stored one.
        """
        batch = Batch(self, scope, lease).append_step(step, value, tags=tags)
        return run(self._single_flow(batch), self.backend)

    def get_item(self, scope: str, key: str) -> Item | None:
        """The item, or ``None``; damaged bytes raise :class:`CorruptItemError`."""
        return run(self._get_flow(scope, key), self.backend)

    def delete_item(
        self, scope: str, key: str, *, if_match: str | None = None, lease: Lease | None = None
    ) -> bool:
        """Delete an item; return whether this call deleted it.

        Without ``if_match``: ``False`` if there was nothing to delete; of two
        concurrent deletes of one item exactly one returns ``True``. With
        ``if_match``: deletes only that version (``ConcurrencyError`` if the
        item is absent or has another etag) and returns ``True``. A delete
        that finds nothing writes nothing and checks no lease.
        """
        return run(self._delete_flow(scope, key, if_match, lease), self.backend)

    def list_items(
        self,
        scope: str,
        *,
        prefix: str = "",
        tags: Mapping[str, str] | None = None,
        newest_first: bool = True,
        limit: int | None = None,
    ) -> list[Item]:
        """Items of ``scope`` whose key starts with ``prefix`` and carry all ``tags``."""
        return run(self._list_flow(scope, prefix, tags, newest_first, limit), self.backend)

    def batch(self, scope: str, *, lease: Lease | None = None) -> Batch:
        """Collect writes to apply atomically: ``with store.batch(scope) as b: ...``.

        With ``lease=`` the batch commits only if that lease is still current,
        checked in the same atomic backend write (:mod:`checkpointers.leases`).
        """
        return Batch(self, scope, lease)

    # -- leases -------------------------------------------------------------

    def _acquire(self, scope: str, owner: str, ttl: float) -> Flow[Lease]:
        return acquire(self.lease_site(scope), self.backend, owner, ttl, self.clock)

    def _current(self, scope: str) -> Flow[LeaseInfo | None]:
        state = yield from read_flow(self.lease_site(scope))
        return None if state is None else state.info(scope)

    def _expired(self, limit: int | None) -> Flow[list[LeaseInfo]]:
        checked = _check_limit(limit)
        bound = sys.maxsize if checked is None else checked
        return (yield from expired_flow(self.integrity, self._user(), SPACE, bound, self.clock))

    def acquire_lease(self, scope: str, owner: str, ttl: float) -> Lease:
        """Take the single-writer lease of ``scope`` for ``owner`` for ``ttl`` seconds.

        Returns a :class:`~checkpointers.leases.Lease` whose fencing token is
        greater than every earlier holder's; :class:`LeaseHeldError` (who,
        until when) if another owner holds an unexpired lease. Acquiring
        again as the same owner makes a new holder (new token) and fences
        the old :class:`Lease` object out.
        """
        return run(self._acquire(scope, owner, ttl), self.backend)

    def current_lease(self, scope: str) -> LeaseInfo | None:
        """The lease stored for ``scope`` (held, expired or released), or None."""
        return run(self._current(scope), self.backend)

    def expired_leases(self, *, limit: int | None = 100) -> list[LeaseInfo]:
        """Up to ``limit`` (``None``: all) scopes of this store's user whose lease expired without release.

        For recovery: a starting process reclaims them (``acquire_lease``
        succeeds after the expiry, with a higher token) and resumes the work.
        One partition listing, then one lease read per scope until ``limit``
        are found, in scope-name order.
        """
        return run(self._expired(limit), self.backend)

    def effect(
        self,
        scope: str,
        key: str,
        *,
        lease: Lease | None = None,
        owner: str | None = None,
        reconcile: Any = None,
        retry_safe: bool = False,
    ) -> EffectBlock:
        """The side-effect journal entry ``key`` of ``scope``: ``with`` / ``async with`` it.

        Entering writes the **intent** (owner, time, lease token) before the
        caller acts; ``fx.record(outcome)`` writes the outcome (append-only);
        an effect already done gives ``fx.done``/``fx.outcome`` so the caller
        skips it; an intent without outcome raises
        :class:`~checkpointers.errors.UnknownOutcomeError` unless
        ``reconcile=`` (asks the downstream system by ``fx.key``) or
        ``retry_safe=True``. Written under ``lease`` like any fenced write.
        See :mod:`checkpointers.effects`.
        """
        from .effects import effect

        return effect(self, scope, key, lease=lease, owner=owner, reconcile=reconcile, retry_safe=retry_safe)

    # -- async API: the same flows, driven by the backend's async methods --

    async def acreate_item(
        self,
        scope: str,
        key: str,
        value: Any,
        *,
        tags: Mapping[str, str] | None = None,
        lease: Lease | None = None,
    ) -> Item:
        """Async :meth:`create_item`."""
        batch = Batch(self, scope, lease).create(key, value, tags=tags)
        return await arun(self._single_flow(batch), self.backend)

    async def aset_item(
        self,
        scope: str,
        key: str,
        value: Any,
        *,
        tags: Mapping[str, str] | None = None,
        if_match: str | None = None,
        lease: Lease | None = None,
    ) -> Item:
        """Async :meth:`set_item`."""
        batch = Batch(self, scope, lease).set(key, value, tags=tags, if_match=if_match)
        return await arun(self._single_flow(batch), self.backend)

    async def aappend_step(
        self,
        scope: str,
        step: str,
        value: Any,
        *,
        tags: Mapping[str, str] | None = None,
        lease: Lease | None = None,
    ) -> Item:
        """Async :meth:`append_step`."""
        batch = Batch(self, scope, lease).append_step(step, value, tags=tags)
        return await arun(self._single_flow(batch), self.backend)

    async def aget_item(self, scope: str, key: str) -> Item | None:
        """Async :meth:`get_item`."""
        return await arun(self._get_flow(scope, key), self.backend)

    async def adelete_item(
        self, scope: str, key: str, *, if_match: str | None = None, lease: Lease | None = None
    ) -> bool:
        """Async :meth:`delete_item`."""
        return await arun(self._delete_flow(scope, key, if_match, lease), self.backend)

    async def alist_items(
        self,
        scope: str,
        *,
        prefix: str = "",
        tags: Mapping[str, str] | None = None,
        newest_first: bool = True,
        limit: int | None = None,
    ) -> list[Item]:
        """Async :meth:`list_items`."""
        return await arun(self._list_flow(scope, prefix, tags, newest_first, limit), self.backend)

    def abatch(self, scope: str, *, lease: Lease | None = None) -> Batch:
        """Async form: ``async with store.abatch(scope) as b: ...``."""
        return Batch(self, scope, lease)

    async def aacquire_lease(self, scope: str, owner: str, ttl: float) -> Lease:
        """Async :meth:`acquire_lease`."""
        return await arun(self._acquire(scope, owner, ttl), self.backend)

    async def acurrent_lease(self, scope: str) -> LeaseInfo | None:
        """Async :meth:`current_lease`."""
        return await arun(self._current(scope), self.backend)

    async def aexpired_leases(self, *, limit: int | None = 100) -> list[LeaseInfo]:
        """Async :meth:`expired_leases`."""
        return await arun(self._expired(limit), self.backend)
