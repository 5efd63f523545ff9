"""``python -m checkpointers.conformance TARGET [--deep] [--no-shrink] [-v]``: run the suite, print a report.

TARGET is one of:

* a store URL: ``memory://``, ``sqlite:////tmp/x.db``, ``redis://127.0.0.1:6379/0``,
  ``s3://bucket/prefix?endpoint_url=...``;
* ``module:factory`` where ``factory()`` (no arguments) returns a fresh
  :class:`~checkpointers.backends.Backend` (a Backend class works too);
* ``module:factory`` where ``factory(user)`` returns a LangGraph
  ``BaseCheckpointSaver`` or an Agent Framework ``CheckpointStorage`` that is
  the same store seen as ``user``.

Prints one line per capability group (contract, isolation, backend,
langgraph, agent_framework): PASS, FAIL with each failing case, or N/A with
the reason; a single check that cannot run against the target (the
adversarial ones that write crafted records behind a third-party saver's
back) is listed as ``n/a`` with its reason and never counts as passed.
Exits 1 if any check fails, 2 if the target cannot be used.
Run it against a scratch store: the checks write (under fresh random user ids
and spaces) and clean up only what they can. The crafted-payload checks
write records that would run ``touch <a fresh temporary file>`` if decoded
by a permissive deserializer; that file is how they notice.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import inspect
import sys
from typing import Any

from ..backends import Backend, open_backend


def resolve_target(target: str) -> dict[str, Any]:
    """The ``run_suite`` keyword arguments for a CLI TARGET (URL or module:factory)."""
    if "://" in target:
        open_backend(target).close()  # fail early on a bad URL or a missing driver
        return {"backend_factory": lambda: open_backend(target)}
    module, _, attr = target.partition(":")
    if not attr:
        raise ValueError(f"target {target!r} is neither a store URL nor module:factory")
    factory = getattr(importlib.import_module(module), attr)
    if isinstance(factory, type) and issubclass(factory, Backend):
        return {"backend_factory": factory}
    if not callable(factory):
        raise ValueError(f"{target!r} is not callable")
    required = [
        p for p in inspect.signature(factory).parameters.values()
        if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    if not required:
        probe = factory()
        if not isinstance(probe, Backend):
            raise ValueError(f"{target}() returned {type(probe).__name__}, not a Backend")
        probe.close()
        return {"backend_factory": factory}
    probe = factory("conformance-probe")
    try:
        from langgraph.checkpoint.base import BaseCheckpointSaver

        if isinstance(probe, BaseCheckpointSaver):
            return {"saver_for": factory}
    except ImportError:
        pass
    if all(hasattr(probe, m) for m in ("save", "load", "get_latest", "list_checkpoint_ids")):
        return {"storage_for": factory}
    raise ValueError(
        f"{target}(user) returned {type(probe).__name__}: expected a LangGraph BaseCheckpointSaver "
        f"or an agent_framework CheckpointStorage"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m checkpointers.conformance",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("target", help="store URL or module:factory")
    parser.add_argument("--deep", action="store_true", help="many random hypothesis examples")
    parser.add_argument(
        "--no-shrink", action="store_true", help="report failing examples as found, without minimizing"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="list every check, not only failures")
    args = parser.parse_args(argv)
    try:
        from . import run_suite
        from .properties import use_depth

        targets = resolve_target(args.target)
    except ImportError as exc:
        print(f"cannot run the suite: {exc} (pip install 'checkpointers[test]')", file=sys.stderr)
        return 2
    except Exception as exc:
        print(f"cannot use target {args.target!r}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    use_depth(args.deep, shrink=not args.no_shrink)
    report = asyncio.run(run_suite(target=args.target, **targets))
    depth = "deep: random seeds, many examples" if args.deep else "ci: fixed seed, few examples"
    print(report.format(verbose=args.verbose).replace("\n", f"  ({depth})\n", 1))
    return 0 if report.passed_all() else 1


if __name__ == "__main__":
    sys.exit(main())
