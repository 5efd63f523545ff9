"""An in-memory object store for the S3 batch protocol (:mod:`checkpointers.backends._s3_batch`), with crash points.

:class:`FakeStore` implements the four-method port (``get``, ``put_if``,
``delete_if``, ``list``) as S3 does: every call is atomic, ETags are unique,
``If-None-Match: *`` and ``If-Match`` are checked in the same step as the
write. On top of that:

* **Crash points** (:meth:`FakeStore.crash_at`, :meth:`FakeStore.crash_on`):
  :class:`Crash` (a ``BaseException``, like ``kill -9``: no ``except
  Exception`` runs) is raised at the Nth port call, or at the Nth call of
  one kind (``"get"``, ``"put"``, ``"delete"``, ``"list"``) whose key
  contains a given text, either *before* the call (it never happens) or
  *after* it (it happened, its answer is lost).
* A **gate** called before every call, which may pause the calling thread or
  order a crash (the stateful test schedules several threads with it).
* **Observers** that see every call with the object before and after it,
  inside the same atomic step (the stateful test's model of what committed).
"""

from __future__ import annotations

import enum
import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from checkpointers.backends._s3_batch import Deleted, Stored
from checkpointers.errors import CorruptItemError

T = TypeVar("T")


class Crash(BaseException):
    """Stands for kill -9: raised at a crash point, nothing after it in the crashed process runs."""


class Action(enum.Enum):
    """What the gate lets a call do."""

    GO = "go"
    CRASH_BEFORE = "crash-before"  #: the call never reaches the store
    CRASH_AFTER = "crash-after"  #: the call lands, then the caller dies before it sees the answer


@dataclass(frozen=True)
class Call:
    """One port call: its number (from 1), kind, key (the prefix for ``list``) and conditions."""

    n: int
    kind: str
    key: str
    absent: bool = False
    match: str | None = None


@dataclass(frozen=True)
class Event:
    """A call that reached the store: the object at its key before and after, and what it returned."""

    call: Call
    before: Stored | None
    after: Stored | None
    result: object


@dataclass
class _Point:
    kind: str | None  # None: any call
    key_contains: str
    remaining: int
    after: bool

    def hit(self, call: Call) -> bool:
        if (self.kind is not None and call.kind != self.kind) or self.key_contains not in call.key:
            return False
        self.remaining -= 1
        return self.remaining == 0


@dataclass
class FakeStore:
    """S3's object semantics in a dict; see the module docstring for the crash points, gate and observers."""

    objects: dict[str, Stored] = field(default_factory=dict)
    gate: Callable[[Call], Action] | None = None
    observers: list[Callable[[Event], None]] = field(default_factory=list)
    calls: int = 0  #: port calls made so far (crashed ones included)

    def __post_init__(self) -> None:
        self._lock = threading.RLock()
        self._etags = itertools.count(1)
        self._points: list[_Point] = []

    # -- crash points --------------------------------------------------------------

    def crash_at(self, n: int, *, after: bool = False) -> None:
        """Crash at the ``n``-th port call from now (1: the next one)."""
        self._points.append(_Point(None, "", n, after))

    def crash_on(self, kind: str, *, key_contains: str = "", nth: int = 1, after: bool = False) -> None:
        """Crash at the ``nth`` call of ``kind`` from now whose key contains ``key_contains``."""
        self._points.append(_Point(kind, key_contains, nth, after))

    def disarm(self) -> None:
        self._points.clear()

    # -- the port ------------------------------------------------------------------

    def get(self, key: str) -> Stored | None:
        return self._call(Call(0, "get", key), lambda: (self.objects.get(key), self.objects.get(key)))

    def put_if(self, key: str, body: bytes, *, absent: bool = False, match: str | None = None) -> str | None:
        def put() -> tuple[str | None, Stored | None]:
            cur = self.objects.get(key)
            if (absent and cur is not None) or (match is not None and (cur is None or cur.etag != match)):
                return None, cur
            stored = Stored(bytes(body), f'"e{next(self._etags)}"')
            self.objects[key] = stored
            return stored.etag, stored

        return self._call(Call(0, "put", key, absent, match), put)

    def delete_if(self, key: str, match: str | None = None) -> Deleted:
        def delete() -> tuple[Deleted, Stored | None]:
            cur = self.objects.get(key)
            if match is None:
                self.objects.pop(key, None)
                return Deleted.DELETED, None  # S3: 204 whether or not it was there
            if cur is None:
                return Deleted.ABSENT, None
            if cur.etag != match:
                return Deleted.REFUSED, cur
            del self.objects[key]
            return Deleted.DELETED, None

        return self._call(Call(0, "delete", key, match=match), delete)

    def list(self, prefix: str) -> list[str]:
        def listing() -> tuple[list[str], None]:
            return sorted(k for k in self.objects if k.startswith(prefix)), None

        return self._call(Call(0, "list", prefix), listing)

    def _call(self, call: Call, run: Callable[[], tuple[T, Stored | None]]) -> T:
        with self._lock:
            self.calls += 1
            call = Call(self.calls, call.kind, call.key, call.absent, call.match)
            fired = [p for p in self._points if p.hit(call)]
            self._points = [p for p in self._points if p not in fired]
        action = self.gate(call) if self.gate is not None else Action.GO  # may block: outside the lock
        if fired:
            action = Action.CRASH_AFTER if any(p.after for p in fired) else Action.CRASH_BEFORE
        if action is Action.CRASH_BEFORE:
            raise Crash(f"before call {call.n}: {call.kind} {call.key}")
        with self._lock:
            before = self.objects.get(call.key) if call.kind != "list" else None
            result, after = run()
            for observe in self.observers:
                observe(Event(call, before, after, result))
        if action is Action.CRASH_AFTER:
            raise Crash(f"after call {call.n}: {call.kind} {call.key}")
        return result


@dataclass(frozen=True)
class FakeKeys:
    """A partition's key layout for the fake: ``<p>r/<name>`` and ``<p>tx/<id>``."""

    partition: str = "p/"
    gen: int = 0  #: the partition's generation (retention)

    @property
    def records(self) -> str:
        return self.partition + "r/"

    @property
    def manifests(self) -> str:
        return self.partition + "tx/"

    def record(self, name: str) -> str:
        return self.records + name

    def manifest(self, tx: str) -> str:
        return self.manifests + tx

    def name_of(self, key: str) -> str:
        name = key[len(self.records) :]
        if not name or not name.replace("/", "").isalnum():
            raise CorruptItemError(f"r/{name}", "not a record key")
        return name
