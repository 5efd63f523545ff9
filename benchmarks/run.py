"""Run the benchmarks and print markdown tables.

    python -m benchmarks.run --quick                 # every workload, small sizes (< 2 min)
    python -m benchmarks.run                         # full sizes
    python -m benchmarks.run --only a,c --backends sqlite,redis --out results.md

Workloads: a=graph, b=ops, c=history, d=footprint, e=requests, f=agent-framework.
``--backends`` takes families (memory, sqlite, redis, s3) or parts of saver
names; the reference anchor of each selected family is always included.
Progress goes to stderr, the tables to stdout (and to ``--out``).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from dataclasses import replace
from importlib import metadata

from .savers import REFERENCE, Env, SaverEntry, StorageEntry, saver_entries, storage_entries
from . import workloads
from .workloads import WORKLOADS, Context, Sizes

PACKAGES = (
    "langgraph",
    "langgraph-checkpoint",
    "langgraph-checkpoint-sqlite",
    "langgraph-checkpoint-plainredis",
    "langgraph-checkpoint-redis",
    "langgraph-checkpoint-s3",
    "langgraph-checkpoint-objectstorage",
    "agent-framework-core",
    "redis",
    "boto3",
    "moto",
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes, 2 rounds (< 2 minutes)")
    parser.add_argument("--only", default="", help="workloads to run, e.g. a,b (default: all)")
    parser.add_argument("--backends", default="",
                        help="families or saver-name parts, e.g. sqlite,redis (default: all)")
    parser.add_argument("--out", default="", help="also write the markdown to this file")
    parser.add_argument("--rounds", type=int, default=0, help="override the number of rounds")
    parser.add_argument("--history", type=int, default=0,
                        help="override the checkpoints in the long thread of (c)")
    args = parser.parse_args(argv)
    letters = [w.strip() for w in args.only.split(",") if w.strip()] or list(WORKLOADS)
    names = {name: letter for letter, (name, _) in WORKLOADS.items()}
    args.workloads = [names.get(w, w) for w in letters]
    unknown = [w for w in args.workloads if w not in WORKLOADS]
    if unknown:
        parser.error(f"unknown workload(s) {unknown}: choose from {', '.join(WORKLOADS)}")
    args.selectors = [b.strip().lower() for b in args.backends.split(",") if b.strip()]
    return args


def selected(name: str, family: str, selectors: list[str]) -> bool:
    if not selectors:
        return True
    return any(sel == family or sel in name.lower() for sel in selectors)


def select_savers(entries: list[SaverEntry], selectors: list[str]) -> list[SaverEntry]:
    chosen = [e for e in entries if selected(e.name, e.family, selectors)]
    refs = {REFERENCE[e.family] for e in chosen if e.family in REFERENCE}
    return [e for e in entries if e in chosen or e.name in refs]


def select_storages(entries: list[StorageEntry], selectors: list[str]) -> list[StorageEntry]:
    return [e for e in entries if e.family == "framework" or selected(e.name, e.family, selectors)]


def probe(entries: list, env: Env) -> tuple[list, list]:
    """Split entries into those that can run here and ``(entry, reason)`` for the others."""
    ok, skipped = [], []
    for entry in entries:
        reason = entry.check(env)
        if reason:
            skipped.append((entry, reason))
        else:
            ok.append(entry)
    return ok, skipped


def header(args: argparse.Namespace, sizes: Sizes, env: Env) -> str:
    versions = []
    for package in PACKAGES:
        try:
            versions.append(f"{package} {metadata.version(package)}")
        except metadata.PackageNotFoundError:
            versions.append(f"{package} (not installed)")
    command = "python -m benchmarks.run " + " ".join(sys.argv[1:])
    lines = [
        "## Benchmark results",
        "",
        f"- command: `{command.strip()}`",
        f"- machine: {platform.platform()}, Python {platform.python_version()}, "
        f"{os.cpu_count()} CPUs; {time.strftime('%Y-%m-%d %H:%M')}",
        f"- sizes: {'quick' if args.quick else 'full'} — {sizes}",
        f"- versions: {', '.join(versions)}",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = Sizes.quick() if args.quick else Sizes()
    if args.rounds:
        sizes = replace(sizes, rounds=args.rounds)
    if args.history:
        sizes = replace(sizes, history=args.history)
    env = Env()
    started = time.perf_counter()
    try:
        savers, skipped = probe(select_savers(saver_entries(), args.selectors), env)
        storages, skipped_storages = probe(select_storages(storage_entries(), args.selectors), env)
        ctx = Context(env, sizes, savers, skipped, storages, skipped_storages)
        parts = [header(args, sizes, env)]
        print(parts[0], flush=True)
        for letter in args.workloads:
            name, workload = WORKLOADS[letter]
            t = time.perf_counter()
            print(f"[bench] ({letter}) {name} ...", file=sys.stderr, flush=True)
            table = workload(ctx).markdown()
            print(f"[bench] ({letter}) {name} done in {time.perf_counter() - t:.1f} s",
                  file=sys.stderr, flush=True)
            print(table, flush=True)
            parts.append(table)
        footer = f"_Total time: {time.perf_counter() - started:.0f} s._\n"
        print(footer)
        parts.append(footer)
        if args.out:
            with open(args.out, "w", encoding="utf-8") as f:
                f.write("\n".join(parts))
    finally:
        env.close()
        if workloads.LOOP is not None:
            workloads.LOOP.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
