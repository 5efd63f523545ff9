"""Record seals, public (see :mod:`checkpointers._integrity` for what a seal binds).

:class:`Integrity` seals every record a store, saver or adapter writes and
checks it on every read; ``IntegrityKeys`` is what ``integrity_key=``
accepts. The private module stays importable; new code imports from here.
"""

from __future__ import annotations

from ._integrity import ENV_VAR, MIN_KEY_BYTES, Integrity, IntegrityKeys

__all__ = ["ENV_VAR", "MIN_KEY_BYTES", "Integrity", "IntegrityKeys"]
