"""The backend operations a flow yields, their typed helpers and the one driver.

A flow (:mod:`checkpointers.flows`) is a generator that yields these and
receives each one's result: ``call`` runs an operation with a backend's sync
methods, ``acall`` with its async ones (it returns the backend method's
awaitable itself, not a coroutine of its own: one coroutine less per step).
They live under ``backends/`` so that a backend that batches them (Redis
sends a :class:`Parallel` in one pipeline) imports nothing from the layers
above it.

A flow does not yield an operation itself but goes through its helper, which
yields it and returns its result *typed*, so mypy checks what each step
receives (a bare ``yield`` receives ``Any``)::

    records = yield from get(p, [name])          # list[Record | None]
    result = yield from write(p, puts, deletes)  # WriteResult
    listings = yield from parallel([ListOp(p, q1), ListOp(p, q2)])  # list[list[Record]]

:func:`run` and :func:`arun` drive any generator whose steps have
``call``/``acall`` (a :class:`Step`): the flows over a :class:`Backend`, and
Redis's round trips over its transport (:mod:`.redis`), with one loop.

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

from collections.abc import Awaitable, Generator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, overload

from .._names import Partition
from .base import Backend, Delete, ListQuery, Put, Record, WriteResult, _set

__all__ = [
    "DropOp",
    "Flow",
    "GetOp",
    "ListOp",
    "Op",
    "Parallel",
    "PartitionsOp",
    "SingleOp",
    "Step",
    "WriteOp",
    "arun",
    "drop",
    "get",
    "get_and_lists",
    "listing",
    "parallel",
    "partitions",
    "run",
    "write",
]

T = TypeVar("T")
#: What a step runs on (a :class:`Backend`, or Redis's transport for its round trips).
Target = TypeVar("Target", contravariant=True)
_On = TypeVar("_On")


@dataclass(frozen=True)
class GetOp:
    """Read records by name."""

    partition: Partition
    names: Sequence[str]

    def call(self, b: Backend) -> list[Record | None]:
        return b.get(self.partition, self.names)

    def acall(self, b: Backend) -> Awaitable[list[Record | None]]:
        return b.aget(self.partition, self.names)


@dataclass(frozen=True, init=False)
class WriteOp:
    """One atomic conditional batch.

    One is built per write: its ``__init__`` sets the instance dict in one
    call, as :class:`~.base.Put` does (the generated frozen one sets each
    field with ``object.__setattr__``). Same signature and default.
    """

    partition: Partition
    puts: Sequence[Put]
    deletes: Sequence[Delete] = ()

    def __init__(self, partition: Partition, puts: Sequence[Put], deletes: Sequence[Delete] = ()) -> None:
        _set(self, "__dict__", {"partition": partition, "puts": puts, "deletes": deletes})

    def call(self, b: Backend) -> WriteResult:
        return b.write(self.partition, self.puts, self.deletes)

    def acall(self, b: Backend) -> Awaitable[WriteResult]:
        return b.awrite(self.partition, self.puts, self.deletes)


@dataclass(frozen=True)
class ListOp:
    """List records of a partition."""

    partition: Partition
    query: ListQuery

    def call(self, b: Backend) -> list[Record]:
        return b.list(self.partition, self.query)

    def acall(self, b: Backend) -> Awaitable[list[Record]]:
        return b.alist(self.partition, self.query)


@dataclass(frozen=True)
class PartitionsOp:
    """List the partitions of one user in one space."""

    user: str
    space: str

    def call(self, b: Backend) -> list[str]:
        return b.partitions(self.user, self.space)

    def acall(self, b: Backend) -> Awaitable[list[str]]:
        return b.apartitions(self.user, self.space)


@dataclass(frozen=True)
class DropOp:
    """Delete a whole partition."""

    partition: Partition

    def call(self, b: Backend) -> int:
        return b.drop(self.partition)

    def acall(self, b: Backend) -> Awaitable[int]:
        return b.adrop(self.partition)


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


class Step(Protocol[Target]):
    """Anything a driven generator yields: it runs itself on a target, sync or async."""

    def call(self, target: Target, /) -> Any: ...

    def acall(self, target: Target, /) -> Awaitable[Any]: ...


#: A flow: yields operations, receives their results, returns ``T``.
Flow = Generator[Op, Any, T]


def run(flow: Generator[Step[_On], Any, T], target: _On) -> T:
    """Drive ``flow`` with each step's sync ``call`` on ``target`` and return its result.

    An error a step raises is thrown into the flow at its ``yield`` (as httpx
    drives its auth flows), so the flow's frame is in the traceback and a
    flow may catch it and go on; the flow is closed when the driver leaves,
    however it leaves.
    """
    try:
        step = next(flow)
        while True:
            try:
                result = step.call(target)
            except BaseException as exc:  # noqa: BLE001 - handed to the flow, which re-raises it
                step = flow.throw(exc)
                continue
            step = flow.send(result)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    finally:
        flow.close()


async def arun(flow: Generator[Step[_On], Any, T], target: _On) -> T:
    """Drive ``flow`` with each step's async ``acall``; see :func:`run`."""
    try:
        step = next(flow)
        while True:
            try:
                result = await step.acall(target)
            except BaseException as exc:  # noqa: BLE001 - handed to the flow, which re-raises it
                step = flow.throw(exc)
                continue
            step = flow.send(result)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    finally:
        flow.close()


# -- typed helpers: ``x = yield from helper(...)`` gives each result its type ----


def get(partition: Partition, names: Sequence[str]) -> Generator[GetOp, Any, list[Record | None]]:
    """The records named ``names`` (None where absent), in order."""
    records: list[Record | None] = yield GetOp(partition, names)
    return records


def write(
    partition: Partition, puts: Sequence[Put], deletes: Sequence[Delete] = ()
) -> Generator[WriteOp, Any, WriteResult]:
    """Apply one atomic conditional batch; its result (a refusal is a ``conflict``, not raised)."""
    result: WriteResult = yield WriteOp(partition, puts, deletes)
    return result


def listing(partition: Partition, query: ListQuery) -> Generator[ListOp, Any, list[Record]]:
    """The records of ``partition`` that ``query`` selects."""
    records: list[Record] = yield ListOp(partition, query)
    return records


def partitions(user: str, space: str) -> Generator[PartitionsOp, Any, list[str]]:
    """The names of ``user``'s non-empty partitions in ``space``, sorted."""
    names: list[str] = yield PartitionsOp(user, space)
    return names


def drop(partition: Partition) -> Generator[DropOp, Any, int]:
    """Delete the whole partition; how many records went."""
    count: int = yield DropOp(partition)
    return count


@overload
def parallel(ops: Sequence[ListOp]) -> Generator[Parallel, Any, list[list[Record]]]: ...


@overload
def parallel(ops: Sequence[GetOp]) -> Generator[Parallel, Any, list[list[Record | None]]]: ...


def parallel(ops: Sequence[ListOp] | Sequence[GetOp]) -> Generator[Parallel, Any, list[Any]]:
    """Independent listings (or gets) in one :class:`Parallel` step; their results in order.

    No step at all when ``ops`` is empty.
    """
    if not ops:
        return []
    results = yield Parallel(tuple(ops))
    return list(results)


def get_and_lists(
    fetch: GetOp | None, lists: Sequence[ListOp]
) -> Generator[Parallel, Any, tuple[list[Record | None], list[list[Record]]]]:
    """One :class:`Parallel` step of a get (optional: ``[]`` without) and listings.

    No step at all when there is nothing to run.
    """
    ops: tuple[SingleOp, ...] = (*lists, fetch) if fetch is not None else tuple(lists)
    if not ops:
        return [], []
    results = yield Parallel(ops)
    if fetch is None:
        return [], list(results)
    return results[-1], list(results[:-1])
