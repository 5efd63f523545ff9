"""A journal of side effects: intent, outcome, and an honest "unknown outcome".

Checkpointing alone does not make an email, a charge or a webhook happen
once: recovery re-runs the step that was in flight, and the effect in it
fires again. The journal records, in the step's own partition, an **intent**
before the effect and its **outcome** after it, so a re-run finds what the
first attempt left::

    with effect(store, "orders/o-17", "charge") as fx:   # writes the intent
        if not fx.done:                                  # done: skip the call
            receipt = payments.charge(card, 100, idempotency_key=fx.key)
            fx.record(receipt)                           # writes the outcome

One effect is one record, ``fx/<encoded key parts>``, whose states are::

               enter (intent, Mode.CREATE)              record(outcome)
    ABSENT ------------------------------> INTENT ----------------------> DONE
                                             |  ^                          |
                 re-enter: no outcome stored |  | reconcile -> NOT_APPLIED |
                 UnknownOutcomeError unless  |  | or retry_safe=True:      |
                 reconcile= / retry_safe     +--+ a new intent (attempt+1) |
                                             |                             |
                                             +-- reconcile -> outcome ---->+
    DONE: re-enter returns the stored outcome (fx.done); the same outcome
    again is a no-op, a different one StepMismatchError (both digests).

* Entering writes the intent (who: the owner; when: wall-clock ms; the lease
  token if a lease fences it) with ``Mode.CREATE`` **before** the caller does
  anything. It takes one backend write; re-entering takes that write (refused)
  and one read.
* ``fx.record(outcome)`` rewrites the record to DONE with ``Mode.IF_MATCH`` on
  the intent's etag: the outcome is written once. Outcomes are bytes or
  JSON-able values, capped like items (``max_item_bytes``, checked before any
  write).
* An exception inside the block leaves the intent and propagates: the next
  attempt sees "unknown", never "not started". Leaving the block without
  ``record`` does the same.
* With a lease (``lease=``), every write of the effect is fenced by it: it
  commits only while that lease is current, in the same atomic backend batch
  (:func:`checkpointers.leases.guarded_write_flow`); a stale holder's intent
  is refused with ``LeaseLostError``. Without a lease, a write to a scope
  another owner holds is refused with ``LeaseHeldError`` (the store's
  ``unleased="refuse"``: the write carries that check itself on backends that
  declare ``inline_conditions``, memory, SQLite, Redis and PostgreSQL; S3 reads
  the lease record first).

``fx.key`` is the idempotency key to hand to the downstream system: ``fx-``
and 32 hex digits of a SHA-256 over the user, space, partition and key parts
(not keyed with the integrity secret, so rotating that key never changes it).
It is stored in the intent, and the stored one is used afterwards, so a
copied thread reconciles with the key its first attempt actually sent.

The records live in the partition of their scope or thread under the
reserved prefix ``fx/``, which no item (``i/``), LangGraph record (``c/``,
``w/``, ``b/``) or Agent Framework record (``c/``) name can take: deleting,
copying or expiring the partition treats them with the rest of it, and
``prune`` (which only touches ``c/``, ``w/`` and ``b/``) keeps them. Every
record is sealed to its place like any other (:mod:`checkpointers._integrity`):
a record copied to another key, thread or user is a ``CorruptItemError``.

What the journal cannot know: whether a call whose outcome was not recorded
happened. That is what ``reconcile=`` asks the downstream system (by
``fx.key``), and what ``retry_safe=True`` declares harmless (the downstream
deduplicates on the key). Without a lease, two processes may both be inside
one effect (the second gets UnknownOutcomeError, or with ``reconcile`` may ask
while the first is still calling): fence effects that can race with a lease.

The faces: :func:`effect` (``store.effect(scope, key)``); :func:`saver_effect`
(LangGraph: ``saver.effect(config, name)`` in a node or a tool, keyed by the
thread, namespace, task id and name) and :func:`effect_tool` (a tool
decorator); ``adapters.agent_framework_effects.storage_effect`` (Agent
Framework: ``storage.effect(run_id, executor_id, name)`` in an executor).

>>> from checkpointers import Store
>>> from checkpointers.backends.memory import MemoryBackend
>>> store = Store(MemoryBackend()).for_user("alice")
>>> with effect(store, "runs/r1", "send-email", owner="worker-1") as fx:
...     fx.done
...     _ = fx.record({"message_id": "m-1"})
False
>>> with effect(store, "runs/r1", "send-email") as fx:   # a re-run skips the call
...     fx.done, fx.outcome
(True, {'message_id': 'm-1'})
"""

from __future__ import annotations

import builtins
import enum
import functools
import hashlib
import inspect
import json
import os
import socket
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Literal

from ._flows import Flow, arun, digest, get, listing, new_etag, raise_conflict, run
from ._integrity import Integrity
from ._names import DEFAULT_MAX_ITEM_BYTES, Partition, encode_component, validate_key
from .backends.base import Backend, ListQuery, Mode, Put, Record, WriteResult
from .errors import (
    ConcurrencyError,
    CorruptItemError,
    InvalidArgumentError,
    InvalidNameError,
    StepMismatchError,
    UnknownOutcomeError,
)
from .leases import Clock, Lease, LeaseMemo, LeaseSite, guarded_write_flow
from .store import decode_value, encode_value

if TYPE_CHECKING:
    from .savers import Checkpointer
    from .store import Store

__all__ = [
    "EFFECT_PREFIX",
    "NOT_APPLIED",
    "Effect",
    "EffectBlock",
    "EffectInfo",
    "EffectState",
    "Intent",
    "Journal",
    "NotApplied",
    "Reconcile",
    "UnknownOutcomeError",
    "check_record",
    "current_effect",
    "effect",
    "effect_tool",
    "idempotency_key",
    "record_name",
    "saver_effect",
    "task_effect_key",
]

#: The reserved name prefix of effect records inside a partition.
EFFECT_PREFIX = "fx/"
#: The tag every effect record carries: its state (``intent`` or ``done``).
STATE_TAG = "fx"
#: Longest key (all parts, JSON-encoded) an effect may have, in characters.
MAX_EFFECT_KEY_LENGTH = 1024
_FORMAT = 1
_KEY_DOMAIN = b"checkpointers/effect-key/1\x00"


class EffectState(enum.Enum):
    """Where an effect is: nothing stored, an intent without outcome, or done."""

    ABSENT = "absent"
    INTENT = "intent"
    DONE = "done"


#: The transitions the journal makes, and what makes each.
TRANSITIONS: dict[tuple[EffectState, EffectState], str] = {
    (EffectState.ABSENT, EffectState.INTENT): "enter: the intent, Mode.CREATE",
    (EffectState.INTENT, EffectState.INTENT): "re-enter with reconcile -> NOT_APPLIED or retry_safe: attempt + 1",
    (EffectState.INTENT, EffectState.DONE): "record(outcome), or reconcile -> outcome",
}


class NotApplied:
    """The type of :data:`NOT_APPLIED` (a reconcile's "it never happened")."""

    _instance: NotApplied | None = None

    def __new__(cls) -> NotApplied:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "NOT_APPLIED"


#: What a ``reconcile=`` callable returns when the downstream system never
#: applied the effect: the effect then proceeds as a new attempt.
NOT_APPLIED = NotApplied()


@dataclass(frozen=True)
class Intent:
    """Who announced an effect, when, and under which lease.

    ``at_ms`` is wall-clock milliseconds since the epoch (the writer's clock);
    ``lease_token`` the fencing token of the lease the write was made under
    (``None`` without a lease); ``attempt`` counts intents of this effect.
    """

    key: str
    owner: str
    at_ms: int
    lease_token: int | None
    attempt: int

    @property
    def at(self) -> datetime:
        """``at_ms`` as an aware UTC datetime."""
        return datetime.fromtimestamp(self.at_ms / 1000, tz=timezone.utc)


@dataclass(frozen=True)
class EffectInfo:
    """One effect as stored: its key parts, state, intent and outcome (if done)."""

    name: tuple[str, ...]
    state: EffectState
    intent: Intent
    outcome: Any = None
    outcome_digest: str | None = None
    done_at_ms: int | None = None
    via: str | None = None
    etag: str = ""

    @property
    def key(self) -> str:
        """The idempotency key the effect was announced with."""
        return self.intent.key


#: A ``reconcile=`` callable: the idempotency key in, the outcome or NOT_APPLIED out.
Reconcile = Callable[[str], Any]


@functools.lru_cache(maxsize=4)
def _owner_of(pid: int) -> str:
    return f"{socket.gethostname()}:{pid}"


def _default_owner() -> str:
    """``<hostname>:<pid>`` of this process (a forked child gets its own)."""
    return _owner_of(os.getpid())


def _key_parts(key: str | Sequence[str]) -> tuple[str, ...]:
    """Check an effect key (a string or a non-empty sequence of strings)."""
    parts = (key,) if isinstance(key, str) else tuple(key)
    if not parts or not all(isinstance(p, str) for p in parts):
        raise InvalidNameError("effect key", key, "must be a string or a non-empty sequence of strings")
    if any(ord(c) < 32 or ord(c) == 127 for p in parts for c in p):
        raise InvalidNameError("effect key", key, "must not contain control characters or NUL")
    size = len(json.dumps(parts, ensure_ascii=False))
    if size > MAX_EFFECT_KEY_LENGTH:
        raise InvalidNameError("effect key", key, f"is {size} characters as JSON, over {MAX_EFFECT_KEY_LENGTH}")
    return parts


def record_name(parts: Sequence[str]) -> str:
    """The record name of an effect: ``fx/`` + its encoded parts, ``/``-joined (injective)."""
    return EFFECT_PREFIX + "/".join(encode_component(p) for p in parts)


def idempotency_key(partition: Partition, parts: Sequence[str]) -> str:
    """``fx-`` + 128 bits of SHA-256 over (user, space, partition, parts), length-prefixed."""
    h = hashlib.sha256(_KEY_DOMAIN)
    for field in (partition.user, partition.space, partition.name, *parts):
        raw = field.encode("utf-8", "surrogatepass")
        h.update(len(raw).to_bytes(4, "big") + raw)
    return "fx-" + h.hexdigest()[:32]


# -- the stored record: a JSON header line, then the encoded outcome when done --


def _encode(info: EffectInfo, outcome_data: bytes = b"") -> bytes:
    i = info.intent
    head: dict[str, Any] = {
        "v": _FORMAT, "name": list(info.name), "state": info.state.value, "key": i.key, "owner": i.owner,
        "at": i.at_ms, "lease": i.lease_token, "attempt": i.attempt,
    }  # fmt: skip
    if info.state is EffectState.DONE:
        head.update(sha=info.outcome_digest, done_at=info.done_at_ms, via=info.via)
    return json.dumps(head, sort_keys=True, separators=(",", ":")).encode() + b"\n" + outcome_data


def _decode(label: str, record: Record) -> EffectInfo:
    head_raw, newline, data = record.value.partition(b"\n")
    try:
        head = json.loads(head_raw) if newline else None
        if not isinstance(head, dict) or head.get("v") != _FORMAT:
            raise ValueError("not an effect record of a known format")
        state = EffectState(head["state"])
        lease = head["lease"]
        if lease is not None and (isinstance(lease, bool) or not isinstance(lease, int)):
            raise ValueError(f"lease token {lease!r} is not an int")
        intent = Intent(str(head["key"]), str(head["owner"]), int(head["at"]), lease, int(head["attempt"]))
        name = tuple(str(p) for p in head["name"])
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptItemError(label, f"effect record header: {exc}") from exc
    if record.tags.get(STATE_TAG) != state.value:
        raise CorruptItemError(label, "its state tag does not match its header")
    info = EffectInfo(name, state, intent, etag=record.etag)
    if state is not EffectState.DONE:
        return info
    if digest(data) != head.get("sha"):
        raise CorruptItemError(label, "its outcome does not match the digest in its header")
    outcome = decode_value(label, data)
    return replace(
        info, outcome=outcome, outcome_digest=head["sha"], done_at_ms=head.get("done_at"), via=head.get("via")
    )


def check_record(integrity: Integrity, partition: Partition, record: Record, label: str | None = None) -> EffectInfo:
    """An effect record of ``partition`` checked (value, seal) and decoded; damage raises CorruptItemError.

    For tools that walk a partition (the command line's ``show``/``verify``):
    names under :data:`EFFECT_PREFIX` are effect records.
    """
    label = label or record.name
    return _decode(label, integrity.check(partition, record, label))


@dataclass(frozen=True)
class _Spec:
    """One effect as asked for: where, what, by whom, how an unknown outcome is settled."""

    parts: tuple[str, ...]
    name: str
    label: str
    owner: str
    lease: Lease | None
    reconcile: Reconcile | None
    retry_safe: bool


#: How a journal writes one batch of its partition: ``(puts, lease) -> the batch's result``,
#: fenced by ``lease`` or checked for no other holder (a face's own lease policy).
Writer = Callable[[Sequence[Put], "Lease | None"], Flow[WriteResult]]


class Journal:
    """The effects of one partition (a scope, a LangGraph thread, a workflow).

    Every face builds one over its own backend, integrity and partition and
    calls :meth:`effect`; the semantics live here once. ``label`` names the
    partition in error messages (``"scope 'orders/o-17'"``). ``writer``
    writes each batch under the face's lease policy (the Store passes its
    ``write_flow``); by default :func:`~checkpointers.leases.guarded_write_flow`
    on the partition's lease record with ``clock`` (which also dates the
    intents and outcomes) and ``unleased``
    (``"refuse"``: a write without a lease to a partition another owner
    holds raises ``LeaseHeldError``; ``"allow"``: no lease read). ``site``:
    the lease record that fences the effects (default: the partition's
    :data:`~checkpointers.leases.LEASE_NAME`; a face keeping several leases in
    one partition passes its own, see :func:`~checkpointers.leases.listed_site`).
    ``within``: key parts every effect of this journal starts with (a face
    sharing one partition between runs passes the run id): :meth:`effect`
    prepends them, :meth:`list` lists only those effects.
    """

    def __init__(
        self,
        backend: Backend,
        integrity: Integrity,
        partition: Partition,
        *,
        max_item_bytes: int = DEFAULT_MAX_ITEM_BYTES,
        label: str | None = None,
        writer: Writer | None = None,
        clock: Clock = time.time,
        unleased: Literal["refuse", "allow"] = "refuse",
        site: LeaseSite | None = None,
        within: Sequence[str] = (),
    ) -> None:
        self.backend = backend
        self.within = _key_parts(within) if within else ()
        self.integrity = integrity
        self.partition = partition
        self.max_item_bytes = max_item_bytes
        self.label = label or f"{partition.space} partition {partition.name!r}"
        self.site = site or LeaseSite(integrity, partition, self.label)
        self.clock = clock
        refuse = unleased == "refuse"
        memo = LeaseMemo.for_backend(backend)  # no lease read per write where the backend allows (see leases)
        self._writer: Writer = writer or (
            lambda puts, lease: guarded_write_flow(
                self.site, lease, puts, (), clock=clock, refuse_unleased=refuse, memo=memo
            )
        )

    def effect(
        self,
        key: str | Sequence[str],
        *,
        lease: Lease | None = None,
        owner: str | None = None,
        reconcile: Reconcile | None = None,
        retry_safe: bool = False,
    ) -> EffectBlock:
        """A block (``with`` / ``async with``) around one effect; see the module docstring.

        ``key``: a string, or a sequence of strings (a face's own key parts,
        e.g. namespace, task id, name). ``lease``: a lease on this partition
        that fences every write of the effect. ``owner`` defaults to the
        lease's owner, else ``<hostname>:<pid>``. ``reconcile(fx.key)`` is
        called when an intent without outcome is found (an async one is
        awaited under ``async with``); ``retry_safe=True`` starts a new
        attempt instead.
        """
        parts = _key_parts((*self.within, *_key_parts(key)))
        if reconcile is not None and not callable(reconcile):
            raise InvalidArgumentError("reconcile", f"must be a callable taking the key, got {reconcile!r}")
        if lease is not None:
            if not isinstance(lease, Lease):
                raise InvalidArgumentError("lease", f"must be a Lease from acquire_lease() or None, got {lease!r}")
            lease.check_site(self.site)
        who = owner if owner is not None else lease.owner if lease is not None else _default_owner()
        label = f"effect {parts[0] if len(parts) == 1 else list(parts)!r} of {self.label}"
        return EffectBlock(self, _Spec(parts, record_name(parts), label, who, lease, reconcile, bool(retry_safe)))

    # -- listing ----------------------------------------------------------------

    def _list_flow(self, state: EffectState | None) -> Flow[list[EffectInfo]]:
        tags = {} if state is None else {STATE_TAG: state.value}
        prefix = record_name(self.within) + "/" if self.within else EFFECT_PREFIX
        records = yield from listing(self.partition, ListQuery(prefix=prefix, order="seq", tags=tags))
        return [check_record(self.integrity, self.partition, r) for r in records]

    def list(self, state: EffectState | None = None) -> list[EffectInfo]:
        """The effects of this partition, oldest first; ``state=EffectState.INTENT``: the unknown ones."""
        return run(self._list_flow(state), self.backend)

    async def alist(self, state: EffectState | None = None) -> builtins.list[EffectInfo]:
        """Async :meth:`list`."""
        return await arun(self._list_flow(state), self.backend)

    # -- flows ------------------------------------------------------------------

    def _put_flow(self, spec: _Spec, info: EffectInfo, data: bytes, mode: Mode, if_match: str | None) -> Flow[str]:
        """Write the effect record; its new etag, or ``""`` when its own condition failed."""
        put = self.integrity.put(
            self.partition, spec.name, _encode(info, data), etag=new_etag(),
            tags={STATE_TAG: info.state.value}, mode=mode, if_match=if_match,
        )  # fmt: skip
        result = yield from self._writer([put], spec.lease)
        if result.conflict is not None and result.conflict.index == 0:
            return ""
        raise_conflict(result, [put], (), [spec.label])
        return result.records[0].etag

    def _read_flow(self, spec: _Spec) -> Flow[EffectInfo | None]:
        (record,) = yield from get(self.partition, [spec.name])
        return None if record is None else check_record(self.integrity, self.partition, record, spec.label)

    def _intent(self, spec: _Spec, key: str, attempt: int) -> EffectInfo:
        token = None if spec.lease is None else spec.lease.token
        return EffectInfo(spec.parts, EffectState.INTENT, Intent(key, spec.owner, self._now_ms(), token, attempt))

    def _now_ms(self) -> int:
        return int(self.clock() * 1000)

    def enter_flow(self, spec: _Spec) -> Flow[tuple[EffectInfo, bool]]:
        """Write the intent of a new effect, or return what is stored; and whether it was found stored."""
        fresh = self._intent(spec, idempotency_key(self.partition, spec.parts), 1)
        for _ in range(3):  # an effect vanishes only with its partition: retry that, not forever
            etag = yield from self._put_flow(spec, fresh, b"", Mode.CREATE, None)
            if etag:
                return replace(fresh, etag=etag), False
            found = yield from self._read_flow(spec)
            if found is not None:
                return found, True
        raise ConcurrencyError(spec.label, None, None)

    def retry_flow(self, spec: _Spec, stored: EffectInfo) -> Flow[EffectInfo]:
        """A new intent (attempt + 1) over a stored one, if it is still the one read."""
        fresh = self._intent(spec, stored.key, stored.intent.attempt + 1)
        etag = yield from self._put_flow(spec, fresh, b"", Mode.IF_MATCH, stored.etag)
        if etag:
            return replace(fresh, etag=etag)
        now = yield from self._read_flow(spec)
        if now is not None and now.state is EffectState.DONE:
            return now  # another attempt finished it meanwhile
        raise ConcurrencyError(spec.label, stored.etag, now.etag if now else None)

    def finish_flow(self, spec: _Spec, current: EffectInfo, outcome: Any, via: str) -> Flow[EffectInfo]:
        """Record ``outcome`` over the intent ``current``; append-only (same: no-op, else mismatch)."""
        data = encode_value(spec.label, outcome, self.max_item_bytes)
        sha = digest(data)
        if current.state is EffectState.DONE:
            return _same_outcome(spec, current, sha)
        done = replace(
            current, state=EffectState.DONE, outcome=outcome, outcome_digest=sha, done_at_ms=self._now_ms(), via=via
        )
        etag = yield from self._put_flow(spec, done, data, Mode.IF_MATCH, current.etag)
        if etag:
            return replace(done, outcome=decode_value(spec.label, data), etag=etag)
        now = yield from self._read_flow(spec)
        if now is None or now.state is not EffectState.DONE:
            # another attempt replaced the intent (or the partition went): this one no longer owns it
            raise ConcurrencyError(spec.label, current.etag, now.etag if now else None)
        return _same_outcome(spec, now, sha)


def _same_outcome(spec: _Spec, done: EffectInfo, sha: str) -> EffectInfo:
    if done.outcome_digest != sha:
        raise StepMismatchError(spec.label, done.outcome_digest or "", sha)
    return done


class Effect:
    """The handle of one effect inside its block.

    ``done`` and ``outcome``: whether an outcome is stored, and which.
    ``key``: the idempotency key for the downstream system. ``reconciled``:
    this entry settled an unknown outcome through ``reconcile=``;
    ``unknown_intent``: the intent without outcome it found; ``attempt``:
    the intent's number (a retried effect has attempt 2 or more).
    """

    def __init__(self, journal: Journal, spec: _Spec, info: EffectInfo, found: EffectInfo | None = None) -> None:
        self._journal = journal
        self._spec = spec
        self._info = info
        self._found = found

    @property
    def key(self) -> str:
        """The idempotency key: hand it to the downstream system."""
        return self._info.key

    @property
    def name(self) -> tuple[str, ...]:
        """The effect's key parts, as given."""
        return self._spec.parts

    @property
    def state(self) -> EffectState:
        """INTENT inside a new attempt, DONE once an outcome is stored."""
        return self._info.state

    @property
    def done(self) -> bool:
        """Whether an outcome is stored (the caller skips the call)."""
        return self._info.state is EffectState.DONE

    @property
    def outcome(self) -> Any:
        """The stored outcome (``None`` until done)."""
        return self._info.outcome

    @property
    def intent(self) -> Intent:
        """Who announced this attempt, when, under which lease token."""
        return self._info.intent

    @property
    def attempt(self) -> int:
        """Which intent this is: 1 for the first attempt."""
        return self._info.intent.attempt

    @property
    def unknown_intent(self) -> Intent | None:
        """The intent without outcome this entry found (then reconciled or retried), else ``None``."""
        return None if self._found is None else self._found.intent

    @property
    def reconciled(self) -> bool:
        """This entry found an unknown outcome and ``reconcile=`` settled it (the caller skips)."""
        return self._found is not None and self.done and self._info.via == "reconcile"

    def record(self, outcome: Any) -> Any:
        """Store the outcome (bytes or JSON-able, capped); return it as stored.

        Append-only: the same outcome again is a no-op; a different one raises
        :class:`StepMismatchError` with both digests and keeps the stored one.
        """
        self._info = run(self._journal.finish_flow(self._spec, self._info, outcome, "call"), self._journal.backend)
        return self._info.outcome

    async def arecord(self, outcome: Any) -> Any:
        """Async :meth:`record`."""
        flow = self._journal.finish_flow(self._spec, self._info, outcome, "call")
        self._info = await arun(flow, self._journal.backend)
        return self._info.outcome

    def __repr__(self) -> str:
        return f"<Effect {self._spec.label} {self.state.value} key={self.key} attempt={self.attempt}>"


class EffectBlock:
    """``with`` / ``async with`` around one effect: entering writes the intent.

    Entering returns the :class:`Effect`; leaving writes nothing (an exception
    propagates and leaves the intent, so the next attempt sees "unknown").
    """

    def __init__(self, journal: Journal, spec: _Spec) -> None:
        self._journal = journal
        self._spec = spec

    def _settle(self, stored: EffectInfo, answer: Any) -> Flow[EffectInfo]:
        """The flow that settles a stored intent without outcome, given reconcile's answer."""
        if answer is _UNASKED:
            if not self._spec.retry_safe:
                raise UnknownOutcomeError(self._spec.label, stored.intent)
            return self._journal.retry_flow(self._spec, stored)
        if answer is NOT_APPLIED:
            return self._journal.retry_flow(self._spec, stored)
        return self._journal.finish_flow(self._spec, stored, answer, "reconcile")

    def __enter__(self) -> Effect:
        j, spec = self._journal, self._spec
        info, found = run(j.enter_flow(spec), j.backend)
        if found and info.state is EffectState.INTENT:
            answer = _UNASKED if spec.reconcile is None else spec.reconcile(info.key)
            if inspect.isawaitable(answer):
                _close(answer)
                raise InvalidArgumentError("reconcile", "returned an awaitable: use `async with` for an async one")
            return Effect(j, spec, run(self._settle(info, answer), j.backend), info)
        return Effect(j, spec, info)

    def __exit__(self, *exc: object) -> Literal[False]:
        return False

    async def __aenter__(self) -> Effect:
        j, spec = self._journal, self._spec
        info, found = await arun(j.enter_flow(spec), j.backend)
        if found and info.state is EffectState.INTENT:
            answer = _UNASKED if spec.reconcile is None else spec.reconcile(info.key)
            if inspect.isawaitable(answer):
                answer = await answer
            return Effect(j, spec, await arun(self._settle(info, answer), j.backend), info)
        return Effect(j, spec, info)

    async def __aexit__(self, *exc: object) -> Literal[False]:
        return False


#: No reconcile was given (distinct from any answer one could return).
_UNASKED = object()


def _close(awaitable: Awaitable[Any]) -> None:
    """Close an un-awaited coroutine (no "never awaited" warning)."""
    close = getattr(awaitable, "close", None)
    if close is not None:
        close()


# -- the faces ------------------------------------------------------------------


def effect(
    store: Store,
    scope: str,
    key: str,
    *,
    lease: Lease | None = None,
    owner: str | None = None,
    reconcile: Reconcile | None = None,
    retry_safe: bool = False,
) -> EffectBlock:
    """The effect ``key`` of ``scope`` in ``store`` (what ``store.effect(...)`` delegates to).

    The record lives in the scope's partition (the store's user) beside the
    scope's items and is written under the store's lease policy
    (``store.write_flow``); ``key`` follows the item key rules.
    """
    site = store.lease_site(scope)
    validate_key(key)
    journal = Journal(
        store.backend, store.integrity, site.partition, max_item_bytes=store.max_item_bytes,
        label=f"scope {scope!r}", writer=lambda puts, lease: store.write_flow(site, list(puts), [], lease),
        clock=store.clock,
    )  # fmt: skip
    return journal.effect(key, lease=lease, owner=owner, reconcile=reconcile, retry_safe=retry_safe)


#: Where LangGraph puts the running task's id in a node's or tool's config.
TASK_ID_KEY = "__pregel_task_id"


def task_effect_key(config: Mapping[str, Any] | None, name: str) -> tuple[Any, tuple[str, str, str]]:
    """The thread id and effect key parts of effect ``name`` of the LangGraph task running with ``config``.

    The parts are (checkpoint namespace, task id, name): a task re-run after a
    crash has the same id (LangGraph derives it from the checkpoint and the
    node), so it finds its own journal, and no other task does. Call it with
    the config LangGraph hands the node or tool (or ``langgraph.config.get_config()``).
    Several effects of one task (a tool node running several calls) need
    names of their own, e.g. with the tool call id.
    """
    conf = (config or {}).get("configurable") or {}
    task_id, thread = conf.get(TASK_ID_KEY), conf.get("thread_id")
    if not isinstance(task_id, str) or not task_id:
        raise InvalidArgumentError(
            "config", f"has no configurable.{TASK_ID_KEY}: make effects inside a node or a tool, with the config "
            "LangGraph passes it (or langgraph.config.get_config())",
        )  # fmt: skip
    if thread is None:
        raise InvalidArgumentError("config", "has no configurable.thread_id: effects belong to a thread")
    return thread, (str(conf.get("checkpoint_ns", "")), task_id, name)


def saver_effect(
    saver: Checkpointer,
    config: Mapping[str, Any] | None,
    name: str,
    *,
    reconcile: Reconcile | None = None,
    retry_safe: bool = False,
    owner: str | None = None,
) -> EffectBlock:
    """The effect ``name`` of the LangGraph task running with ``config`` (what ``saver.effect`` delegates to).

    Inside a node or a tool, with the config LangGraph hands it (``None``:
    ``langgraph.config.get_config()``, the running task's)::

        def notify(state, config):
            with saver.effect(config, "send-email", reconcile=mail.find) as fx:
                if not fx.done:
                    fx.record(mail.send(state["to"], idempotency_key=fx.key))
            return {"message_id": fx.outcome}

    The record lives in the thread's partition (the config's user), keyed by
    the checkpoint namespace, the task id and ``name``
    (:func:`task_effect_key`): a task re-run after a crash finds its own
    journal, another task (another step, node or namespace) never does. Its
    writes go through the saver's fenced write (the lease the saver holds for
    the thread in a ``with saver.lease(...)`` block, whose owner and token the
    intent records; else the saver's unleased policy). ``async with`` works
    the same.
    """
    if not isinstance(name, str) or not name:
        raise InvalidNameError("effect name", name, "must be a non-empty string")
    if config is None:
        from langgraph.config import get_config

        config = get_config()
    thread, parts = task_effect_key(config, name)
    partition = saver._partition(config, thread)  # type: ignore[arg-type]
    held = saver.leases.held(partition)  # the lease of a `with saver.lease(...)` block on this thread, if any
    journal = Journal(
        saver.backend, saver.integrity, partition, max_item_bytes=saver.max_item_bytes,
        label=f"thread {thread!r}", writer=lambda puts, lease: saver.fenced_write_flow(partition, puts, ()),
    )  # fmt: skip
    # the held lease names the owner and token in the intent; the saver's write applies it
    lease = None if held is None else held.lease
    return journal.effect(parts, lease=lease, owner=owner, reconcile=reconcile, retry_safe=retry_safe)


#: The effect of the effect_tool call running in this context (see :func:`current_effect`).
_CURRENT: ContextVar[Effect | None] = ContextVar("checkpointers_current_effect", default=None)


def current_effect() -> Effect:
    """Inside a function decorated with :func:`effect_tool`: its effect (``.key`` for the downstream call)."""
    fx = _CURRENT.get()
    if fx is None:
        raise InvalidArgumentError("current_effect()", "is only available inside a call of an @effect_tool function")
    return fx


def effect_tool(
    saver: Checkpointer, name: str | None = None, *, reconcile: Reconcile | None = None, retry_safe: bool = False
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Make every call of a tool (or of any function a node calls) one journaled effect of the running task.

    The function runs once: a call that finds its effect done returns the
    stored outcome without running it; its return value (bytes or JSON-able)
    is the outcome. Inside it, :func:`current_effect` gives the effect
    (``current_effect().key``: the idempotency key). The effect is named
    ``name`` (default: the function's name), plus ``:<tool_call_id>`` when the
    call has a ``tool_call_id`` keyword (LangChain's ``InjectedToolCallId``),
    so the calls of one tool node's task stay apart::

        @tool
        @effect_tool(saver, reconcile=mail.find)
        def send_email(to: str, tool_call_id: Annotated[str, InjectedToolCallId]) -> str:
            return mail.send(to, idempotency_key=current_effect().key)

    Works for sync and async functions (``async with``); the task is the one
    ``langgraph.config.get_config()`` names.
    """

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        base = name or fn.__name__

        def block(kwargs: Mapping[str, Any]) -> EffectBlock:
            call_id = kwargs.get("tool_call_id")
            label = base if call_id is None else f"{base}:{call_id}"
            return saver_effect(saver, None, label, reconcile=reconcile, retry_safe=retry_safe)

        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def acall(*args: Any, **kwargs: Any) -> Any:
                async with block(kwargs) as fx:
                    if not fx.done:
                        token = _CURRENT.set(fx)
                        try:
                            await fx.arecord(await fn(*args, **kwargs))
                        finally:
                            _CURRENT.reset(token)
                return fx.outcome

            return acall

        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            with block(kwargs) as fx:
                if not fx.done:
                    token = _CURRENT.set(fx)
                    try:
                        fx.record(fn(*args, **kwargs))
                    finally:
                        _CURRENT.reset(token)
            return fx.outcome

        return call

    return decorate
