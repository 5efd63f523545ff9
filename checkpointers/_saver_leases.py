"""Thread leases for the faces (LangGraph saver, Agent Framework storage).

A face holds a :class:`LeaseRegistry`: the leases this process holds, by
partition (user and thread, or user and run). Every write of the face goes
through :meth:`LeaseRegistry.write_flow`, which fences it with the lease held
for its partition (:func:`checkpointers.leases.guarded_write_flow`), so the
writes LangGraph makes on its background threads are fenced too: the
registry is shared by the saver's views and threads, not a context variable.
A write to a partition this process holds no lease for follows the face's
``unleased`` policy: ``"refuse"`` (default) refuses the write while another
owner holds the lease (``LeaseHeldError``), a condition the write carries
itself (one backend write where the backend declares ``inline_conditions``:
:func:`checkpointers.leases.unleased_write_flow`; else one read of the lease
record first), ``"allow"`` writes without looking.

:class:`HeldLease` is what ``saver.lease(...)`` returns: ``with`` (or
``async with``) acquires (``LeaseHeldError`` before anything runs), renews in
the background every ``ttl / 3`` (a daemon thread for ``with``, an asyncio
task for ``async with``: at most one write per ``ttl / 3``), and releases on
exit. A renewal that finds the lease taken over marks it lost; a renewal that
fails otherwise (a transient backend error) is retried at the next tick, and
the lease is marked lost when it expires before one succeeds. Once lost,
the next write of the partition raises :class:`LeaseLostError` without I/O.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Literal

from ._flows import Flow, arun, run, write
from ._names import Partition
from .backends.base import Delete, Put, WriteResult
from .errors import InvalidArgumentError, LeaseHeldError, LeaseLostError
from .leases import Clock, Lease, LeaseMemo, LeaseSite, acquire, check_ttl, guarded_write_flow, unleased_write_flow

if TYPE_CHECKING:
    from .backends.base import Backend

__all__ = ["HeldLease", "LeaseRegistry", "Unleased", "check_unleased"]

logger = logging.getLogger("checkpointers.leases")

Unleased = Literal["refuse", "allow"]
#: How many partitions' lease sites a registry keeps built (one per thread written to).
_SITES = 4096


def check_unleased(value: object) -> Unleased:
    """The ``unleased=`` policy of a face: ``"refuse"`` or ``"allow"``."""
    if value == "refuse":
        return "refuse"
    if value == "allow":
        return "allow"
    raise InvalidArgumentError("unleased", f"must be 'refuse' or 'allow', got {value!r}")


class LeaseRegistry:
    """The leases one face holds in this process, by partition; the write path that applies them."""

    def __init__(
        self, backend: Backend, clock: Clock, unleased: Unleased, site_of: Callable[[Partition], LeaseSite] | None
    ) -> None:
        """``site_of`` names the lease record of a partition for unleased writes (None: they are not checked)."""
        self.backend = backend
        self.clock = clock
        self.unleased = unleased
        self.site_of = site_of
        #: Lease record versions seen nobody holding, for unleased writes (see :class:`LeaseMemo`; None:
        #: the backend's unleased writes read the lease record first).
        self.memo = LeaseMemo.for_backend(backend)
        self._held: dict[Partition, HeldLease] = {}
        self._sites: dict[str, LeaseSite] = {}  # site_of's answers by partition key (bounded: _SITES)
        self._lock = threading.Lock()

    def hold(self, p: Partition, held: HeldLease) -> None:
        """Register ``held`` as this process's lease on ``p`` (one at a time: else LeaseHeldError)."""
        with self._lock:
            other = self._held.get(p)
            if other is not None:
                lease = other._lease  # None while the other block is still acquiring
                token, until = (0, 0.0) if lease is None else (lease.token, lease.expires_at)
                raise LeaseHeldError(held.site.label, other.owner, token, until)
            self._held[p] = held

    def drop(self, p: Partition, held: HeldLease) -> None:
        with self._lock:
            if self._held.get(p) is held:
                del self._held[p]

    def held(self, p: Partition) -> HeldLease | None:
        """The lease this process holds on ``p`` (inside a ``lease`` block), or None."""
        return self._held.get(p)

    def write_flow(self, p: Partition, puts: Sequence[Put], deletes: Sequence[Delete]) -> Flow[WriteResult]:
        """One atomic batch of ``p``, fenced by the lease held on it, else checked by the unleased policy."""
        held = self._held.get(p) if self._held else None
        lease = None if held is None else held.current()
        if lease is not None:
            return guarded_write_flow(lease.site, lease, puts, deletes, clock=self.clock)
        site_of = self.site_of
        if self.unleased == "allow" or site_of is None:
            return write(p, tuple(puts), tuple(deletes))
        site = self._sites.get(p.key)
        if site is None:
            if len(self._sites) >= _SITES:
                self._sites.clear()  # a bound, not an LRU: a site is cheap to build again
            site = self._sites[p.key] = site_of(p)
        if self.memo is not None:  # what guarded_write_flow does with a memo, one generator less per write
            return unleased_write_flow(site, puts, deletes, clock=self.clock, memo=self.memo)
        return guarded_write_flow(site, None, puts, deletes, clock=self.clock)


class HeldLease:
    """A lease on one thread (or run) held for a ``with`` / ``async with`` block, renewed in the background.

    Inside the block every write of the face to that partition is fenced
    with it. ``lease`` is the :class:`~checkpointers.leases.Lease` (``token``,
    ``owner``, ``expires_at``); ``lost`` is the :class:`LeaseLostError` once a
    renewal found it taken over (or expired unrenewed), else None.
    """

    def __init__(self, registry: LeaseRegistry, site: LeaseSite, owner: str, ttl: float) -> None:
        self.site = site
        self.owner = owner
        self.ttl = check_ttl(ttl) / 1000
        self.renewals = 0
        self.lost: LeaseLostError | None = None
        self._registry = registry
        self._lease: Lease | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def lease(self) -> Lease:
        """The lease held (only inside the block)."""
        if self._lease is None:
            raise InvalidArgumentError("lease", f"the lease on {self.site.label!r} is not held: enter the block first")
        return self._lease

    @property
    def token(self) -> int:
        """The fencing token of this holder."""
        return self.lease.token

    def current(self) -> Lease | None:
        """The lease to fence a write with (None while acquiring); the recorded ``LeaseLostError`` once lost."""
        if self.lost is not None:
            raise self.lost
        return self._lease

    @property
    def _backend(self) -> Backend:
        return self._registry.backend

    def _acquire_flow(self) -> Flow[Lease]:
        return acquire(self.site, self._backend, self.owner, self.ttl, self._registry.clock)

    def _reserve(self) -> None:
        """Take this process's slot for the partition before acquiring (a second block: LeaseHeldError, no I/O)."""
        self._registry.hold(self.site.partition, self)

    def _renewed(self, error: Exception | None) -> None:
        """Account for one renewal attempt's outcome (see the module docstring)."""
        lease = self.lease
        if error is None:
            self.renewals += 1
        elif isinstance(error, LeaseLostError):
            self.lost = error
        elif lease.remaining() <= 0:
            self.lost = LeaseLostError(
                self.site.label, lease.owner, lease.token, None, None, f"it expired while renewals failed ({error!r})"
            )
        else:
            logger.warning("renewing the lease on %r failed, retrying: %r", self.site.label, error)

    # -- sync -------------------------------------------------------------

    def _renew_loop(self) -> None:
        while self.lost is None and not self._stop.wait(self.ttl / 3):
            try:
                self.lease.renew()
            except Exception as exc:  # the loop must not die: lost, or retried next tick
                self._renewed(exc)
            else:
                self._renewed(None)

    def __enter__(self) -> HeldLease:
        self._reserve()
        try:
            self._lease = run(self._acquire_flow(), self._backend)
        except BaseException:
            self._registry.drop(self.site.partition, self)
            raise
        self._thread = threading.Thread(target=self._renew_loop, name=f"lease-renew-{self.site.label}", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._registry.drop(self.site.partition, self)
        try:
            self.lease.release()
        except LeaseLostError:
            if exc_type is None:
                raise

    # -- async ------------------------------------------------------------

    async def _arenew_loop(self) -> None:
        while self.lost is None:
            await asyncio.sleep(self.ttl / 3)
            try:
                await self.lease.arenew()
            except Exception as exc:  # as in _renew_loop
                self._renewed(exc)
            else:
                self._renewed(None)

    async def __aenter__(self) -> HeldLease:
        self._reserve()
        try:
            self._lease = await arun(self._acquire_flow(), self._backend)
        except BaseException:
            self._registry.drop(self.site.partition, self)
            raise
        self._task = asyncio.get_running_loop().create_task(self._arenew_loop())
        return self

    async def __aexit__(self, exc_type: object, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._registry.drop(self.site.partition, self)
        try:
            await self.lease.arelease()
        except LeaseLostError:
            if exc_type is None:
                raise

    def __repr__(self) -> str:
        state = "not held" if self._lease is None else f"token={self._lease.token}"
        return f"HeldLease({self.site.label!r}, owner={self.owner!r}, {state}, lost={self.lost is not None})"
