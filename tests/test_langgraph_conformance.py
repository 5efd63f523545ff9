"""LangGraph's own conformance suite against :class:`Checkpointer` on every backend.

Every capability, base and extended, must be detected and pass; a fresh user
per capability suite keeps the suites apart on a shared backend.
"""

from __future__ import annotations

import uuid

from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES

from checkpointers.backends import Backend
from checkpointers.savers import Checkpointer


async def test_langgraph_conformance_every_capability(backend: Backend) -> None:
    @checkpointer_test(name=f"Checkpointer[{backend.kind}]")
    async def factory():  # type: ignore[no-untyped-def]
        yield Checkpointer(backend).for_user(f"conformance-{uuid.uuid4().hex}")

    report = await validate(factory)

    failures = [f"{cap}: {msg}" for cap, r in report.results.items() for msg in r.failures]
    assert not failures, "conformance failures:\n" + "\n".join(failures)
    detected = {cap for cap, r in report.results.items() if r.detected}
    assert detected == {c.value for c in ALL_CAPABILITIES}, f"not detected: {ALL_CAPABILITIES - detected}"
    assert all(r.tests_passed > 0 for r in report.results.values())
    assert report.passed_all(), report.to_dict()
