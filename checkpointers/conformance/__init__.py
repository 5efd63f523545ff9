"""The contract and isolation conformance suite, runnable against any backend.

Checks are plain async functions; each raises ``AssertionError`` naming the
failing case. They come in groups (see :mod:`.runner`):

* **store checks** take an :class:`Api` (a :class:`~checkpointers.Store`
  bound to a fresh user, driven through its async or its sync methods);
* **backend checks** take a :class:`~checkpointers.backends.Backend` and test
  the backend interface directly (conditions, listing, partitions, isolation);
* **properties** (:mod:`.properties`, :mod:`.strategies`) draw hostile ids
  with ``hypothesis`` and check that two users never meet;
* **LangGraph / Agent Framework checks** take ``saver_for(user)`` /
  ``storage_for(user)``: the same store seen as user X;
* **adversarial checks** (:mod:`.adversarial`) play a hostile writer of the
  storage (records copied between users, moved, spliced, with forged tags;
  crafted payloads naming ``os.system``) and a hostile caller (a config naming
  another user against a bound view). A check that cannot run against a
  target raises :class:`NotApplicable` and is reported as such.

Run them from the command line (``python -m checkpointers.conformance
TARGET``), from pytest (the :mod:`.pytest_plugin`, or like
``tests/test_contract.py``), or from Python::

    import asyncio
    from checkpointers.backends import MemoryBackend
    from checkpointers.conformance import run_suite

    report = asyncio.run(run_suite(backend_factory=MemoryBackend, target="memory"))
    print(report.format())
    assert report.passed_all()

``docs/backends.md`` explains the backend interface and walks through
:mod:`.example_backend`, a backend that passes the suite.
"""

from __future__ import annotations

from .adversarial import (
    AGENT_FRAMEWORK_ADVERSARIAL_CHECKS,
    CONTRACT_ADVERSARIAL_CHECKS,
    ISOLATION_ADVERSARIAL_CHECKS,
    LANGGRAPH_ADVERSARIAL_CHECKS,
    NotApplicable,
)
from .contract import BACKEND_CHECKS, CONTRACT_CHECKS, Api, modes_of
from .isolation import BACKEND_ISOLATION_CHECKS, HOSTILE_IDS, ISOLATION_CHECKS
from .runner import GROUPS, CheckResult, Report, run_checks, run_suite

__all__ = [
    "AGENT_FRAMEWORK_ADVERSARIAL_CHECKS",
    "ALL_BACKEND_CHECKS",
    "ALL_STORE_CHECKS",
    "Api",
    "CheckResult",
    "GROUPS",
    "HOSTILE_IDS",
    "LANGGRAPH_ADVERSARIAL_CHECKS",
    "NotApplicable",
    "Report",
    "modes_of",
    "run_checks",
    "run_suite",
]

#: Checks that take an :class:`Api`.
ALL_STORE_CHECKS = CONTRACT_CHECKS + CONTRACT_ADVERSARIAL_CHECKS + ISOLATION_CHECKS + ISOLATION_ADVERSARIAL_CHECKS
#: Checks that take a :class:`Backend`.
ALL_BACKEND_CHECKS = BACKEND_CHECKS + BACKEND_ISOLATION_CHECKS
