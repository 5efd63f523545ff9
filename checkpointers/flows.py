"""The flow core, public: what adapters, the conformance kit and your own code build on.

A *flow* is a generator that yields backend operations and receives their
results; :func:`run` drives it with a backend's sync methods and :func:`arun`
with its async ones, so one body serves both (see :mod:`checkpointers._flows`
for the design and :mod:`checkpointers.backends.ops` for the operations).
Yield each operation through its typed helper, so that what each step
receives is type-checked::

    from checkpointers.flows import Flow, arun, get, make_put, run, write_flow
    from checkpointers.names import Partition

    def bump_flow(p: Partition, name: str) -> Flow[int]:
        (record,) = yield from get(p, [name])       # Record | None
        count = 0 if record is None else int(record.value)
        yield from write_flow(p, [make_put(name, str(count + 1).encode())])
        return count + 1

    run(bump_flow(p, "n"), backend)            # sync
    await arun(bump_flow(p, "n"), backend)     # async

The private modules (``checkpointers._flows``) stay importable under their
old names; new code imports from here.
"""

from __future__ import annotations

from ._flows import *  # noqa: F403 - the public names are exactly those of _flows
from ._flows import __all__ as __all__
