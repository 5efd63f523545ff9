"""The workloads, each returning markdown :class:`~.harness.Table` objects (with their measures).

Every workload runs its savers in this one process, in **interleaved rounds**
(round r visits the savers in an order rotated by r, so none is always first
or last) where it times, and reports **medians**. Ratios are against the
reference anchor of the saver's family (:data:`~.savers.REFERENCE`) measured
in the same run; targets come from the issues.

(a) graph       real compiled graph, T threads x 25 steps, a channel growing ~1 KB/step
(b) ops         put, put_writes, get_tuple (latest, by id), list(10), list of a thread, at 10 and 5,000
(c) history     the same run's reads at 10 vs 5,000 checkpoints, and their requests (:mod:`.ops`)
(d) footprint   50 KB channel once + a counter per step; bytes per put of the 3 x 1 KB shape
(e) requests    Redis round trips / S3 requests per operation and per graph step
(f) agent-fw    Agent Framework save/load/get_latest/list_checkpoint_ids at 3 sizes (:mod:`.agent_framework`)
(g) concurrency 20 threads x 100 puts at once (:mod:`.limits`)
(h) floor       our put against one commit / round trip / PUT / INSERT of its storage (:mod:`.limits`)
"""

from __future__ import annotations

import collections
import uuid
from collections.abc import Callable
from typing import Any

from .agent_framework import workload_agent_framework
from .graphs import big_graph, growing_graph, run_config, run_graph
from .harness import (
    Context,
    SaverCall,
    SaverEntry,
    Session,
    Table,
    cells,
    drive,
    fmt,
    fmt_bytes,
    fmt_ratio,
    interleaved,
    median,
    primary_mode,
    ratio,
    ref_label,
    report_error,
    session,
    timed,
    verdict,
)
from .limits import workload_concurrency, workload_floor
from .ops import workload_ops
from .savers import REFERENCE
from .services import counting_redis_py
from .shape import ShapeThread, thread_config

__all__ = ["WORKLOADS"]


# -- (a) graph throughput ---------------------------------------------------------------------

#: Graph steps/s targets of ours against the family's reference (issues 3, 15, 18).
GRAPH_TARGET = {"sqlite": 1.2, "redis": 1.5, "memory": 0.95, "postgres": 1.0}


def graph_once(ctx: Context, key: tuple[SaverEntry, str]) -> float:
    """One round of (a) for one cell: a fresh saver, the threads one after the other; steps/s."""
    sz = ctx.sizes
    entry, mode = key
    with session(entry, mode, ctx.env) as s:
        graph = growing_graph(s.saver, sz.graph_steps)
        run_id = uuid.uuid4().hex[:8]
        inputs = [({"log": "", "step": 0}, run_config(f"g-{run_id}-{t}", sz.graph_steps))
                  for t in range(sz.graph_threads)]
        runs, seconds = run_graph(s, graph, inputs, sz.cell_budget)
    return runs * sz.graph_steps / seconds


def workload_graph(ctx: Context) -> list[Table]:
    sz = ctx.sizes
    keys = cells(ctx.entries)
    errors: dict[tuple[SaverEntry, str], str] = {}
    results = interleaved(sz.rounds, keys, lambda k: graph_once(ctx, k), errors)
    speed = {k: median(v) for k, v in results.items()}
    table = Table(
        f"(a) Real graph: {sz.graph_threads} threads x {sz.graph_steps} steps, "
        "one channel growing ~1 KB/step — graph steps/s (higher is better)",
        ["saver", "mode", "steps/s (median)", "ratio vs reference", "target"],
    )
    for entry, mode in keys:
        if (entry, mode) in errors:
            table.rows.append([entry.label(mode), mode, f"error: {errors[entry, mode]}", "", ""])
            continue
        ref = ctx.reference(entry)
        r = ratio(speed[entry, mode], speed.get((ref, mode))) if ref and ref is not entry else None
        minimum = GRAPH_TARGET.get(entry.family) if entry.ours and ref is not None else None
        tcell = verdict(None if r is None else r >= minimum, f"≥{minimum:g}x {ref.label(mode)}") \
            if minimum is not None and ref is not None else ""
        table.rows.append([entry.label(mode), mode, fmt(speed[entry, mode]),
                           fmt_ratio(r, ref_label(ref, mode)) if r is not None else "", tcell])
        table.measure("a", entry, mode, "graph steps/s", speed[entry, mode], "steps/s")
    table.rows += ctx.skipped_rows(5)
    table.notes.append(f"{sz.rounds} interleaved rounds; each round opens a fresh saver on fresh "
                       "storage and runs the threads one after the other (`invoke` / `ainvoke`); "
                       f"a saver still running after {sz.cell_budget:g} s stops after its current "
                       "thread (steps/s is over the threads it ran).")
    return [table]


# -- (d) bytes at rest ------------------------------------------------------------------------------


def big_channel_bytes(ctx: Context, entry: SaverEntry) -> int | None:
    """(d): bytes at rest after the 50 KB-once graph."""
    sz = ctx.sizes
    with session(entry, primary_mode(entry), ctx.env) as s:
        graph = big_graph(s.saver, sz.footprint_steps)
        run_graph(s, graph, [({"big": "", "counter": 0}, run_config("footprint", sz.footprint_steps + 2))])
        return s.opened.footprint() if s.opened.footprint else None


def shape_bytes_per_put(ctx: Context, entry: SaverEntry) -> float | None:
    """Bytes at rest per put of the issue-15 shape (3 x 1 KB, one changing, put_writes of 2)."""
    n = ctx.sizes.shape_puts
    with session(entry, primary_mode(entry), ctx.env) as s:
        thread = ShapeThread("bytes")
        drive(s, lambda sv: thread.puts(sv, n))
        return s.opened.footprint() / n if s.opened.footprint else None


#: Bytes-at-rest targets of ours (issues 2, 15, 18): (workload metric, max ratio, against whom).
BYTES_TARGET: dict[str, list[tuple[str, float, str]]] = {
    "sqlite": [("bytes", 0.25, "langgraph-checkpoint-sqlite"), ("bytes/put", 1.0, "langgraph-checkpoint-sqlite")],
    "redis": [("bytes/put", 1.0, "langgraph-checkpoint-plainredis")],
    "postgres": [("bytes", 0.5, "langgraph-checkpoint-postgres")],
}


def footprint_targets(entry: SaverEntry, sizes: dict[str, dict[SaverEntry, Any]],
                      by_name: dict[str, SaverEntry]) -> str:
    out = []
    for metric, maximum, anchor in BYTES_TARGET.get(entry.family, []) if entry.ours else []:
        ref = by_name.get(anchor)
        r = ratio(sizes[metric].get(entry), sizes[metric].get(ref)) if ref else None
        out.append(verdict(None if r is None else r <= maximum,
                           f"{metric} ≤{maximum:g}x {ref.label('sync') if ref else anchor}"))
    return "; ".join(out)


def workload_footprint(ctx: Context) -> list[Table]:
    sz = ctx.sizes
    sizes: dict[str, dict[SaverEntry, Any]] = {"bytes": {}, "bytes/put": {}}
    errors: dict[SaverEntry, str] = {}
    for entry in ctx.entries:
        try:
            sizes["bytes"][entry] = big_channel_bytes(ctx, entry)
            sizes["bytes/put"][entry] = shape_bytes_per_put(ctx, entry)
        except Exception as exc:
            report_error(errors, entry, exc)
    by_name = {e.name: e for e in ctx.entries}
    sqlite_ref = by_name.get(REFERENCE["sqlite"])
    table = Table(
        f"(d) Bytes at rest: a 50 KB channel written once + a counter changing every step, "
        f"{sz.footprint_steps} steps; and per put of the 3 x 1 KB shape ({sz.shape_puts} puts, "
        "put_writes of 2 each) (lower is better)",
        ["saver", "mode", "bytes (50 KB once)", "what is measured", "ratio vs SqliteSaver",
         "ratio vs reference", "bytes per put (3 x 1 KB)", "ratio vs reference", "targets"],
    )
    what = {"sqlite": "file + WAL after checkpoint", "memory": "serialized bytes held",
            "redis": "MEMORY USAGE of its keys", "s3": "sum of object sizes",
            "postgres": "pg_database_size minus an empty database's"}
    for entry in ctx.entries:
        mode = primary_mode(entry)
        if entry in errors:
            table.rows.append([entry.label(mode), mode, f"error: {errors[entry]}"])
            continue
        ref = ctx.reference(entry)
        ref = ref if ref is not entry else None
        big, per_put = sizes["bytes"][entry], sizes["bytes/put"][entry]
        table.rows.append([
            entry.label(mode), mode, fmt(big), what[entry.family],
            fmt_ratio(ratio(big, sizes["bytes"].get(sqlite_ref))) if sqlite_ref else "",
            fmt_ratio(ratio(big, sizes["bytes"].get(ref)), ref_label(ref, mode)) if ref else "",
            fmt_bytes(per_put),
            fmt_ratio(ratio(per_put, sizes["bytes/put"].get(ref)), ref_label(ref, mode)) if ref else "",
            footprint_targets(entry, sizes, by_name),
        ])
        table.measure("d", entry, mode, "bytes (50 KB once)", big, "bytes")
        table.measure("d", entry, mode, "bytes/put (3 x 1 KB)", per_put, "bytes")
    table.rows += ctx.skipped_rows(9)
    table.notes.append("One run per saver (sizes are deterministic). Redis sizes are server memory, "
                       "not disk; memory savers count the serialized bytes they hold; PostgreSQL counts "
                       "8 KiB pages (tables, indexes, TOAST) of a fresh database.")
    return [table]


# -- (e) requests per operation ------------------------------------------------------------------------

E_OPS = ("put", "get_tuple_bare", "put_writes", "get_tuple", "list")


def count_one(s: Session, op: SaverCall) -> tuple[Any, collections.Counter[str]]:
    """Run one call; its result and the requests it sent, by kind."""
    counter = s.opened.requests
    assert counter is not None
    before = counter()
    result = drive(s, lambda sv: timed(None, op))
    return result, counter() - before


def probe_requests(ctx: Context, entry: SaverEntry) -> dict[str, collections.Counter[str]]:
    """Each op of one checkpoint (2 new ~4 KB channels: 2 blobs) on a thread with 3, then a graph."""
    sz = ctx.sizes
    counts: dict[str, collections.Counter[str]] = {}
    with session(entry, primary_mode(entry), ctx.env) as s:
        thread = ShapeThread("req", channels=2, size=4096, changing=2)
        drive(s, lambda sv: thread.puts(sv, 3, writes=False))  # warm up; the probe writes the 4th checkpoint
        counter = s.opened.requests
        assert counter is not None
        before = counter()
        drive(s, lambda sv: thread.puts(sv, 1, writes=False))
        counts["put"] = counter() - before
        latest = SaverCall("get_tuple", "get_tuple", (thread_config("req"),))
        counts["get_tuple_bare"] = count_one(s, latest)[1]
        pending = [("ch0", "w"), ("ch1", "x")]
        counts["put_writes"] = count_one(s, SaverCall("put_writes", "put_writes",
                                                      (thread.config, pending, "task-req")))[1]
        counts["get_tuple"] = count_one(s, latest)[1]
        counts["list"] = count_one(s, SaverCall("list", "list", (thread_config("req"),), {"limit": 10}))[1]
        graph = growing_graph(s.saver, sz.requests_graph_steps)
        before = counter()
        run_graph(s, graph, [({"log": "", "step": 0}, run_config("req-graph", sz.requests_graph_steps))])
        counts["graph"] = counter() - before
    return counts


def fmt_requests(kinds: collections.Counter[str]) -> str:
    total = sum(kinds.values())
    if set(kinds) <= {"sync", "async", "trips"}:
        return str(total)
    return f"{total} ({', '.join(f'{k} {v}' for k, v in sorted(kinds.items()))})"


def request_targets(entry: SaverEntry, c: dict[str, collections.Counter[str]],
                    per_step: dict[SaverEntry, float]) -> str:
    def total(label: str) -> int:
        return sum(c[label].values())

    targets: list[str] = []
    if entry.ours and entry.family == "redis":
        targets.append(verdict(total("put") <= 1, "put ≤1 trip"))
        targets.append(verdict(max(total("get_tuple"), total("get_tuple_bare")) <= 2, "get_tuple ≤2 trips"))
    if entry.ours and entry.family == "s3":
        kinds = c["put"]
        targets.append(verdict(kinds.get("PUT", 0) <= 3 and not kinds.get("LIST"), "put ≤3 PUT (2 blobs + 1), no LIST"))
        targets.append(verdict(total("get_tuple_bare") <= 2 + 2, "get_tuple ≤2 + 2 blob GETs"))
        anchors = [v for e, v in per_step.items() if e.family == "s3" and not e.ours]
        targets.append(verdict(all(per_step[entry] < a for a in anchors) if anchors else None,
                               "fewer per step than every anchor"))
    return "; ".join(targets)


def workload_requests(ctx: Context) -> list[Table]:
    sz = ctx.sizes
    entries = ctx.of(("redis", "s3"))
    measured: dict[SaverEntry, dict[str, collections.Counter[str]]] = {}
    errors: dict[SaverEntry, str] = {}
    with counting_redis_py():
        for entry in entries:
            try:
                measured[entry] = probe_requests(ctx, entry)
            except Exception as exc:
                report_error(errors, entry, exc)
    steps = sz.requests_graph_steps
    per_step = {e: sum(c["graph"].values()) / steps for e, c in measured.items()}
    table = Table(
        "(e) Requests per operation: Redis round trips (client-side) / S3 HTTP requests "
        "(server-side), one op on a thread with 3 checkpoints (lower is better)",
        ["saver", "mode", "put (2 new blobs)", "latest get_tuple, no writes yet", "put_writes (2)",
         "latest get_tuple", "list(10)", f"per graph step ({steps}-step run)", "targets"],
    )
    for entry in entries:
        mode = primary_mode(entry)
        if entry in errors:
            table.rows.append([entry.label(mode), mode, f"error: {errors[entry]}"])
            continue
        c = measured[entry]
        table.rows.append([entry.label(mode), mode, *(fmt_requests(c[label]) for label in E_OPS),
                           f"{per_step[entry]:.2f}", request_targets(entry, c, per_step)])
        for label in E_OPS:
            table.measure("e", entry, mode, f"requests {label}", sum(c[label].values()), "requests")
        table.measure("e", entry, mode, "requests per graph step", per_step[entry], "requests")
    table.rows += ctx.skipped_rows(9, ("redis", "s3"))
    table.notes.append("The latest get_tuple of a checkpoint with pending writes also reads its writes "
                       "records: one per put_writes call (S3: one GET each, found by the same LIST).")
    table.notes.append("Redis: ours counted by its own `round_trips`, the anchors where redis-py writes a "
                       "request (a pipeline or MULTI/EXEC is one). S3: counted by a middleware in the moto "
                       "server, LIST = bucket listing. Requests at 10 vs 5,000 checkpoints are in (c).")
    return [table]


#: workload letter -> (name, function); (c) is measured with (b), on the same stores.
WORKLOADS: dict[str, tuple[str, Callable[[Context], list[Table]]]] = {
    "a": ("graph", workload_graph),
    "b": ("ops", workload_ops),
    "d": ("footprint", workload_footprint),
    "e": ("requests", workload_requests),
    "f": ("agent-framework", workload_agent_framework),
    "g": ("concurrency", workload_concurrency),
    "h": ("floor", workload_floor),
}
#: Names that select a workload measured with another.
ALIASES = {"c": "b", "history": "b"}
