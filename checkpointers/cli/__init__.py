"""The ``checkpointers`` command: look inside a store, check it, move threads, collect garbage.

Run ``checkpointers --help`` (or ``python -m checkpointers --help``) for the
verbs, ``checkpointers VERB --help`` for one. Every verb takes a store URL
(``sqlite:///state.db``, ``redis://host:6379/0``, ``s3://bucket/prefix``,
``memory://``), ``--user`` where it reads or writes a user's threads and
``--json`` for scripts. See ``docs/cli.md``.

Exit codes: ``0`` done (``verify``: nothing wrong); ``1`` ``verify`` found
damaged, missing or orphaned records, or ``show`` found no checkpoint; ``2``
bad arguments; ``3`` the store or a file could not be opened or read
(unreachable server, missing file, a record that cannot be decoded); ``4``
``import`` refused the file (not an export, another format version, a digest
that does not match): nothing was written; ``5`` ``import``/``migrate`` met a
checkpoint id the destination holds with other content (``StepMismatchError``):
the stored one is kept, not replaced.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from typing import Any

from ._commands import COMMANDS, EXIT_CONFLICT, EXIT_DAMAGED, EXIT_OK, EXIT_REFUSED, EXIT_STORE, EXIT_USAGE

__all__ = [
    "EXIT_CONFLICT",
    "EXIT_DAMAGED",
    "EXIT_OK",
    "EXIT_REFUSED",
    "EXIT_STORE",
    "EXIT_USAGE",
    "build_parser",
    "main",
]

_EPILOG = """\
store URLs:   sqlite:///state.db (sqlite:////abs/path.db)   redis://127.0.0.1:6379/0
              s3://bucket/prefix   postgresql://127.0.0.1:5432/db   memory://
LangGraph's savers (migrate sources):  langgraph+sqlite:///checkpoints.db
              langgraph+postgres://user@host:5432/db   langgraph+plainredis://host:6379/0?prefix=lg
users:        threads belong to a user (for_user / configurable.user_id); threads written
              without one are user '' (--user '').
exit codes:   0 ok, 1 verify found problems (or show found nothing), 2 bad arguments,
              3 store or file unreadable, 4 import refused the file (nothing written),
              5 the destination holds a checkpoint id with other content (kept, not replaced)

examples:
  checkpointers threads sqlite:///state.db --user alice
  checkpointers history sqlite:///state.db --user alice --thread t1
  checkpointers verify redis://127.0.0.1:6379/0 --user alice
  checkpointers migrate langgraph+sqlite:///old.db sqlite:///state.db --user alice
  checkpointers export sqlite:///state.db alice.jsonl.gz --user alice
  checkpointers gc "sqlite:///state.db" --dry-run       (expired threads of every user)
  checkpointers stats redis://127.0.0.1:6379/0           (every user, largest first)
"""


#: Verbs whose --user is optional: without it they work across users (the backend's ``users()``).
_ACROSS_USERS = ("stats", "gc")


def _common(p: argparse.ArgumentParser, name: str) -> None:
    """The options every verb takes."""
    if name in _ACROSS_USERS:
        p.add_argument("--user", metavar="U", help="the user whose threads to use ('' for none; default: every user)")
    else:
        p.add_argument("--user", required=True, metavar="U", help="the user whose threads to use ('' for none)")
    p.add_argument("--json", action="store_true", help="print JSON (for scripts) instead of tables")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    p.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="import MODULE first, so the types of your state it defines can be decoded (repeatable)",
    )


_URL = ("url", {"metavar": "URL", "help": "the store"})
_THREAD = ("--thread", {"required": True, "metavar": "T", "help": "the thread id"})
_SOME_THREAD = ("--thread", {"metavar": "T", "help": "only this thread"})

#: Every verb: name, one-line summary, description, arguments (name or flag, add_argument keywords).
_VERBS: list[tuple[str, str, str, list[tuple[str, dict[str, Any]]]]] = [
    (
        "threads",
        "list a user's threads",
        "Every thread of a user: checkpoints, writes, blobs, bytes, last write.",
        [_URL],
    ),
    (
        "history",
        "list a thread's checkpoints",
        "The checkpoints of one thread, newest first, every namespace.",
        [_URL, _THREAD, ("--limit", {"type": int, "metavar": "N", "help": "at most N checkpoints"})],
    ),
    (
        "show",
        "print one checkpoint as JSON",
        "A decoded checkpoint, its metadata and pending writes (JSON).",
        [
            _URL,
            _THREAD,
            ("--checkpoint", {"metavar": "C", "help": "a checkpoint id (default: the latest)"}),
            ("--ns", {"default": "", "metavar": "NS", "help": "the checkpoint namespace (default: the root graph)"}),
        ],
    ),
    (
        "stats",
        "bytes and counts, largest threads first",
        "Bytes and counts of a user's threads (largest first), items and Agent Framework checkpoints.\n"
        "Without --user: one row per user (every user holding partitions), largest first.",
        [_URL, ("--top", {"type": int, "default": 20, "metavar": "N", "help": "the N largest threads (default 20)"})],
    ),
    (
        "verify",
        "check every record (exit 1 if any is wrong)",
        "Read every record of a user (LangGraph threads, items, Agent Framework checkpoints), check its digest,\n"
        "its seal (user, space, thread, name, tags) and that it decodes, then the references: blobs a checkpoint\n"
        "names exist, blobs and writes belong to a stored checkpoint. Exit 1 when anything is reported.",
        [_URL, _SOME_THREAD],
    ),
    (
        "gc",
        "delete expired threads, orphaned blobs and writes; --keep N checkpoints",
        "Delete blobs no checkpoint names and writes of checkpoints that are gone; with --keep N also every\n"
        "checkpoint but the newest N of each namespace (with its writes); with --older-than every checkpoint\n"
        "made before then (from its id's time), but never the newest of a namespace. Each thread in one atomic\n"
        "batch.\n"
        "--dry-run prints what would go. First, expired partitions (ttl) of every user are removed (listed\n"
        "with --dry-run); without --user that is all gc does.",
        [
            _URL,
            _SOME_THREAD,
            ("--keep", {"type": int, "metavar": "N", "help": "keep the newest N checkpoints per namespace (N >= 1)"}),
            (
                "--older-than",
                {"metavar": "WHEN", "help": "also delete checkpoints made before WHEN: 30d, 12h, 90m, 45s, ISO time"},
            ),
            ("--dry-run", {"action": "store_true", "help": "delete nothing; print what would be deleted"}),
        ],
    ),
    (
        "export",
        "write a user's threads to a file",
        "Stream every thread of a user to FILE (JSON Lines; .gz compresses). See docs/cli.md for the format.",
        [_URL, ("file", {"metavar": "FILE", "help": "the export file to write (.jsonl or .jsonl.gz)"})],
    ),
    (
        "import",
        "load an export file into a store",
        "Check every digest of FILE (nothing is written if one fails), then put its checkpoints and writes\n"
        "into the store for --user. Importing the same file again changes nothing.",
        [("file", {"metavar": "FILE", "help": "a file written by export"}), _URL],
    ),
    (
        "migrate",
        "copy threads from a store or LangGraph saver into a store",
        "Copy every thread of SRC (one of our store URLs, or a LangGraph saver: langgraph+sqlite://,\n"
        "langgraph+postgres://, langgraph+plainredis://) into DST for --user, keeping thread and checkpoint ids,\n"
        "parents, metadata and pending writes, one checkpoint at a time. Safe to run again.",
        [
            ("src", {"metavar": "SRC", "help": "where the threads are"}),
            ("dst", {"metavar": "DST", "help": "our store to copy them into"}),
            ("--from-user", {"metavar": "U", "help": "SRC is our store: read this user's threads (default: --user)"}),
        ],
    ),
]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every verb."""
    parser = argparse.ArgumentParser(
        prog="checkpointers",
        description="Inspect, verify, export/import, migrate and garbage-collect checkpointers stores.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(metavar="VERB", title="verbs")
    for name, summary, description, arguments in _VERBS:
        verb = sub.add_parser(
            name, help=summary, description=description, formatter_class=argparse.RawDescriptionHelpFormatter
        )
        verb.set_defaults(command=name)
        for flag, options in arguments:
            verb.add_argument(flag, **options)
        _common(verb, name)
    sub.add_parser(
        "demo", help="crash a LangGraph run with SIGKILL and resume it (python -m checkpointers demo --help)"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit code (see the module docstring)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["demo"]:
        from ..demo import main as demo_main

        return demo_main(args[1:])
    parser = build_parser()
    ns = parser.parse_args(args)
    if getattr(ns, "command", None) is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    for module in ns.imports:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            parser.error(f"--import {module}: {exc}")
    run: Callable[[argparse.Namespace, argparse.ArgumentParser], int] = COMMANDS[ns.command]
    return run(ns, parser)
