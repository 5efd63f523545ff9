"""Run the benchmarks: markdown tables on stdout, a JSON file and a chart drawn from it.

    python -m benchmarks.run --quick          # every workload, small sizes (about a minute)
    python -m benchmarks.run                  # full sizes
    python -m benchmarks.run --only a,b --backends sqlite,redis --out results.md
    python -m benchmarks.run --set history=1000 --set rounds=2

Workloads: a=graph, b=ops (with c=history), d=footprint, e=requests,
f=agent-framework, g=concurrency, h=floor. ``--backends`` takes families
(memory, sqlite, redis, s3, postgres) or parts of saver names; the reference
anchor of each selected family is always included. Progress goes to stderr.
The JSON (``--json``, by default ``benchmarks/results/{quick,full}.json``)
holds every table, every measure and the speed ratios; the chart
(``--chart``, by default the JSON's name with ``.png``) is drawn from it.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from . import harness
from .harness import PROGRESS, Context, Sizes, Table
from .report import RESULTS, chart, summary, write_json
from .savers import REFERENCE, Env, SaverEntry, StorageEntry, saver_entries, storage_entries
from .workloads import ALIASES, WORKLOADS

PACKAGES = (
    "langgraph", "langgraph-checkpoint", "langgraph-checkpoint-sqlite", "langgraph-checkpoint-plainredis",
    "langgraph-checkpoint-redis", "langgraph-checkpoint-s3", "langgraph-checkpoint-objectstorage",
    "langgraph-checkpoint-postgres", "agent-framework-core", "redis", "boto3", "moto", "psycopg",
)  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes, 2 rounds")
    parser.add_argument("--only", default="", help="workloads to run, e.g. a,b (default: all)")
    parser.add_argument("--backends", default="", help="families or saver-name parts, e.g. sqlite,redis")
    parser.add_argument("--out", default="", help="also write the markdown to this file")
    parser.add_argument("--json", default="", help="the JSON file (default benchmarks/results/<mode>.json)")
    parser.add_argument("--chart", default="", help="the chart PNG (default: the JSON's name, .png)")
    parser.add_argument("--rounds", type=int, default=0, help="override the number of rounds")
    parser.add_argument("--history", type=int, default=0, help="override the long thread's checkpoints")
    parser.add_argument("--set", action="append", default=[], metavar="SIZE=VALUE",
                        help=f"override any size: {', '.join(f.name for f in dataclasses.fields(Sizes))}")
    args = parser.parse_args(argv)
    names = {name: letter for letter, (name, _) in WORKLOADS.items()} | ALIASES
    wanted = [w.strip() for w in args.only.split(",") if w.strip()] or list(WORKLOADS)
    args.workloads = list(dict.fromkeys(names.get(w, w) for w in wanted))
    unknown = [w for w in args.workloads if w not in WORKLOADS]
    if unknown:
        parser.error(f"unknown workload(s) {unknown}: choose from {', '.join(WORKLOADS)} (c is run with b)")
    args.selectors = [b.strip().lower() for b in args.backends.split(",") if b.strip()]
    try:
        args.sizes = sizes_of(args)
    except ValueError as exc:
        parser.error(str(exc))
    return args


def sizes_of(args: argparse.Namespace) -> Sizes:
    sizes = Sizes.quick() if args.quick else Sizes()
    fields = {f.name: f for f in dataclasses.fields(Sizes)}
    changes: dict[str, Any] = {}
    for item in args.set:
        name, _, text = item.partition("=")
        if name not in fields or not text:
            raise ValueError(f"--set {item!r}: expected SIZE=VALUE with SIZE one of {', '.join(fields)}")
        current = getattr(sizes, name)
        changes[name] = (tuple(int(x) for x in text.split(",")) if isinstance(current, tuple)
                         else type(current)(text))
    if args.rounds:
        changes["rounds"] = args.rounds
    if args.history:
        changes["history"] = args.history
    return dataclasses.replace(sizes, **changes)


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


def probe(entries: list[Any], env: Env) -> tuple[list[Any], list[tuple[Any, str]]]:
    """Split entries into those that can run here and ``(entry, reason)`` for the others."""
    ok, skipped = [], []
    for entry in entries:
        reason = entry.check(env)
        if reason:
            skipped.append((entry, reason))
        else:
            ok.append(entry)
    return ok, skipped


def versions() -> list[str]:
    out = []
    for package in PACKAGES:
        try:
            out.append(f"{package} {metadata.version(package)}")
        except metadata.PackageNotFoundError:
            out.append(f"{package} (not installed)")
    return out


def meta(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "command": ("python -m benchmarks.run " + " ".join(sys.argv[1:])).strip(),
        "machine": f"{platform.platform()}, Python {platform.python_version()}, {os.cpu_count()} CPUs",
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "mode": "quick" if args.quick else "full",
        "sizes": dataclasses.asdict(args.sizes),
        "versions": versions(),
        "workloads": args.workloads,
    }


def header(info: dict[str, Any]) -> str:
    return "\n".join([
        "## Benchmark results", "",
        f"- command: `{info['command']}`",
        f"- machine: {info['machine']}; {info['started']}",
        f"- sizes: {info['mode']} — {Sizes(**info['sizes'])}",
        f"- versions: {', '.join(info['versions'])}",
    ]) + "\n"


def run_workloads(args: argparse.Namespace, ctx: Context, parts: list[str]) -> list[Table]:
    tables: list[Table] = []
    for letter in args.workloads:
        name, workload = WORKLOADS[letter]
        t = time.perf_counter()
        harness.log(f"({letter}) {name} ...")
        with PROGRESS.workload(f"({letter}) {name}"):
            produced = workload(ctx)
        harness.log(f"({letter}) {name} done in {time.perf_counter() - t:.1f} s")
        for table in produced:
            print(table.markdown(), flush=True)
            parts.append(table.markdown())
        tables += produced
    return tables


def outputs(args: argparse.Namespace, info: dict[str, Any], tables: list[Table], parts: list[str]) -> None:
    json_path = Path(args.json) if args.json else RESULTS / f"{info['mode']}.json"
    json_path.parent.mkdir(parents=True, exist_ok=True)
    data = write_json(json_path, info, tables)
    png = chart(data, Path(args.chart) if args.chart else json_path.with_suffix(".png"))
    print(summary(data), flush=True)
    parts.append(summary(data))
    harness.log(f"wrote {json_path} and {png}")
    if args.out:
        Path(args.out).write_text("\n".join(parts), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    env = Env()
    started = time.perf_counter()
    info = meta(args)
    try:
        savers, skipped = probe(select_savers(saver_entries(), args.selectors), env)
        storages, skipped_storages = probe(select_storages(storage_entries(), args.selectors), env)
        ctx = Context(env, args.sizes, savers, skipped, storages, skipped_storages)
        parts = [header(info)]
        print(parts[0], flush=True)
        tables = run_workloads(args, ctx, parts)
        info["total_seconds"] = round(time.perf_counter() - started, 1)
        parts.append(f"_Total time: {info['total_seconds']:.0f} s._\n")
        print(parts[-1])
        outputs(args, info, tables, parts)
    finally:
        env.close()
        harness.close_loop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
