"""The exception hierarchy of ``checkpointers``.

Every error the library raises on purpose derives from one root, so callers
can catch ``CheckpointerError`` at a boundary. Input errors also derive from
``ValueError`` so a generic ``except ValueError`` keeps working::

    CheckpointerError
    ├── InvalidNameError(CheckpointerError, ValueError)   .name .reason
    ├── ItemTooLargeError(CheckpointerError, ValueError)  .key .size .limit
    ├── TooManyTagsError(CheckpointerError, ValueError)   .key .count .limit
    ├── InvalidArgumentError(CheckpointerError, ValueError, TypeError)  .argument .reason
    ├── UnserializableValueError(CheckpointerError, TypeError, ValueError)  .key .reason
    ├── StepMismatchError                                 .step .stored_digest .new_digest
    ├── ConcurrencyError                                  .key .expected_etag .actual_etag
    ├── IsolationError
    ├── LeaseHeldError                                    .scope .owner .token .until
    ├── LeaseLostError                                    .scope .owner .token .current_owner .current_token
    ├── UnknownOutcomeError                               .effect .key .owner .at .lease_token .intent
    ├── CorruptItemError                                  .key .reason
    │   └── DisallowedTypeError                           .module .name
    └── BackendUnavailableError                           __cause__ = the driver's error

Backends translate their driver's exceptions at the edge (each backend has one
``translate_errors()`` context manager), so ``sqlite3``, ``redis`` and
``botocore`` exceptions never leak out of the library.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "BackendUnavailableError",
    "CheckpointerError",
    "ConcurrencyError",
    "CorruptItemError",
    "DisallowedTypeError",
    "InvalidArgumentError",
    "InvalidNameError",
    "IsolationError",
    "ItemTooLargeError",
    "LeaseHeldError",
    "LeaseLostError",
    "StepMismatchError",
    "TooManyTagsError",
    "UnknownOutcomeError",
    "UnserializableValueError",
]


class CheckpointerError(Exception):
    """Root of every error raised by ``checkpointers``."""


class InvalidNameError(CheckpointerError, ValueError):
    """A scope, key, tag or user name breaks the naming rules.

    Raised before any I/O. ``name`` is the offending value and ``reason``
    says which rule it broke.
    """

    def __init__(self, kind: str, name: object, reason: str) -> None:
        self.kind = kind
        self.name = name
        self.reason = reason
        shown = repr(name)
        if len(shown) > 80:
            shown = shown[:77] + "..."
        super().__init__(f"invalid {kind} {shown}: {reason}")


class ItemTooLargeError(CheckpointerError, ValueError):
    """A serialized value is larger than the store's cap.

    Raised before any network call or write: nothing of the operation is
    stored. Store less per item (split it, or keep large blobs elsewhere and
    store a reference), or raise the cap with ``max_item_bytes=``.
    """

    def __init__(self, key: str, size: int, limit: int) -> None:
        self.key = key
        self.size = size
        self.limit = limit
        super().__init__(
            f"item {key!r} is {size:,} bytes serialized, over the cap of {limit:,} "
            f"bytes; nothing was written. Split the value or raise max_item_bytes."
        )


class TooManyTagsError(CheckpointerError, ValueError):
    """An item was given more tags than the limit (16)."""

    def __init__(self, key: str, count: int, limit: int) -> None:
        self.key = key
        self.count = count
        self.limit = limit
        super().__init__(
            f"item {key!r} has {count} tags, over the limit of {limit}; nothing was "
            f"written. Keep at most {limit} tags and move the rest into the value."
        )


class InvalidArgumentError(CheckpointerError, ValueError, TypeError):
    """An argument or a config is invalid: wrong type, empty etag, missing id, ...

    Raised before any I/O; nothing was written. ``argument`` names the
    argument (``"limit"``, ``"if_match"``, ``"configurable.thread_id"``...)
    and ``reason`` says what is wrong and what to pass instead. Also a
    ``ValueError`` and a ``TypeError``, so either generic handler keeps working.
    """

    def __init__(self, argument: str, reason: str) -> None:
        self.argument = argument
        self.reason = reason
        super().__init__(f"invalid {argument}: {reason}; nothing was written")


class UnserializableValueError(CheckpointerError, TypeError, ValueError):
    """A value cannot be serialized (not JSON / the serializer's types, NaN, too deep, ...).

    Raised before any I/O; nothing was written. ``key`` names the item,
    channel or write; ``reason`` what the serializer said. Also a
    ``TypeError`` (what ``json.dumps`` raises for an unknown type) and a
    ``ValueError`` (what it raises for NaN).
    """

    def __init__(self, key: str, reason: str) -> None:
        self.key = key
        self.reason = reason
        super().__init__(
            f"{key}: the value cannot be serialized ({reason}); nothing was written. "
            f"Store plain data (dicts, lists, str, finite numbers, bool, None; bytes for items)."
        )


class StepMismatchError(CheckpointerError):
    """An append-only key was written again with a different value.

    Append-only keys (steps, LangGraph checkpoint records and task writes)
    are written once. Re-writing the identical value is a no-op; a different
    value means a recomputation diverged from what was committed, and the
    stored value is kept.
    """

    def __init__(self, step: str, stored_digest: str, new_digest: str) -> None:
        self.step = step
        self.stored_digest = stored_digest
        self.new_digest = new_digest
        super().__init__(
            f"append-only key {step!r} already holds a different value "
            f"(stored sha256 {stored_digest[:16]}..., new sha256 {new_digest[:16]}...); "
            f"the stored value was kept. A recomputed step must reproduce the "
            f"committed result: make the step deterministic or write a new key."
        )


class ConcurrencyError(CheckpointerError):
    """A conditional write lost a race: the etag moved, or the key exists.

    Re-read the item and retry with its current etag.
    """

    def __init__(
        self, key: str, expected_etag: str | None, actual_etag: str | None = None
    ) -> None:
        self.key = key
        self.expected_etag = expected_etag
        self.actual_etag = actual_etag
        if expected_etag is None:
            msg = f"item {key!r} already exists; use set_item() to replace it"
        elif actual_etag is None:
            msg = f"item {key!r} does not exist (expected etag {expected_etag!r})"
        else:
            msg = (
                f"item {key!r} changed: expected etag {expected_etag!r}, found "
                f"{actual_etag!r}; re-read it and retry"
            )
        super().__init__(msg)


class IsolationError(CheckpointerError):
    """An operation would cross or lack a user boundary.

    Raised, for example, when ``require_user=True`` and no user was given.
    """


def _when(seconds: float) -> str:
    """``seconds`` since the epoch as an ISO 8601 UTC time, to the millisecond."""
    import datetime

    moment = datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class LeaseHeldError(CheckpointerError):
    """Another owner holds an unexpired lease on this scope (or thread).

    ``owner`` is the holder, ``token`` its fencing token and ``until`` the
    time (seconds since the epoch, the holder's clock) its lease expires
    unless renewed. Nothing was written. Wait and retry after ``until``, or
    work elsewhere: the holder may still be running.
    """

    def __init__(self, scope: str, owner: str, token: int, until: float, *, writing: bool = False) -> None:
        self.scope = scope
        self.owner = owner
        self.token = token
        self.until = until
        what = "a write without a lease is refused" if writing else "cannot acquire it"
        super().__init__(
            f"{scope!r} is leased by owner {owner!r} (fencing token {token}) until {_when(until)}: "
            f"{what}; nothing was written. Retry after that time, or acquire the lease and write with lease=."
        )


class LeaseLostError(CheckpointerError):
    """A lease is no longer its holder's: it was taken over, released, or its scope deleted.

    Raised by ``renew``, ``release`` and by every write made under the lease
    (``lease=``); such a write committed nothing. ``current_owner`` and
    ``current_token`` describe the lease found now (``None`` if there is
    none). Stop working on the scope: another process owns it.
    """

    def __init__(
        self,
        scope: str,
        owner: str,
        token: int,
        current_owner: str | None,
        current_token: int | None,
        reason: str,
    ) -> None:
        self.scope = scope
        self.owner = owner
        self.token = token
        self.current_owner = current_owner
        self.current_token = current_token
        super().__init__(
            f"the lease of owner {owner!r} (fencing token {token}) on {scope!r} is lost: {reason}; "
            f"nothing was written. Stop working on it; another process may own it now."
        )


class CorruptItemError(CheckpointerError):
    """Stored bytes failed their digest check or could not be decoded.

    Damaged data is never returned.
    """

    def __init__(self, key: str, reason: str) -> None:
        self.key = key
        self.reason = reason
        super().__init__(f"stored item {key!r} is corrupt: {reason}")


class DisallowedTypeError(CorruptItemError):
    """Stored bytes name a type that decoding may not rebuild.

    Decoding rebuilds only LangGraph's own safe types and the types the
    caller allowed (``allowed_msgpack_modules=``); nothing named in stored
    bytes is ever imported otherwise. Either the store was written by someone
    else (treat it as tampering) or your state uses a type of your own: allow
    it explicitly, e.g. ``allowed_msgpack_modules=[("my_app.models", "MyState")]``.
    """

    def __init__(self, key: str, module: str, name: str) -> None:
        self.module = module
        self.name = name
        CheckpointerError.__init__(
            self,
            f"stored item {key!r} names type {module}.{name}, which is not in the decoding "
            f"allowlist; it was not imported. If it is a type of yours, pass "
            f"allowed_msgpack_modules=[({module!r}, {name!r})] to the checkpointer",
        )
        self.key = key
        self.reason = f"type {module}.{name} is not in the decoding allowlist"


class BackendUnavailableError(CheckpointerError):
    """The backend could not be reached after bounded retries.

    The driver's exception is chained as ``__cause__``.
    """


class UnknownOutcomeError(CheckpointerError):
    """An effect's intent is stored without an outcome: did the call happen?

    The process that wrote the intent died (or raised) between announcing the
    effect and recording its outcome, or is still running it. The journal
    (:mod:`checkpointers.effects`) cannot tell whether the downstream system
    applied it. Ask it by ``key`` and pass ``reconcile=`` (a callable returning
    the outcome, or ``NOT_APPLIED``), or declare the effect ``retry_safe=True``
    if the downstream deduplicates on the key. ``intent`` is the stored
    :class:`~checkpointers.effects.Intent` (owner, time, lease token, attempt).
    """

    def __init__(self, effect: str, intent: Any) -> None:
        self.effect = effect
        self.intent = intent
        self.key: str = intent.key
        self.owner: str = intent.owner
        self.at = intent.at
        self.lease_token: int | None = intent.lease_token
        lease = "no lease" if intent.lease_token is None else f"lease token {intent.lease_token}"
        super().__init__(
            f"{effect}: outcome unknown: attempt {intent.attempt} by {intent.owner!r} announced it at "
            f"{intent.at.isoformat(timespec='milliseconds')} ({lease}) and recorded no outcome. Ask the "
            f"downstream system whether key {intent.key!r} was applied and pass reconcile= (returning the "
            f"outcome, or NOT_APPLIED), or pass retry_safe=True if it deduplicates on that key"
        )
