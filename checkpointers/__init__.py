"""checkpointers: durable, per-user isolated state for AI agents.

One storage contract (:class:`Store` over a :class:`~checkpointers.backends.Backend`),
backends for memory, SQLite, Redis, S3 and PostgreSQL, and drop-in LangGraph checkpointers.
"""

from __future__ import annotations

from ._integrity import Integrity
from .backends import Backend, open_backend
from .errors import (
    BackendUnavailableError,
    CheckpointerError,
    ConcurrencyError,
    CorruptItemError,
    DisallowedTypeError,
    InvalidArgumentError,
    InvalidNameError,
    IsolationError,
    ItemTooLargeError,
    LeaseHeldError,
    LeaseLostError,
    StepMismatchError,
    TooManyTagsError,
    UnknownOutcomeError,
    UnserializableValueError,
)
from .leases import Lease, LeaseInfo
from .store import Batch, Item, Store

__version__ = "0.2.0"

_SAVERS = ("Checkpointer", "MemoryCheckpointer", "RedisCheckpointer", "S3Checkpointer", "SqliteCheckpointer")


def __getattr__(name: str) -> object:
    # The LangGraph savers import langchain-core/langgraph: load them on first use.
    if name in _SAVERS:
        from . import savers

        return getattr(savers, name)
    if name == "PostgresCheckpointer":  # needs psycopg (the postgres extra) as well
        from .postgres_saver import PostgresCheckpointer

        return PostgresCheckpointer
    raise AttributeError(f"module 'checkpointers' has no attribute {name!r}")


__all__ = [
    "Backend",
    "BackendUnavailableError",
    "Batch",
    "Checkpointer",
    "CheckpointerError",
    "ConcurrencyError",
    "CorruptItemError",
    "DisallowedTypeError",
    "Integrity",
    "InvalidArgumentError",
    "InvalidNameError",
    "IsolationError",
    "Item",
    "ItemTooLargeError",
    "Lease",
    "LeaseHeldError",
    "LeaseInfo",
    "LeaseLostError",
    "MemoryCheckpointer",
    "PostgresCheckpointer",
    "RedisCheckpointer",
    "S3Checkpointer",
    "SqliteCheckpointer",
    "StepMismatchError",
    "Store",
    "TooManyTagsError",
    "UnknownOutcomeError",
    "UnserializableValueError",
    "__version__",
    "open_backend",
]
