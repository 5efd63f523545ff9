"""Agent Framework face of the side-effect journal (:mod:`checkpointers.effects`).

An executor that charges a card, sends a mail or calls a webhook wraps the
call in an effect of its workflow run, so the run resumed after a crash finds
what the first attempt left instead of calling again::

    class Charge(Executor):
        def __init__(self, storage, payments):
            super().__init__(id="charge")
            self.storage, self.payments = storage, payments

        @handler
        async def charge(self, order: Order, ctx: WorkflowContext[str]) -> None:
            async with self.storage.effect(order.run_id, self.id, f"charge:{order.id}",
                                           reconcile=self.payments.find) as fx:
                if not fx.done:
                    await fx.arecord(await self.payments.charge(order, idempotency_key=fx.key))
            await ctx.send_message(fx.outcome["receipt"])

The framework gives an executor no run id, so the caller passes one that
stays the same across the crash and the resume (an order id, a job id; the
workflow name is not enough when one workflow runs several times). An
executor that runs more than once per run (a loop, one call per message)
needs the superstep, the message or the item in ``name``.

The records live in the storage's partition (one per user, beside the
checkpoints, under ``fx/``), keyed by (run id, executor id, name), and are
fenced by the run's lease record (``lease/<run id>``): inside
``storage.lease(run_id, ...)`` with that lease (its owner and token go in the
intent), or with the :class:`~checkpointers.leases.Lease` passed as
``lease=``; without one, an effect of a run whose lease another owner holds
is refused with ``LeaseHeldError``.
Every rule of :mod:`checkpointers.effects` applies (the unknown outcome,
``reconcile=``, ``retry_safe=``, append-only outcomes, ``with`` and
``async with``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from checkpointers.effects import EffectBlock, Journal, Reconcile
from checkpointers.errors import InvalidNameError
from checkpointers.leases import Lease, LeaseSite, listed_site

if TYPE_CHECKING:
    from .agent_framework import IsolatedCheckpointStorage

__all__ = ["LEASE_PREFIX", "run_journal", "storage_effect"]

#: The name prefix of a workflow run's lease record in the storage's partition.
LEASE_PREFIX = "lease/"


def _text(what: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidNameError(what, value, "must be a non-empty string")
    return value


def run_journal(storage: IsolatedCheckpointStorage, run_id: str) -> Journal:
    """The journal of workflow run ``run_id`` in ``storage``: its effects (keys after the run id), its lease.

    The records live in the user's one partition; ``list()`` lists this run's only.
    """
    run = _text("run id", run_id)
    label = f"workflow run {run!r}"
    site = listed_site(storage.integrity, storage.partition, LEASE_PREFIX, run)
    return Journal(
        storage.backend, storage.integrity, storage.partition,
        max_item_bytes=storage.max_item_bytes, label=label, site=site, within=(run,),
    )  # fmt: skip


def _held(storage: IsolatedCheckpointStorage, site: LeaseSite) -> Lease | None:
    """The lease ``storage`` holds on this run in a ``storage.lease(run_id, ...)`` block, if any."""
    registry = getattr(storage, "leases", None)
    held = None if registry is None else registry.held(site.partition)
    return held.lease if held is not None and held.site.name == site.name else None


def storage_effect(
    storage: IsolatedCheckpointStorage,
    run_id: str,
    executor_id: str,
    name: str,
    *,
    lease: Lease | None = None,
    reconcile: Reconcile | None = None,
    retry_safe: bool = False,
    owner: str | None = None,
) -> EffectBlock:
    """The effect ``name`` of executor ``executor_id`` in workflow run ``run_id`` (``storage.effect``).

    A block for ``with`` / ``async with``; see the module docstring and
    :meth:`checkpointers.effects.Journal.effect` for ``lease``, ``reconcile``,
    ``retry_safe`` and ``owner``.
    """
    parts = (_text("executor id", executor_id), _text("effect name", name))
    journal = run_journal(storage, run_id)
    lease = lease if lease is not None else _held(storage, journal.site)
    return journal.effect(parts, lease=lease, owner=owner, reconcile=reconcile, retry_safe=retry_safe)
