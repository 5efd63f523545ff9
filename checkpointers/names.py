"""Names, limits and the isolation key encoding, public (see :mod:`checkpointers._names`).

:class:`Partition` is the unit of isolation and atomicity every backend
keys by; :func:`encode_component` is the injective, ``/``-free encoding of a
caller's value inside a backend name; the ``validate_*`` and ``check_*``
functions raise the errors of :mod:`checkpointers.errors` before any I/O.
The private module stays importable; new code imports from here.
"""

from __future__ import annotations

from ._names import *  # noqa: F403 - the public names are exactly those of _names
from ._names import __all__ as __all__
