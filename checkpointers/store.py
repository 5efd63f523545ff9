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
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ._flows import Flow, GetOp, ListOp, arun, delete_present_flow, make_put, run, verified, write_flow
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
from .backends.base import Backend, Delete, ListQuery, Mode, Put, Record
from .errors import CorruptItemError, IsolationError

__all__ = ["Batch", "Item", "Store", "STEP_PREFIX"]

SPACE = "items"
STEP_PREFIX = "steps/"
_BYTES, _JSON = b"b", b"j"


@dataclass(frozen=True)
class Item:
    """A stored item as callers see it.

    ``value`` is ``bytes`` if bytes were stored, else the decoded JSON value.
    ``etag`` changes on every write; ``digest`` is the SHA-256 of the stored
    bytes; ``seq`` is the store-assigned write sequence (higher = newer).
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
            ).encode("utf-8")
        except (TypeError, ValueError) as exc:
            raise TypeError(
                f"item {key!r}: value of type {type(value).__name__} is neither bytes nor "
                f"JSON-serializable ({exc}); nothing was written"
            ) from exc
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


def _name(key: str) -> str:
    return "i/" + encode_prefixable(key)


def _to_item(scope: str, key: str, record: Record) -> Item:
    record = verified(record, key)
    return Item(
        scope, key, decode_value(key, record.value), dict(record.tags), record.etag, record.digest, record.seq
    )


def _key_of(record: Record) -> str:
    """The caller's key of an item record (inverse of :func:`_name`)."""
    return decode_component(record.name[2:])  # type: ignore[return-value]


class Batch:
    """Writes collected for one scope and applied atomically: all or nothing.

    Use ``with store.batch(scope) as b:`` (or ``async with store.abatch(...)``);
    the batch is applied when the block exits without an exception. Each
    method checks its input at once, so a bad item raises before anything is
    written.
    """

    def __init__(self, store: Store, scope: str) -> None:
        self._store = store
        self.scope = validate_scope(scope)
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
        return self._put(key, value, tags, Mode.IF_MATCH if if_match else Mode.UPSERT, if_match)

    def append_step(self, step: str, value: Any, *, tags: Mapping[str, str] | None = None) -> Batch:
        """Add an append-only write of ``steps/<step>``."""
        return self._put(STEP_PREFIX + step, value, tags, Mode.APPEND, None)

    def delete(self, key: str, *, if_match: str | None = None) -> Batch:
        """Add a delete (absent is fine unless ``if_match`` is given)."""
        validate_key(key)
        self._deletes.append(Delete(_name(key), if_match))
        self._delete_labels.append(key)
        return self

    def _put(self, key: str, value: Any, tags: Any, mode: Mode, if_match: str | None) -> Batch:
        validate_key(key)
        tags = check_tags(key, tags)
        data = encode_value(key, value, self._store.max_item_bytes)
        self._puts.append(make_put(_name(key), data, tags=tags, mode=mode, if_match=if_match))
        self._put_labels.append(key)
        return self

    def flow(self) -> Flow[list[Item]]:
        """The write flow of this batch (used by ``Store.batch``/``abatch``)."""
        records = yield from write_flow(
            self._store.partition(self.scope),
            self._puts,
            self._deletes,
            self._put_labels + self._delete_labels,
        )
        self.items = [_to_item(self.scope, k, r) for k, r in zip(self._put_labels, records)]
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
    """

    def __init__(
        self,
        backend: Backend,
        *,
        user: str | None = None,
        max_item_bytes: int = DEFAULT_MAX_ITEM_BYTES,
        require_user: bool = False,
    ) -> None:
        if max_item_bytes <= 0:
            raise ValueError(f"max_item_bytes must be positive, got {max_item_bytes}")
        self.backend = backend
        self.user = None if user is None else validate_user(user)
        self.max_item_bytes = max_item_bytes
        self.require_user = require_user

    def for_user(self, user: str) -> Store:
        """A view of the same backend bound to ``user`` (shares connections)."""
        return Store(
            self.backend, user=user, max_item_bytes=self.max_item_bytes, require_user=self.require_user
        )

    def partition(self, scope: str) -> Partition:
        """The backend partition of ``scope`` for this store's user."""
        if self.user is None:
            if self.require_user:
                raise IsolationError(
                    "this store requires a user (require_user=True): call for_user(user_id) first"
                )
            return Partition(ANONYMOUS_USER, SPACE, scope)
        return Partition(self.user, SPACE, scope)

    # -- flows (no I/O of their own) ------------------------------------

    def _get_flow(self, scope: str, key: str) -> Flow[Item | None]:
        validate_scope(scope)
        validate_key(key)
        (record,) = yield GetOp(self.partition(scope), [_name(key)])
        return None if record is None else _to_item(scope, key, record)

    def _single_flow(self, batch: Batch) -> Flow[Item]:
        items = yield from batch.flow()
        return items[0]

    def _delete_flow(self, scope: str, key: str, if_match: str | None) -> Flow[bool]:
        validate_scope(scope)
        name = _name(validate_key(key))
        partition = self.partition(scope)
        if if_match is not None:  # refused unless the item is there with that etag
            yield from write_flow(partition, [], [Delete(name, if_match)], [key])
            return True
        return (yield from delete_present_flow(partition, name, key))

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
        if limit is not None and limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        query = ListQuery(
            prefix=_name(prefix) if prefix else "i/_",
            order="seq",
            descending=newest_first,
            limit=limit,
            tags=tags,
        )
        records = yield ListOp(self.partition(scope), query)
        return [_to_item(scope, _key_of(r), r) for r in records]

    # -- sync API ---------------------------------------------------------

    def create_item(
        self, scope: str, key: str, value: Any, *, tags: Mapping[str, str] | None = None
    ) -> Item:
        """Store a new item; :class:`ConcurrencyError` if ``key`` exists."""
        return run(self._single_flow(Batch(self, scope).create(key, value, tags=tags)), self.backend)

    def set_item(
        self,
        scope: str,
        key: str,
        value: Any,
        *,
        tags: Mapping[str, str] | None = None,
        if_match: str | None = None,
    ) -> Item:
        """Create or replace an item (its value and its tags: tags not given are dropped).

        With ``if_match``, only if the stored etag is still that one, else
        :class:`ConcurrencyError`.
        """
        batch = Batch(self, scope).set(key, value, tags=tags, if_match=if_match)
        return run(self._single_flow(batch), self.backend)

    def append_step(
        self, scope: str, step: str, value: Any, *, tags: Mapping[str, str] | None = None
    ) -> Item:
        """Write ``steps/<step>`` once.

        The same value again returns the stored item (no-op); a different value
        raises :class:`StepMismatchError` with both digests and keeps the stored one.
        """
        batch = Batch(self, scope).append_step(step, value, tags=tags)
        return run(self._single_flow(batch), self.backend)

    def get_item(self, scope: str, key: str) -> Item | None:
        """The item, or ``None``; damaged bytes raise :class:`CorruptItemError`."""
        return run(self._get_flow(scope, key), self.backend)

    def delete_item(self, scope: str, key: str, *, if_match: str | None = None) -> bool:
        """Delete an item; return whether this call deleted it.

        Without ``if_match``: ``False`` if there was nothing to delete; of two
        concurrent deletes of one item exactly one returns ``True``. With
        ``if_match``: deletes only that version (``ConcurrencyError`` if the
        item is absent or has another etag) and returns ``True``.
        """
        return run(self._delete_flow(scope, key, if_match), self.backend)

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

    def batch(self, scope: str) -> Batch:
        """Collect writes to apply atomically: ``with store.batch(scope) as b: ...``."""
        return Batch(self, scope)

    # -- async API: the same flows, driven by the backend's async methods --

    async def acreate_item(
        self, scope: str, key: str, value: Any, *, tags: Mapping[str, str] | None = None
    ) -> Item:
        """Async :meth:`create_item`."""
        return await arun(self._single_flow(Batch(self, scope).create(key, value, tags=tags)), self.backend)

    async def aset_item(
        self,
        scope: str,
        key: str,
        value: Any,
        *,
        tags: Mapping[str, str] | None = None,
        if_match: str | None = None,
    ) -> Item:
        """Async :meth:`set_item`."""
        batch = Batch(self, scope).set(key, value, tags=tags, if_match=if_match)
        return await arun(self._single_flow(batch), self.backend)

    async def aappend_step(
        self, scope: str, step: str, value: Any, *, tags: Mapping[str, str] | None = None
    ) -> Item:
        """Async :meth:`append_step`."""
        batch = Batch(self, scope).append_step(step, value, tags=tags)
        return await arun(self._single_flow(batch), self.backend)

    async def aget_item(self, scope: str, key: str) -> Item | None:
        """Async :meth:`get_item`."""
        return await arun(self._get_flow(scope, key), self.backend)

    async def adelete_item(self, scope: str, key: str, *, if_match: str | None = None) -> bool:
        """Async :meth:`delete_item`."""
        return await arun(self._delete_flow(scope, key, if_match), self.backend)

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

    def abatch(self, scope: str) -> Batch:
        """Async form: ``async with store.abatch(scope) as b: ...``."""
        return Batch(self, scope)
