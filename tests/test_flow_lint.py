"""A flow called inside a flow without ``yield from`` is a silent no-op: find every one.

Flows are generators (see :mod:`checkpointers._flows`). Inside another flow,
``self.put_flow(...)`` without ``yield from`` builds a generator and drops it:
nothing is read or written, and no error says so. This check parses every
module of ``checkpointers/`` and ``adapters/`` and fails on a call to a
``*_flow`` function (or ``.flow()``) inside a generator function that is not
the operand of ``yield from`` or an argument handed to another call (a
driver such as ``run``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("checkpointers", "adapters")


def _is_flow_call(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    return name == "flow" or name.endswith("_flow")


def _is_generator(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    for node in ast.walk(fn):
        if node is not fn and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(node, (ast.Yield, ast.YieldFrom)):
            return True
    return False


def unawaited_flow_calls(source: str, filename: str = "<source>") -> list[str]:
    """``file:line: call`` for each flow call inside a flow that is not under ``yield from``."""
    tree = ast.parse(source, filename)
    found: list[str] = []
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef) or not _is_generator(fn):
            continue
        awaited = {id(n.value) for n in ast.walk(fn) if isinstance(n, ast.YieldFrom)}
        # a flow handed to a driver (``run(self.x_flow(), backend)``) is used, not dropped
        awaited |= {id(a) for n in ast.walk(fn) if isinstance(n, ast.Call) for a in n.args}
        for node in ast.walk(fn):
            if _is_flow_call(node) and id(node) not in awaited:
                found.append(f"{filename}:{node.lineno}: {ast.unparse(node)[:80]}")
    return found


def test_the_check_finds_a_dropped_flow() -> None:
    bad = (
        "def outer(self):\n"
        "    self.put_flow(1)\n"  # dropped: a no-op
        "    x = yield from self.get_flow(2)\n"
        "    y = self.list_flow(4)\n"  # dropped too
        "    return x\n"
        "def driver(self):\n"
        "    return run(self.get_flow(3), backend)\n"  # not a flow: fine
    )
    assert unawaited_flow_calls(bad) == ["<source>:2: self.put_flow(1)", "<source>:4: self.list_flow(4)"]


@pytest.mark.parametrize("package", PACKAGES)
def test_no_flow_is_called_without_yield_from(package: str) -> None:
    problems: list[str] = []
    for path in sorted((ROOT / package).rglob("*.py")):
        problems += unawaited_flow_calls(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
    assert problems == []


def test_the_drivers_throw_backend_errors_into_the_flow_and_close_it() -> None:
    """run/arun raise a backend error at the flow's yield (its frame is in the traceback) and close it."""
    import asyncio
    import traceback

    from checkpointers._flows import arun, run
    from checkpointers._names import Partition
    from checkpointers.backends.memory import MemoryBackend
    from checkpointers.backends.ops import GetOp
    from checkpointers.errors import BackendUnavailableError

    class Down(MemoryBackend):
        def get(self, partition, names):  # type: ignore[no-untyped-def]
            raise BackendUnavailableError("down")

        async def aget(self, partition, names):  # type: ignore[no-untyped-def]
            raise BackendUnavailableError("down")

    closed: list[str] = []

    def my_flow(retry: bool):  # type: ignore[no-untyped-def]
        try:
            try:
                yield GetOp(Partition("u", "s", "p"), ["x"])
            except BackendUnavailableError:
                if not retry:
                    raise
                return "recovered"
        finally:
            closed.append("closed")

    for drive in (lambda f: run(f, Down()), lambda f: asyncio.run(arun(f, Down()))):
        closed.clear()
        with pytest.raises(BackendUnavailableError) as info:
            drive(my_flow(False))
        assert "my_flow" in "".join(traceback.format_tb(info.tb)) and closed == ["closed"]
        assert drive(my_flow(True)) == "recovered"
