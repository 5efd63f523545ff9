"""Test helpers for leases: an injectable clock, and gates that pause one thread's backend calls.

* :class:`FakeClock`: a wall clock the test moves by hand (``Store(clock=...)``).
* :class:`GatedBackend`: wraps any backend; :meth:`GatedBackend.gate` makes
  the next ``write`` of one thread stop before it reaches the backend (a GC
  pause or ``SIGSTOP`` between a flow's steps) until the test opens the gate.
* :class:`GatedObjectStore`: the same inside the S3 backend, at its
  object-store port: one thread's batch stops right before its first
  conditional PUT (after the redo log's pre-read), which no wrapper of the
  five backend operations can reach.
"""

from __future__ import annotations

import builtins
import threading
import time
from collections.abc import Sequence
from typing import Any

from checkpointers._names import Partition
from checkpointers.backends.base import Backend, Delete, ListQuery, Put, Record, WriteResult


class FakeClock:
    """Seconds since the epoch, moved only by :meth:`advance`.

    Starts at the real time rounded down to the second, so that times the
    test adds up (halves, whole seconds) are exact in milliseconds.
    """

    def __init__(self, start: float | None = None) -> None:
        self.now = float(int(time.time())) if start is None else start
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self.now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.now += seconds


class Gate:
    """One pause point: the paused thread sets ``reached`` and waits for ``opened``."""

    def __init__(self) -> None:
        self.reached = threading.Event()
        self.opened = threading.Event()

    def pass_through(self, timeout: float = 30.0) -> None:
        self.reached.set()
        if not self.opened.wait(timeout):
            raise TimeoutError("the test never opened the gate")


class _Gates:
    """Gates by thread id, each used once."""

    def __init__(self) -> None:
        self._gates: dict[int, Gate] = {}
        self._lock = threading.Lock()

    def arm(self, thread_id: int) -> Gate:
        gate = Gate()
        with self._lock:
            self._gates[thread_id] = gate
        return gate

    def take(self) -> Gate | None:
        with self._lock:
            return self._gates.pop(threading.get_ident(), None)


class GatedBackend(Backend):
    """Any backend, with a gate on one thread's next ``write``/``awrite``."""

    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self.kind = inner.kind
        self._gates = _Gates()

    def gate(self, thread_id: int) -> Gate:
        """Pause the next write of thread ``thread_id`` until the returned gate is opened."""
        return self._gates.arm(thread_id)

    def get(self, partition: Partition, names: Sequence[str]) -> list[Record | None]:
        return self.inner.get(partition, names)

    def write(self, partition: Partition, puts: Sequence[Put], deletes: Sequence[Delete] = ()) -> WriteResult:
        gate = self._gates.take()
        if gate is not None:
            gate.pass_through()
        return self.inner.write(partition, puts, deletes)

    def list(self, partition: Partition, query: ListQuery) -> list[Record]:
        return self.inner.list(partition, query)

    def partitions(self, user: str, space: str) -> builtins.list[str]:
        return self.inner.partitions(user, space)

    def drop(self, partition: Partition) -> int:
        return self.inner.drop(partition)

    async def aget(self, partition: Partition, names: Sequence[str]) -> builtins.list[Record | None]:
        return await self.inner.aget(partition, names)

    async def awrite(self, partition: Partition, puts: Sequence[Put], deletes: Sequence[Delete] = ()) -> WriteResult:
        return await self.inner.awrite(partition, puts, deletes)

    async def alist(self, partition: Partition, query: ListQuery) -> builtins.list[Record]:
        return await self.inner.alist(partition, query)

    async def apartitions(self, user: str, space: str) -> builtins.list[str]:
        return await self.inner.apartitions(user, space)

    async def adrop(self, partition: Partition) -> int:
        return await self.inner.adrop(partition)


class GatedObjectStore:
    """The S3 backend's object-store port with a gate on one thread's next conditional PUT.

    Installed with :meth:`install` over ``S3Backend._batches.store``; every
    call goes to the real port (moto), one thread's next ``put_if`` waits first.
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self._gates = _Gates()

    @classmethod
    def install(cls, backend: Any) -> GatedObjectStore:
        gated = cls(backend._batches.store)
        backend._batches.store = gated
        return gated

    def gate(self, thread_id: int) -> Gate:
        return self._gates.arm(thread_id)

    def put_if(self, key: str, body: bytes, *, absent: bool = False, match: str | None = None) -> str | None:
        gate = self._gates.take()
        if gate is not None:
            gate.pass_through()
        return self.inner.put_if(key, body, absent=absent, match=match)  # type: ignore[no-any-return]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)
