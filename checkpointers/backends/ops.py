"""The backend operations a flow yields, beside the backend interface they call.

A flow (:mod:`checkpointers.flows`) is a generator that yields these and
receives each one's result: ``call`` runs an operation with a backend's sync
methods, ``acall`` with its async ones. They live under ``backends/`` so that
a backend that batches them (Redis sends a :class:`Parallel` in one pipeline)
imports nothing from the layers above it.

=================  ==============================  ==========================
operation          backend method                  result
=================  ==============================  ==========================
:class:`GetOp`     ``get`` / ``aget``              ``list[Record | None]``
:class:`WriteOp`   ``write`` / ``awrite``          :class:`~.base.WriteResult`
:class:`ListOp`    ``list`` / ``alist``            ``list[Record]``
:class:`PartitionsOp` ``partitions``               ``list[str]``
:class:`DropOp`    ``drop`` / ``adrop``            ``int``
:class:`Parallel`  ``many`` / ``amany``            ``tuple`` of the above
=================  ==============================  ==========================
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .._names import Partition
from .base import Backend, Delete, ListQuery, Put, Record, WriteResult

__all__ = ["DropOp", "GetOp", "ListOp", "Op", "Parallel", "PartitionsOp", "SingleOp", "WriteOp"]


@dataclass(frozen=True)
class GetOp:
    """Read records by name."""

    partition: Partition
    names: Sequence[str]

    def call(self, b: Backend) -> list[Record | None]:
        return b.get(self.partition, self.names)

    async def acall(self, b: Backend) -> list[Record | None]:
        return await b.aget(self.partition, self.names)


@dataclass(frozen=True)
class WriteOp:
    """One atomic conditional batch."""

    partition: Partition
    puts: Sequence[Put]
    deletes: Sequence[Delete] = field(default_factory=tuple)

    def call(self, b: Backend) -> WriteResult:
        return b.write(self.partition, self.puts, self.deletes)

    async def acall(self, b: Backend) -> WriteResult:
        return await b.awrite(self.partition, self.puts, self.deletes)


@dataclass(frozen=True)
class ListOp:
    """List records of a partition."""

    partition: Partition
    query: ListQuery

    def call(self, b: Backend) -> list[Record]:
        return b.list(self.partition, self.query)

    async def acall(self, b: Backend) -> list[Record]:
        return await b.alist(self.partition, self.query)


@dataclass(frozen=True)
class PartitionsOp:
    """List the partitions of one user in one space."""

    user: str
    space: str

    def call(self, b: Backend) -> list[str]:
        return b.partitions(self.user, self.space)

    async def acall(self, b: Backend) -> list[str]:
        return await b.apartitions(self.user, self.space)


@dataclass(frozen=True)
class DropOp:
    """Delete a whole partition."""

    partition: Partition

    def call(self, b: Backend) -> int:
        return b.drop(self.partition)

    async def acall(self, b: Backend) -> int:
        return await b.adrop(self.partition)


@dataclass(frozen=True)
class Parallel:
    """Independent operations run together; yielding it gives their results, in order.

    The operations must not depend on one another (none reads what another
    writes): a backend may run them in any order or at once. The default
    (:meth:`Backend.many`) runs them one by one in sync code and concurrently
    in async code; Redis sends them all in one pipeline (one round trip)::

        blobs, writes = yield Parallel((GetOp(p, names), ListOp(p, query)))
    """

    ops: tuple[SingleOp, ...]

    def call(self, b: Backend) -> tuple[Any, ...]:
        return tuple(b.many(self.ops))

    async def acall(self, b: Backend) -> tuple[Any, ...]:
        return tuple(await b.amany(self.ops))


#: An operation a backend runs by itself (what a :class:`Parallel` holds).
SingleOp = GetOp | WriteOp | ListOp | PartitionsOp | DropOp
#: Anything a flow may yield.
Op = GetOp | WriteOp | ListOp | PartitionsOp | DropOp | Parallel
