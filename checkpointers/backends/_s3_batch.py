"""S3 batches: several records written all or nothing, over an object store without transactions.

The whole protocol lives here, as h11 keeps its state machine in one file:
the batch states and the transitions allowed between them, the writer's two
ways (optimistic and redo log), the reader's settling of the batches it meets,
and recovery. It runs over a four-method **port**, :class:`ObjectStore`
(``get``, ``put_if``, ``delete_if``, ``list``); the key layout is the
caller's (:class:`Keys`). No boto3 here: :mod:`checkpointers.backends.s3`
implements the port over boto3 and translates its errors at the edge; the
tests run the protocol over an in-memory fake with crash points.

Every object a batch writes carries its id (a *marker*): records, tombstones
and the manifest ``<p>/tx/<id>``. The objects' bytes are
:mod:`checkpointers.backends._s3_objects`'s.

**Optimistic** (several CREATE/APPEND puts, no deletes): no pre-read. The
manifest (names only) is written with ``If-None-Match: *``: the batch is
OPEN, and readers treat every record carrying its optimistic marker as
absent. The records are written in parallel with ``If-None-Match: *``; a
refused one is read: ours (a retried request), an append no-op, a conflict
(abort), or something only the redo log handles (abort, then the redo log).
Deleting the manifest (``If-Match``) COMMITS. An abort deletes the landed
records, then the manifest. A crashed writer's OPEN batch stays invisible;
once older than ``lease`` a reader or :meth:`Batches.recover` marks it
ABORTING (``"a": 1``, ``If-Match``), deletes its records and then it.

**Redo log** (any other batch): the current objects are read and the
conditions evaluated; the manifest holding every operation (body, and the S3
ETag it replaces or "absent") is written with ``If-None-Match: *``: LOGGED.
A batch with an etag condition applies its *fence* first, alone: its first
IF_MATCH put (else its first delete with ``if_match``; a fenced write's
lease record). Refused (the record changed after the pre-read) and not
ours, the manifest is deleted (LOGGED -> ABORTED) and the conflict
returned: no object carried the marker yet, so no reader rolled it
forward. Then the operations are applied in parallel, each conditioned on
that ETag; deletes land as tombstones. Deleting the manifest COMMITS; the tombstones
are then removed. A reader that meets the marker of a batch it has not seen
complete rolls it forward (same operations, same conditions, idempotent) and
reads again, unless it read given names and met every one of the batch's
records among them carrying its marker, the batch's names being known to
its process (it wrote the batch or read its manifest: see
:meth:`Batches.consistent`; a hot record every batch re-puts, a lease
record, no longer starves the reads of its writers). A LOGGED batch that no record refers to (a crash before its
first operation landed) is not visible; recovery deletes it once older than
``lease`` (ABORTED).

States and the transitions allowed (anything else is :class:`IllegalTransition`)::

    NEW ──> OPEN ──────────> COMMITTED
     │       │  └─> ABORTING ──> ABORTED <─┐
     │       └─────────────────> ABORTED   │  (a writer finding its batch aborted)
     └─> LOGGED ──> COMMITTED              │
            └────────────────> ABORTED ────┘  (recovery: nothing of it landed)
    SEEN ──> GONE | OPEN | LOGGED | ABORTING | DAMAGED

A writer's batch starts NEW; a batch a reader or recovery meets (a marker, a
manifest key) starts SEEN and becomes what its manifest says: GONE (no
manifest: committed or aborted by someone else), OPEN, LOGGED, ABORTING or
DAMAGED (the manifest does not decode: neither rolled forward nor aborted,
and every record carrying its marker is corrupt too).

A record written alone (a single write, outside this protocol) over an
object carrying a marker carries that marker too (:func:`inherited`; the
write is conditioned on the S3 ETag read), so a read meeting the batch's
other records in their old state meets the batch on that record as well.
A multi-record read that meets an absence or a record without a marker
collects every name a second time (see :meth:`Batches.unchanged`): a
committed delete leaves no marker once its tombstone is dropped, and a
record created alone on the absent name carries none. Listings collect
twice only for an absence; they date a record without a marker by the S3
ETag their LIST gave (see :mod:`checkpointers.backends.s3`). Recovery
drops a tombstone only when its batch's manifest is no longer listed after
the tombstone was read.
"""

from __future__ import annotations

import builtins
import enum
import random
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from ..errors import BackendUnavailableError, CorruptItemError
from ._s3_objects import (
    TX_ID,
    Obj,
    Op,
    OptimisticManifest,
    RedoLog,
    as_record,
    decode_manifest,
    decode_object,
    optimistic_manifest,
    record_body,
    redo_manifest,
    tombstone,
)
from .base import Conflict, Delete, Mode, Put, Record, content_digest, evaluate

#: Randomness of the read repeats' pauses (not secret, not seeded: only desynchronizes readers).
_JITTER = random.Random()
#: The longest pause between repeats of a read that other writers' batches keep disturbing.
_MAX_PAUSE = 0.2

__all__ = [
    "TRANSITIONS",
    "Batch",
    "BatchState",
    "Batches",
    "Clock",
    "ConditionsUnsupported",
    "Deleted",
    "IllegalTransition",
    "Keys",
    "ObjectStore",
    "Recovery",
    "Stored",
    "inherited",
    "visible",
]

T = TypeVar("T")
A = TypeVar("A")
R = TypeVar("R")

OPTIMISTIC_MODES = (Mode.APPEND, Mode.CREATE)  # UPSERTs usually replace: the redo log
_DONE_CACHE = 100_000
#: How many redo-log batches' record names a process keeps (see :meth:`Batches.consistent`): only needed
#: while a read that began before the batch completed can still meet its marker.
_NAMES_CACHE = 4096


# -- states ------------------------------------------------------------------------


class BatchState(enum.Enum):
    """Where one batch is, as the process handling it knows it."""

    NEW = "new"  #: a writer chose the id; nothing is stored
    SEEN = "seen"  #: a reader or recovery met the id; the manifest is not read yet
    OPEN = "open"  #: optimistic manifest stored: the batch's records read as absent
    LOGGED = "logged"  #: redo-log manifest stored: a reader meeting a marker rolls it forward
    ABORTING = "aborting"  #: being undone: its records are deleted, then its manifest
    COMMITTED = "committed"  #: all of it is visible; the manifest is deleted
    ABORTED = "aborted"  #: none of it is visible; the manifest is deleted
    GONE = "gone"  #: the manifest was already gone: committed or aborted elsewhere
    DAMAGED = "damaged"  #: the manifest does not decode: left as it is


_S = BatchState
#: The allowed transitions: ``TRANSITIONS[old]`` holds every state ``old`` may become.
TRANSITIONS: Mapping[BatchState, frozenset[BatchState]] = {
    _S.NEW: frozenset({_S.OPEN, _S.LOGGED}),
    _S.SEEN: frozenset({_S.GONE, _S.OPEN, _S.LOGGED, _S.ABORTING, _S.DAMAGED}),
    _S.OPEN: frozenset({_S.COMMITTED, _S.ABORTING, _S.ABORTED}),
    _S.LOGGED: frozenset({_S.COMMITTED, _S.ABORTED}),
    _S.ABORTING: frozenset({_S.ABORTED}),
    _S.COMMITTED: frozenset(),
    _S.ABORTED: frozenset(),
    _S.GONE: frozenset(),
    _S.DAMAGED: frozenset(),
}


class IllegalTransition(RuntimeError):
    """A batch was moved along a transition that :data:`TRANSITIONS` does not allow (a bug)."""

    def __init__(self, tx: str, old: BatchState, new: BatchState) -> None:
        self.tx, self.old, self.new = tx, old, new
        allowed = ", ".join(sorted(s.name for s in TRANSITIONS[old])) or "none: it is final"
        super().__init__(f"batch {tx}: {old.name} -> {new.name} is not allowed (from {old.name}: {allowed})")


Trace = Callable[[str, BatchState, BatchState], None]


@dataclass
class Batch:
    """One batch's id and state; :meth:`to` moves it, checked against :data:`TRANSITIONS`."""

    tx: str
    state: BatchState = BatchState.NEW
    trace: Trace | None = field(default=None, repr=False, compare=False)

    def to(self, new: BatchState) -> None:
        if new not in TRANSITIONS[self.state]:
            raise IllegalTransition(self.tx, self.state, new)
        if self.trace is not None:
            self.trace(self.tx, self.state, new)
        self.state = new

    @property
    def created_ns(self) -> int:
        """When the writer chose the id (its first 20 digits, ``time_ns``)."""
        return int(self.tx.split("-", 1)[0])


# -- the port ----------------------------------------------------------------------


@dataclass(frozen=True)
class Stored:
    """An object as ``get`` returns it: its bytes and its (S3) ETag."""

    body: bytes
    etag: str


class Deleted(enum.Enum):
    """What a ``delete_if`` did."""

    DELETED = "deleted"
    REFUSED = "refused"  #: another ETag is stored
    ABSENT = "absent"  #: nothing was there when the request arrived
    ABSENT_AFTER_RETRY = "absent-after-retry"  #: nothing there, but an earlier attempt may have deleted it


class ConditionsUnsupported(Exception):
    """Raised by a store whose endpoint refuses conditional requests (the S3 backend's error derives from it)."""


class ObjectStore(Protocol):
    """The four object-store calls the protocol makes; every one is atomic on the store."""

    def get(self, key: str) -> Stored | None:
        """The object at ``key``, or None."""

    def put_if(self, key: str, body: bytes, *, absent: bool = False, match: str | None = None) -> str | None:
        """Store ``body``; with ``absent`` only if no object is there, with ``match`` only over that ETag.

        Returns the new ETag, or None when the condition failed.
        """

    def delete_if(self, key: str, match: str | None = None) -> Deleted:
        """Delete ``key``, with ``match`` only if that ETag is stored."""

    def list(self, prefix: str) -> builtins.list[str]:
        """Every key starting with ``prefix``, ascending."""


class Keys(Protocol):
    """Where one partition's records and manifests live (the caller's key layout)."""

    @property
    def records(self) -> str:
        """The prefix of every record key."""

    @property
    def manifests(self) -> str:
        """The prefix of every manifest key (a manifest's key is this + its batch id)."""

    def record(self, name: str) -> str:
        """The key of record ``name``."""

    def name_of(self, key: str) -> str:
        """The record name of a listed record key; CorruptItemError for a key that is not one."""

    def manifest(self, tx: str) -> str:
        """The key of batch ``tx``'s manifest."""

    @property
    def gen(self) -> int:
        """The partition's current generation (retention): records of another one read as absent."""


class Parallel(Protocol):
    """Runs ``fn`` over ``items`` (maybe in parallel); the results in order, after every call ended."""

    def __call__(self, fn: Callable[[A], R], items: Iterable[A], /) -> builtins.list[R]: ...


def _in_order(fn: Callable[[A], R], items: Iterable[A], /) -> builtins.list[R]:
    return [fn(item) for item in items]


@dataclass(frozen=True)
class Clock:
    """Wall clock (batch ids, the lease), monotonic clock (read deadlines) and sleep."""

    now_ns: Callable[[], int] = time.time_ns
    monotonic: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep


SYSTEM_CLOCK = Clock()


# -- results -----------------------------------------------------------------------


@dataclass(frozen=True)
class Recovery:
    """What :meth:`Batches.recover` did, and the damaged objects it left in place (in the order met)."""

    rolled: int
    aborted: int
    damaged: tuple[CorruptItemError, ...] = ()


@dataclass(frozen=True)
class _Landing:
    """An optimistic batch's records after their PUTs: which are stored, and what stops it."""

    landed: Mapping[int, str]  #: put index -> S3 ETag of the batch's own stored record
    records: tuple[Record, ...]  #: the result if it commits (an append no-op: the stored record)
    conflict: Conflict | None = None
    damaged: CorruptItemError | None = None
    fallback: bool = False  #: only the redo log can write it

    @property
    def commits(self) -> bool:
        return self.conflict is None and self.damaged is None and not self.fallback


@dataclass(frozen=True)
class _Plan:
    """A redo-log batch's operations and the records it returns."""

    ops: tuple[Op, ...]
    records: tuple[Record, ...]


@dataclass(frozen=True)
class _Met:
    """What a read attempt's markers ask for: batches to hide, another attempt, a pause."""

    hide: frozenset[str] = frozenset()
    again: bool = False
    rolled: bool = False


@dataclass(frozen=True)
class _Recovered:
    """One manifest's recovery."""

    tx: str
    rolled: int = 0
    aborted: int = 0
    damaged: tuple[CorruptItemError, ...] = ()


def visible(obj: Obj | None, hidden: frozenset[str], gen: int = 0) -> Obj | None:
    """``obj`` as a reader sees it: a record of a batch in ``hidden`` (uncommitted optimistic), or of
    another generation than ``gen`` (an expired partition's), reads as absent.

    It is returned as a tombstone-like object (record ``None``) that keeps
    its S3 ETag, so a writer can still replace it conditionally.
    """
    if obj is not None and (obj.tx in hidden or (obj.gen != gen and obj.record is not None)):
        return Obj(None, obj.tx, obj.s3etag, obj.optimistic, obj.name)
    return obj


def inherited(obj: Obj | None) -> str | None:
    """The marker a record written alone over ``obj`` carries: ``obj``'s, so the chain keeps naming its batch.

    ``obj`` is what a single write read (through :meth:`Batches.read`) and
    then replaced, conditioned on its S3 ETag. When it carries the marker
    of a batch, the new record carries that marker too (not optimistic): a
    read that met the batch's other records in their old state meets the
    marker on the record that replaced the batch's, settles the batch (its
    manifest is gone: committed) and repeats (see :meth:`Batches.consistent`).
    Without it that record names no batch, and the read would return the
    batch's old state beside a write made after it. An uncommitted
    optimistic batch's record (hidden: ``record`` None, optimistic) passes
    nothing on: its marker would hide the new record while that batch is open.
    """
    if obj is None or obj.tx is None or (obj.record is None and obj.optimistic):
        return None
    return obj.tx


# -- the protocol ------------------------------------------------------------------


class Batches:
    """The batch protocol over ``store``, for every partition of one backend instance.

    ``lease``: how long a writer may take to apply a batch before a reader or
    recovery aborts it. ``read_timeout``: how long a read keeps repeating
    while batches land under it. ``parallel`` runs a batch's requests
    (default: in order). ``where`` names the store in error messages.
    ``new_id`` and ``clock`` are for tests; ``trace`` sees every transition.
    """

    def __init__(
        self,
        store: ObjectStore,
        *,
        where: str,
        lease: float = 60.0,
        read_timeout: float = 10.0,
        parallel: Parallel = _in_order,
        clock: Clock = SYSTEM_CLOCK,
        new_id: Callable[[], str] | None = None,
        trace: Trace | None = None,
    ) -> None:
        self.store = store
        self.where = where
        self.lease = lease
        self.read_timeout = read_timeout
        self._parallel = parallel
        self._clock = clock
        # Not uuid.uuid4: LangGraph's tests patch it (test_root_graph), and batch ids are drawn in worker threads.
        self._new_id = new_id or (lambda: secrets.token_hex(16))
        self._trace = trace
        self._lock = threading.Lock()
        self._done: OrderedDict[str, float] = OrderedDict()  # tx id -> when seen complete
        self._names: OrderedDict[str, frozenset[str]] = OrderedDict()  # redo-log tx id -> the names it changes

    def _batch(self, tx: str, state: BatchState = BatchState.NEW) -> Batch:
        return Batch(tx, state, self._trace)

    def _new_batch(self) -> Batch:
        return self._batch(f"{self._clock.now_ns():020d}-{self._new_id()}")

    def _expired(self, batch: Batch, now_ns: int | None = None) -> bool:
        now_ns = self._clock.now_ns() if now_ns is None else now_ns
        return now_ns - batch.created_ns > self.lease * 1e9

    # -- reads -----------------------------------------------------------------------

    def fetch(self, keys: Keys, name: str, values: bool = True) -> Obj | None:
        """The record object ``name`` as stored (no batch handling); CorruptItemError if damaged."""
        got = self.store.get(keys.record(name))
        return None if got is None else decode_object(name, got.body, got.etag, values)

    def read(self, keys: Keys, names: Sequence[str]) -> list[Obj | None]:
        """The objects of ``names``, in one consistent state (see :meth:`consistent`)."""

        def attempt(hidden: frozenset[str]) -> tuple[list[Obj | None], list[Obj]]:
            objs = self._parallel(lambda n: self.fetch(keys, n), names)
            return [visible(o, hidden, keys.gen) for o in objs], [o for o in objs if o is not None]

        def unchanged(objs: list[Obj | None]) -> bool:
            traceless = any(o is None or o.tx is None or o.record is None for o in objs)
            return not traceless or self.unchanged(keys, names, objs)

        multi = len(names) > 1
        return self.consistent(keys, attempt, multi, unchanged if multi else None, frozenset(names) if multi else None)

    def unchanged(self, keys: Keys, names: Sequence[str], objs: Sequence[Obj | None]) -> bool:
        """Whether every object of ``names`` is still the one read (same S3 ETag, or still absent).

        Asked when a multi-record read met an object that names no batch it
        could check: an absence (a batch that deleted it may have committed
        and dropped its tombstone between the GETs of one read, after
        another of its records was read in its old state), a record without
        a marker (created alone on a name such a batch deleted: a record
        written alone over a marked one inherits its marker), a tombstone
        or a hidden record. A second collect finding every object
        as the first did proves each held its value from its first GET to
        its second, so all of them together at one moment between the two.
        A read whose every record carries a marker needs none: a batch that
        committed under it is met by its marker, settled, and read again.
        """
        again = self._parallel(lambda n: self.store.get(keys.record(n)), names)
        return all(
            (got.etag if got is not None else None) == (obj.s3etag if obj is not None else None)
            for got, obj in zip(again, objs, strict=True)
        )

    def consistent(
        self,
        keys: Keys,
        attempt: Callable[[frozenset[str]], tuple[T, list[Obj]]],
        multi: bool,
        unchanged: Callable[[T], bool] | None = None,
        scope: frozenset[str] | None = None,
    ) -> T:
        """Run a read; settle every batch marker it met that is not known complete.

        ``attempt(hidden)`` returns its result and every object it read; it
        must treat records of the batches in ``hidden`` as absent. A LOGGED
        batch is rolled forward, and a read that met several objects
        (``multi``) is then repeated, so it never mixes the before- and
        after-states of one batch; so is a multi read that met a redo-log
        batch already GONE (committed), which it may have met half-applied.
        An OPEN batch means "not committed": the read is repeated with it
        hidden. A batch found GONE is also read again when the marker was
        optimistic: its records were proven committed only if they are
        still there after the manifest was seen gone (an abort deletes the
        records before the manifest). Under a stream of batches the repeats
        back off, then raise :class:`BackendUnavailableError` rather than
        return a mixed state. ``unchanged(result)``, when given, is asked
        last: False (what was read changed under the read, see
        :meth:`unchanged`) repeats it too.

        ``scope``: every name the read covers (a read of given names; None
        for a listing, whose range the protocol does not know). A redo-log
        batch rolled forward or found GONE whose record names this process
        knows (it logged the batch, or read its manifest) needs no repeat
        when the read met every one of them within ``scope`` in the batch's
        state (carrying its marker): no record of it was read in its old
        state. Without that, writers under one lease starved each other's
        reads: every fenced batch re-puts the lease record with its marker,
        so each attempt of a batch's pre-read met the marker of the batch
        that fenced just before, found it GONE, and repeated, until
        ``read_timeout`` (the batch changed only the lease record and its
        own names, none of which the read had read in the old state).
        """
        deadline = self._clock.monotonic() + self.read_timeout
        pause = 0.001
        hidden: frozenset[str] = frozenset()
        while True:
            started = self._clock.monotonic()
            result, objs = attempt(hidden)
            met = self._settle_met(keys, objs, hidden, started, multi, scope)
            if not met.again and (unchanged is None or unchanged(result)):
                return result
            met = met if met.again else _Met(again=True, rolled=True)  # changed under the read: pause, repeat
            if self._clock.monotonic() > deadline:
                raise BackendUnavailableError(
                    f"no consistent read of partition {keys.records!r} on {self.where} within "
                    f"{self.read_timeout} s: other writers' batches kept landing during the read"
                )
            hidden |= met.hide
            if met.rolled:  # full jitter: readers that met the same batches do not retry in step
                self._clock.sleep(pause * (0.5 + _JITTER.random()))
                pause = min(pause * 2, _MAX_PAUSE)

    def _settle_met(
        self,
        keys: Keys,
        objs: list[Obj],
        hidden: frozenset[str],
        started: float,
        multi: bool,
        scope: frozenset[str] | None = None,
    ) -> _Met:
        """Settle the batches whose markers ``objs`` carry (those not hidden nor seen complete since ``started``).

        A multi read repeats after a redo-log batch it met committed (rolled
        forward now, or GONE) unless it read that batch whole (see
        :meth:`_met_whole`); an optimistic batch found GONE is always re-read.
        """
        pending = {
            (o.tx, o.optimistic) for o in objs if o.tx and o.tx not in hidden and not self._done_before(o.tx, started)
        }
        hide: set[str] = set()
        again = rolled = False
        for tx, optimistic in pending:
            state = self._settle_marked(keys, tx, objs)
            if state is BatchState.GONE and optimistic:  # its records are proven committed only when read again
                again = True
            elif state in (BatchState.COMMITTED, BatchState.GONE):  # a multi read may have met it half-applied
                if multi and not self._met_whole(tx, objs, scope):
                    again = True
                    rolled = rolled or state is BatchState.COMMITTED
            else:  # OPEN, ABORTING, ABORTED: not committed
                hide.add(tx)
                again = True
        return _Met(frozenset(hide), again, rolled)

    def _met_whole(self, tx: str, objs: Sequence[Obj], scope: frozenset[str] | None) -> bool:
        """Whether a read over ``scope`` met every record of committed redo-log batch ``tx`` in its state.

        True only when the batch's names are known here and each one in
        ``scope`` was read carrying the batch's marker (its record or
        tombstone, or a record written alone after it, which inherits the
        marker). An absence or another marker at one of them may be that
        name's state from before the batch: False, and the read repeats.
        """
        with self._lock:
            names = self._names.get(tx)
        if names is None or scope is None:
            return False
        marked = {o.name for o in objs if o.tx == tx}
        return all(name in marked for name in names & scope)

    def _know_names(self, tx: str, ops: Sequence[Op]) -> None:
        """Keep the names redo-log batch ``tx`` changes (its writer, or a reader of its manifest)."""
        with self._lock:
            self._names[tx] = frozenset(op.name for op in ops)
            self._names.move_to_end(tx)
            while len(self._names) > _NAMES_CACHE:
                self._names.popitem(last=False)

    def _settle_marked(self, keys: Keys, tx: str, objs: list[Obj]) -> BatchState:
        """:meth:`settle`, a damaged manifest reported as the record carrying its marker."""
        try:
            return self.settle(keys, tx)
        except CorruptItemError as exc:
            if exc.key != f"tx/{tx}":
                raise
            name = next(o.name for o in objs if o.tx == tx)
            raise CorruptItemError(
                name,
                f"it carries the marker of batch {tx}, whose manifest is damaged ({exc.reason}): "
                f"the batch can be neither completed nor discarded, so the record is not returned",
            ) from exc

    def settle(self, keys: Keys, tx: str) -> BatchState:
        """Settle a batch a reader met: GONE, COMMITTED (rolled forward now), or OPEN/ABORTING/ABORTED.

        An OPEN batch older than the lease is aborted first. A damaged
        manifest is :class:`CorruptItemError` naming ``tx/<id>``.
        """
        batch = self._batch(tx, BatchState.SEEN)
        got = self.store.get(keys.manifest(tx))
        if got is None:
            batch.to(BatchState.GONE)
            self._mark_done(tx)
            return batch.state
        manifest = self._manifest_of(batch, got)
        if isinstance(manifest, OptimisticManifest):
            batch.to(BatchState.ABORTING if manifest.aborting else BatchState.OPEN)
            if not manifest.aborting and self._expired(batch):
                self._abort(keys, batch, manifest.names, got.etag)  # a damaged record left: recover reports it
            return batch.state
        batch.to(BatchState.LOGGED)
        self._know_names(tx, manifest.ops)
        self._apply(keys, batch, manifest.ops)
        return batch.state

    def _manifest_of(self, batch: Batch, got: Stored) -> RedoLog | OptimisticManifest:
        try:
            return decode_manifest(batch.tx, got.body)
        except CorruptItemError:
            batch.to(BatchState.DAMAGED)
            raise

    def _done_before(self, tx: str, started: float) -> bool:
        with self._lock:
            when = self._done.get(tx)
        return when is not None and when < started

    def _mark_done(self, tx: str) -> None:
        with self._lock:
            self._done[tx] = self._clock.monotonic()
            self._done.move_to_end(tx)
            while len(self._done) > _DONE_CACHE:
                self._done.popitem(last=False)

    # -- writes ----------------------------------------------------------------------

    def write(
        self,
        keys: Keys,
        puts: Sequence[Put],
        deletes: Sequence[Delete],
        seqs: Sequence[int],
        reseq: Callable[[Put, int, int], int],
    ) -> list[Record] | Conflict:
        """Apply several operations all or nothing: the records (``puts``' order) or the first conflict.

        ``seqs[i]`` is ``puts[i]``'s seq; ``reseq(put, seq, floor)`` returns a
        seq above ``floor`` (a replaced record's) when ``seq`` is not.
        Conflict indexes count puts, then deletes.
        """
        if not deletes and all(put.mode in OPTIMISTIC_MODES for put in puts):
            outcome = self._optimistic(keys, puts, seqs)
            if outcome is not None:
                return outcome
        return self._redo(keys, puts, deletes, seqs, reseq)

    def _optimistic(self, keys: Keys, puts: Sequence[Put], seqs: Sequence[int]) -> list[Record] | Conflict | None:
        """Puts expected on absent names: OPEN, land the records, then COMMIT or abort.

        Returns the records, a conflict, or None when the batch must take
        the redo log (a name holds a tombstone, another batch's uncommitted
        record, or was deleted in between). A damaged record at one of the
        names aborts the batch, then is raised.
        """
        batch = self._new_batch()
        names = [put.name for put in puts]
        metag = self._open(keys, batch, names)
        bodies = [record_body(put, seq, batch.tx, True, keys.gen) for put, seq in zip(puts, seqs, strict=True)]
        etags = self._parallel(
            lambda i: self.store.put_if(keys.record(names[i]), bodies[i], absent=True), range(len(puts))
        )
        landing = self._examine(keys, batch.tx, puts, seqs, etags)
        if landing.commits:
            return self._commit(keys, batch, metag, names, landing)
        self._undo(keys, batch, metag, names, landing.landed)
        if landing.damaged is not None:
            raise landing.damaged
        return landing.conflict

    def _open(self, keys: Keys, batch: Batch, names: Sequence[str]) -> str:
        """Store the optimistic manifest (NEW -> OPEN); its S3 ETag."""
        manifest = optimistic_manifest(names)
        key = keys.manifest(batch.tx)
        metag = self.store.put_if(key, manifest, absent=True)
        if metag is None:
            got = self.store.get(key)  # 412 on a retry: did ours land?
            if got is None or got.body != manifest:
                raise RuntimeError(f"batch id {batch.tx} collided")  # 128 random bits: does not happen
            metag = got.etag
        batch.to(BatchState.OPEN)
        return metag

    def _examine(
        self, keys: Keys, tx: str, puts: Sequence[Put], seqs: Sequence[int], etags: Sequence[str | None]
    ) -> _Landing:
        """Read each refused record: ours (a retried PUT), an append no-op, a conflict, or a fallback."""
        landed = {i: etag for i, etag in enumerate(etags) if etag is not None}
        records = [as_record(put, seq) for put, seq in zip(puts, seqs, strict=True)]
        for i in (i for i, etag in enumerate(etags) if etag is None):
            put = puts[i]
            try:
                (cur,) = self.read(keys, [put.name])
            except CorruptItemError as exc:  # abort, then raise it
                return _Landing(landed, tuple(records), damaged=exc)
            if cur is not None and cur.tx == tx:
                landed[i] = cur.s3etag  # ours: a retried request whose first response was lost
            elif cur is None or cur.record is None or put.mode is Mode.UPSERT:
                return _Landing(landed, tuple(records), fallback=True)
            elif cur.record.etag == put.etag or (
                put.mode is Mode.APPEND and content_digest(cur.record.digest) == content_digest(put.digest)
            ):
                records[i] = cur.record  # an append no-op
            else:
                return _Landing(landed, tuple(records), conflict=Conflict(i, put.name, cur.record))
        return _Landing(landed, tuple(records))

    def _commit(self, keys: Keys, batch: Batch, metag: str, names: Sequence[str], landing: _Landing) -> list[Record]:
        """Delete the manifest (``If-Match``): OPEN -> COMMITTED, unless a recovery aborted the batch first."""
        deleted = self.store.delete_if(keys.manifest(batch.tx), metag)
        if deleted is not Deleted.DELETED and landing.landed:
            obj = self.fetch(keys, names[min(landing.landed)], False)
            if obj is None or obj.tx != batch.tx or self.store.get(keys.manifest(batch.tx)) is not None:
                batch.to(BatchState.ABORTED)
                raise BackendUnavailableError(
                    f"batch {batch.tx} on {self.where} was aborted by a recovery before it committed "
                    f"(it took longer than lease={self.lease} s); nothing of it is visible: retry it"
                )
        batch.to(BatchState.COMMITTED)
        self._mark_done(batch.tx)
        return list(landing.records)

    def _undo(self, keys: Keys, batch: Batch, metag: str, names: Sequence[str], landed: Mapping[int, str]) -> None:
        """The writer's own abort: its landed records (``If-Match``), then the manifest."""
        batch.to(BatchState.ABORTING)
        self._parallel(lambda i: self.store.delete_if(keys.record(names[i]), landed[i]), landed)
        self.store.delete_if(keys.manifest(batch.tx), metag)
        batch.to(BatchState.ABORTED)

    def _abort(self, keys: Keys, batch: Batch, names: Sequence[str], metag: str) -> tuple[CorruptItemError, ...]:
        """Abort an OPEN batch older than the lease: mark it ABORTING, delete its records, then it.

        A record that does not decode is left alone (it may be anyone's
        damaged data), and so is the manifest then, so that the batch's other
        records stay invisible; the errors are returned (``recover`` raises them).
        """
        etag = self.store.put_if(keys.manifest(batch.tx), optimistic_manifest(names, aborting=True), match=metag)
        if etag is None:
            return ()  # committed or aborted by someone else meanwhile
        if batch.state is BatchState.OPEN:
            batch.to(BatchState.ABORTING)
        damaged: list[CorruptItemError] = []
        for name in names:
            try:
                obj = self.fetch(keys, name, False)
            except CorruptItemError as exc:
                damaged.append(exc)
                continue
            if obj is not None and obj.tx == batch.tx:
                self.store.delete_if(keys.record(name), obj.s3etag)
        if not damaged:
            self.store.delete_if(keys.manifest(batch.tx), etag)
            batch.to(BatchState.ABORTED)
        return tuple(damaged)

    def _redo(
        self,
        keys: Keys,
        puts: Sequence[Put],
        deletes: Sequence[Delete],
        seqs: Sequence[int],
        reseq: Callable[[Put, int, int], int],
    ) -> list[Record] | Conflict:
        """The redo log: pre-read, evaluate, LOG the manifest, apply the fence alone, then the rest.

        The *fence* is the batch's first etag condition (its first IF_MATCH
        put, else its first delete with ``if_match``; a fenced write's lease
        condition, which the store puts first). It is applied on its own
        before any other operation: refused (the record changed since the
        pre-read), the batch is aborted and its conflict returned. Until it
        lands no object carries the batch's marker, so no reader can have
        rolled the batch forward. One more round trip, only for batches with
        an etag condition.
        """
        names = [p.name for p in puts] + [d.name for d in deletes]
        current = self.read(keys, names)
        existing = {n: o.record for n, o in zip(names, current, strict=True) if o and o.record}
        conflict, noops = evaluate(puts, deletes, existing)
        if conflict is not None:
            return conflict
        batch = self._new_batch()
        floor = max((r.seq for r in existing.values()), default=0)
        written = [reseq(put, seqs[i], floor) for i, put in enumerate(puts) if i not in noops]
        plan = _plan(batch.tx, keys.gen, puts, deletes, current, existing, written, set(noops))
        if not plan.ops:
            return list(plan.records)
        self._log(keys, batch, plan.ops)
        fence = _fence(puts, deletes, plan.ops)
        tombs: list[tuple[str, str]] = []
        if fence is not None:
            at, index = fence
            landed = self._apply_fence(keys, batch, plan.ops[at], index)
            if isinstance(landed, Conflict):
                return landed
            tombs = [(plan.ops[at].name, landed)] if plan.ops[at].delete and landed else []
        self._apply(keys, batch, [op for i, op in enumerate(plan.ops) if fence is None or i != fence[0]], tombs)
        return list(plan.records)

    def _apply_fence(self, keys: Keys, batch: Batch, op: Op, index: int) -> str | Conflict:
        """Apply a LOGGED batch's fence: its S3 ETag ("" if a retried PUT of ours landed), or abort it.

        Refused and not ours: nothing carries the batch's marker, so deleting
        the manifest aborts it (LOGGED -> ABORTED); the conflict names the
        batch operation ``index`` and what is stored now.
        """
        etag = self.store.put_if(keys.record(op.name), op.body, absent=op.pre is None, match=op.pre)
        if etag is not None:
            return etag
        try:
            obj = self.fetch(keys, op.name, False)
        except CorruptItemError:
            self._abort_logged(keys, batch)
            raise
        if obj is not None and obj.tx == batch.tx:
            return ""  # ours: a retried request whose first answer was lost (its tombstone: left to recovery)
        self._abort_logged(keys, batch)
        (cur,) = self.read(keys, [op.name])
        return Conflict(index, op.name, cur.record if cur else None)

    def _abort_logged(self, keys: Keys, batch: Batch) -> None:
        """Delete the manifest of a LOGGED batch none of whose operations landed (LOGGED -> ABORTED)."""
        self.store.delete_if(keys.manifest(batch.tx))
        batch.to(BatchState.ABORTED)

    def _log(self, keys: Keys, batch: Batch, ops: Sequence[Op]) -> None:
        """Store the redo-log manifest (NEW -> LOGGED)."""
        manifest = redo_manifest(ops)
        key = keys.manifest(batch.tx)
        self._know_names(batch.tx, ops)  # before any record can carry its marker
        if self.store.put_if(key, manifest, absent=True) is None:
            got = self.store.get(key)  # 412 on a retry: did ours land?
            if got is None or got.body != manifest:
                raise RuntimeError(f"batch id {batch.tx} collided")  # 128 random bits: does not happen
        batch.to(BatchState.LOGGED)

    def _apply(self, keys: Keys, batch: Batch, ops: Sequence[Op], landed: Sequence[tuple[str, str]] = ()) -> None:
        """Apply a LOGGED batch (idempotent), delete its manifest (COMMITTED), then its tombstones.

        ``landed``: tombstones (name, S3 ETag) already applied (the fence's).
        """

        def one(op: Op) -> tuple[str, str] | None:
            etag = self.store.put_if(keys.record(op.name), op.body, absent=op.pre is None, match=op.pre)
            # None: already applied by someone rolling forward, or superseded by a later write.
            return (op.name, etag) if op.delete and etag else None

        tombs = [*landed, *(t for t in self._parallel(one, ops) if t)]
        self.store.delete_if(keys.manifest(batch.tx))
        batch.to(BatchState.COMMITTED)
        self._mark_done(batch.tx)
        self._parallel(lambda t: self._drop_tombstone(keys, *t), tombs)

    def _drop_tombstone(self, keys: Keys, name: str, s3etag: str) -> None:
        try:
            self.store.delete_if(keys.record(name), s3etag)
        except ConditionsUnsupported:
            pass  # left in place: a tombstone reads as absent

    # -- recovery --------------------------------------------------------------------

    def recover(self, keys: Keys) -> Recovery:
        """Settle every manifest of a partition, then remove leftover tombstones.

        LOGGED batches that left a mark are rolled forward, unmarked ones
        older than the lease aborted; OPEN ones older than the lease aborted.
        Damaged objects are left in place and never the reason to apply,
        abort or delete anything: a manifest that does not decode is neither
        applied nor aborted (and the tombstones of its batch are kept), a
        batch with a record that does not decode is rolled forward if another
        of its records carries its marker, but never aborted. They are
        returned in :attr:`Recovery.damaged`.
        """
        now_ns = self._clock.now_ns()
        done = [self._recover_one(keys, key, now_ns) for key in self.store.list(keys.manifests)]
        damaged = [exc for r in done for exc in r.damaged] + self._sweep_tombstones(keys)
        return Recovery(sum(r.rolled for r in done), sum(r.aborted for r in done), tuple(damaged))

    def _recover_one(self, keys: Keys, key: str, now_ns: int) -> _Recovered:
        tx = key[len(keys.manifests) :]
        if not TX_ID.match(tx):
            reason = (
                "an S3 object among the batch manifests has a key that is not a batch id: a stray or damaged object"
            )
            return _Recovered(tx, damaged=(CorruptItemError(f"tx/{tx}", reason),))
        batch = self._batch(tx, BatchState.SEEN)
        got = self.store.get(key)
        if got is None:
            batch.to(BatchState.GONE)
            return _Recovered(tx)
        try:
            manifest = self._manifest_of(batch, got)
        except CorruptItemError as exc:
            return _Recovered(tx, damaged=(exc,))
        old = self._expired(batch, now_ns)
        if isinstance(manifest, OptimisticManifest):
            batch.to(BatchState.ABORTING if manifest.aborting else BatchState.OPEN)
            if not old:
                return _Recovered(tx)
            left = self._abort(keys, batch, manifest.names, got.etag)
            return _Recovered(tx, aborted=int(not left), damaged=left)
        batch.to(BatchState.LOGGED)
        return self._recover_redo(keys, batch, manifest.ops, got.etag, old)

    def _recover_redo(self, keys: Keys, batch: Batch, ops: Sequence[Op], etag: str, old: bool) -> _Recovered:
        """Roll a LOGGED batch forward if a record carries its marker; abort it if none can and it is old."""
        damaged: list[CorruptItemError] = []
        marked = False
        for op in ops:
            try:
                obj = self.fetch(keys, op.name, False)
            except CorruptItemError as exc:
                damaged.append(exc)
                continue
            marked = marked or (obj is not None and obj.tx == batch.tx)
        if marked:
            self._apply(keys, batch, ops)
            return _Recovered(batch.tx, rolled=1, damaged=tuple(damaged))
        if old and not damaged:
            self.store.delete_if(keys.manifest(batch.tx), etag)
            batch.to(BatchState.ABORTED)
            return _Recovered(batch.tx, aborted=1)
        return _Recovered(batch.tx, damaged=tuple(damaged))

    def _sweep_tombstones(self, keys: Keys) -> list[CorruptItemError]:
        """Delete every tombstone whose batch is over; the damaged records met.

        A tombstone's batch stored its manifest before the tombstone, so a
        manifest not listed *after* the tombstone was read is gone: the batch
        committed. One still listed is live (a writer applying it: the
        manifests listed at the start of :meth:`recover` need not hold it) or
        damaged; its tombstones are kept, so its deletes stay visible only
        with the rest of it.
        """
        damaged: list[CorruptItemError] = []
        tombstones: list[tuple[str, Obj]] = []
        for key in self.store.list(keys.records):
            try:
                name = keys.name_of(key)
                got = self.store.get(key)
                obj = None if got is None else decode_object(name, got.body, got.etag, False)
            except CorruptItemError as exc:
                damaged.append(exc)
                continue
            if obj is not None and obj.record is None:
                tombstones.append((name, obj))
        if tombstones:
            live = {key[len(keys.manifests) :] for key in self.store.list(keys.manifests)}
            for name, obj in tombstones:
                if obj.tx not in live:
                    self._drop_tombstone(keys, name, obj.s3etag)
        return damaged


def _fence(puts: Sequence[Put], deletes: Sequence[Delete], ops: Sequence[Op]) -> tuple[int, int] | None:
    """A redo-log batch's fence: (its index in ``ops``, its index in the batch), or None without etag condition.

    The first IF_MATCH put, else the first delete with ``if_match`` (such
    operations are never no-ops: each has its op, found by name).
    """
    at = {op.name: i for i, op in enumerate(ops)}
    first = next((i for i, put in enumerate(puts) if put.mode is Mode.IF_MATCH), None)
    if first is None:
        first = next((len(puts) + j for j, d in enumerate(deletes) if d.if_match is not None), None)
    if first is None:
        return None
    name = puts[first].name if first < len(puts) else deletes[first - len(puts)].name
    return at[name], first


def _plan(
    tx: str,
    gen: int,
    puts: Sequence[Put],
    deletes: Sequence[Delete],
    current: Sequence[Obj | None],
    existing: Mapping[str, Record],
    seqs: Sequence[int],
    noops: set[int],
) -> _Plan:
    """A redo-log batch's operations (no I/O): each put not a no-op, a tombstone over each existing deleted record.

    ``seqs`` holds the seqs of the puts that are not no-ops, in order.
    """
    ops: list[Op] = []
    records: list[Record] = []
    next_seq = iter(seqs)
    for i, (put, cur) in enumerate(zip(puts, current, strict=False)):
        if i in noops:
            records.append(existing[put.name])
            continue
        seq = next(next_seq)
        ops.append(Op(put.name, cur.s3etag if cur else None, record_body(put, seq, tx, gen=gen), False))
        records.append(as_record(put, seq))
    for d, cur in zip(deletes, current[len(puts) :], strict=True):
        if cur is not None and cur.record is not None:
            ops.append(Op(d.name, cur.s3etag, tombstone(tx), True))
    return _Plan(tuple(ops), tuple(records))
