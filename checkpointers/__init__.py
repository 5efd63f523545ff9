"""checkpointers: durable, per-user isolated state for AI agents.

One storage contract (:class:`Store` over a :class:`~checkpointers.backends.Backend`),
backends for memory, SQLite, Redis and S3, and drop-in LangGraph checkpointers.
"""

from __future__ import annotations

from .backends import Backend, open_backend
from .errors import (
    BackendUnavailableError,
    CheckpointerError,
    ConcurrencyError,
    CorruptItemError,
    InvalidNameError,
    IsolationError,
    ItemTooLargeError,
    StepMismatchError,
    TooManyTagsError,
)
from .store import Batch, Item, Store

__version__ = "0.1.0"

__all__ = [
    "Backend",
    "BackendUnavailableError",
    "Batch",
    "CheckpointerError",
    "ConcurrencyError",
    "CorruptItemError",
    "InvalidNameError",
    "IsolationError",
    "Item",
    "ItemTooLargeError",
    "StepMismatchError",
    "Store",
    "TooManyTagsError",
    "__version__",
    "open_backend",
]
