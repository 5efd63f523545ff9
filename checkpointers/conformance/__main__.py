"""``python -m checkpointers.conformance TARGET``: run the suite, print a report.

TARGET is a store URL (``memory://``, ``sqlite:///tmp/x.db``,
``redis://127.0.0.1:6379/0``, ``s3://bucket/prefix?endpoint_url=...``) or
``module:factory`` naming a zero-argument callable that returns a fresh
:class:`~checkpointers.backends.Backend`. Exits 1 if any check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import sys
from collections.abc import Callable

from ..backends import Backend, open_backend
from . import run_checks


def _factory(target: str) -> Callable[[], Backend]:
    if "://" in target:
        return lambda: open_backend(target)
    module, _, attr = target.partition(":")
    if not attr:
        raise SystemExit(f"target {target!r} is neither a store URL nor module:factory")
    return getattr(importlib.import_module(module), attr)  # type: ignore[no-any-return]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m checkpointers.conformance", description=__doc__)
    parser.add_argument("target", help="store URL or module:factory")
    args = parser.parse_args(argv)
    results = asyncio.run(run_checks(_factory(args.target)))
    width = max(len(r.name) for r in results)
    for r in results:
        status = "PASS" if r.passed else "FAIL"
        print(f"{status}  {r.name:<{width}}  [{r.mode}]")
        if not r.passed:
            print("      " + r.detail.replace("\n", "\n      "))
    failed = sum(not r.passed for r in results)
    print(f"{len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
