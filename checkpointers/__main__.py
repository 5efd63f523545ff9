"""Command line of the package: ``python -m checkpointers <command> [options]``.

Commands:

``demo``
    Crash a LangGraph countdown with SIGKILL and resume it from the store
    (see :mod:`checkpointers.demo`; ``python -m checkpointers demo --help``).
"""

from __future__ import annotations

import sys

COMMANDS = {"demo": "crash a LangGraph run with SIGKILL and resume it from the store"}


def main(argv: list[str] | None = None) -> int:
    """Dispatch to a command; return the process exit code."""
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] not in COMMANDS:
        usage = "\n".join(f"  {name:<8}{help}" for name, help in COMMANDS.items())
        print(
            f"usage: python -m checkpointers <command> [options]\n\ncommands:\n{usage}",
            file=sys.stderr,
        )
        return 0 if args[:1] in (["-h"], ["--help"]) else 2
    from .demo import main as demo_main

    return demo_main(args[1:])


if __name__ == "__main__":
    sys.exit(main())
