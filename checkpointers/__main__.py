"""Command line of the package: ``python -m checkpointers <verb> [options]``.

The same as the ``checkpointers`` console script (:mod:`checkpointers.cli`):
``threads``, ``history``, ``show``, ``stats``, ``verify``, ``gc``,
``export``, ``import``, ``migrate``; and ``demo``, which crashes a LangGraph
countdown with SIGKILL and resumes it from the store (see
:mod:`checkpointers.demo`; ``python -m checkpointers demo --help``).
"""

from __future__ import annotations

import sys

from .cli import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
