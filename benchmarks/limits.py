"""(g) the concurrency shape and (h) our ``put`` against the floor of its storage.

(g) is issue 15's shape under concurrency: ``conc_threads`` workers (OS
threads sync, tasks async) share one saver, each putting ``conc_puts``
checkpoints (3 x 1 KB, one channel changing, ``put_writes`` of 2) on a thread
of its own, all at once.

(h) measures, per backend and in the same interleaved rounds, our sync ``put``,
the reference anchor's, and the least the storage can do for one put: one
SQLite commit of a comparable row (WAL, ``synchronous=NORMAL`` as ours), one
Redis round trip (a ``SET``), the S3 ``PUT`` requests our put sends (counted
on one put, then timed as plain boto3 ``put_object`` calls), one autocommit
``INSERT`` on PostgreSQL. The row is ~3.3 KB, the three 1 KB channels and
their metadata: what ``SqliteSaver`` writes per put.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import sqlite3
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from checkpointers._flows import arun, run

from .harness import (
    Clock,
    Context,
    Measure,
    Session,
    Table,
    cells,
    drive,
    fmt,
    fmt_ratio,
    fmt_time,
    interleaved,
    median,
    ratio,
    ref_label,
    session,
)
from .savers import FAMILIES, Env, SaverEntry
from .shape import ShapeThread

__all__ = ["workload_concurrency", "workload_floor"]

ROW = os.urandom(3_300)


# -- (g) concurrency -------------------------------------------------------------------------------


def concurrent_puts(ctx: Context, s: Session) -> tuple[int, float, list[float]]:
    """Every worker's puts at once; (puts done, wall seconds, put latencies)."""
    sz = ctx.sizes
    threads = [ShapeThread(f"conc-{uuid.uuid4().hex[:6]}-{w}") for w in range(sz.conc_threads)]
    clocks: list[Clock] = [{} for _ in threads]
    deadline = time.perf_counter() + sz.cell_budget

    def work(saver: Any) -> list[int]:
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(threads)) as pool:
            futures = [pool.submit(run, t.puts(saver, sz.conc_puts, clock=c, deadline=deadline), saver)
                       for t, c in zip(threads, clocks, strict=True)]
            return [f.result() for f in futures]

    async def awork(saver: Any) -> list[int]:
        return list(await asyncio.gather(*(arun(t.puts(saver, sz.conc_puts, clock=c, deadline=deadline),
                                                saver) for t, c in zip(threads, clocks, strict=True))))

    t = time.perf_counter()
    done = s.call(work, awork)
    return sum(done), time.perf_counter() - t, [x for c in clocks for x in c.get("put", [])]


def workload_concurrency(ctx: Context) -> list[Table]:
    sz = ctx.sizes
    keys = cells(ctx.entries)
    errors: dict[tuple[SaverEntry, str], str] = {}

    def once(key: tuple[SaverEntry, str]) -> tuple[float, float | None]:
        with session(key[0], key[1], ctx.env) as s:
            puts, seconds, latencies = concurrent_puts(ctx, s)
        return puts / seconds, median(latencies)

    results = interleaved(sz.rounds, keys, once, errors)
    table = Table(f"(g) Concurrency: {sz.conc_threads} threads x {sz.conc_puts} puts (3 x 1 KB, put_writes "
                  "of 2) on one saver at once — puts/s over all threads (higher is better)",
                  ["saver", "mode", "puts/s", "ratio vs reference", "median put latency"])
    rate = {k: median([r[0] for r in rs]) for k, rs in results.items()}
    for entry, mode in keys:
        if (entry, mode) in errors:
            table.rows.append([entry.label(mode), mode, f"error: {errors[entry, mode]}"])
            continue
        ref = ctx.reference(entry)
        r = ratio(rate[entry, mode], rate.get((ref, mode))) if ref and ref is not entry else None
        latency = median([x for _, x in results[entry, mode] if x is not None])
        table.rows.append([entry.label(mode), mode, fmt(rate[entry, mode]),
                           fmt_ratio(r, ref_label(ref, mode)) if r is not None else "", fmt_time(latency)])
        table.measure("g", entry, mode, f"puts/s ({sz.conc_threads}x{sz.conc_puts} concurrent)",
                      rate[entry, mode], "puts/s")
    table.rows += ctx.skipped_rows(5)
    table.notes.append(f"{sz.rounds} interleaved rounds, a fresh saver each; a cell still running after "
                       f"{sz.cell_budget:g} s stops its workers at their next put (puts/s is over what they did).")
    return [table]


# -- (h) the floor ---------------------------------------------------------------------------------


@contextlib.contextmanager
def sqlite_floor(env: Env, _: Session) -> Iterator[tuple[Callable[[], None], str]]:
    conn = sqlite3.connect(env.path("floor"), isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("CREATE TABLE t (thread TEXT, id TEXT, value BLOB, PRIMARY KEY (thread, id))")

    def one() -> None:
        conn.execute("BEGIN")
        conn.execute("INSERT INTO t VALUES (?, ?, ?)", ("floor", uuid.uuid4().hex, ROW))
        conn.execute("COMMIT")

    try:
        yield one, "one SQLite commit of one ~3.3 KB row (WAL, synchronous=NORMAL)"
    finally:
        conn.close()


@contextlib.contextmanager
def redis_floor(env: Env, _: Session) -> Iterator[tuple[Callable[[], None], str]]:
    import redis

    url, prefix = env.redis.fresh()
    client = redis.Redis.from_url(url)
    try:
        yield (lambda: client.set(f"{prefix}:{uuid.uuid4().hex}", ROW)), "one Redis round trip (SET of ~3.3 KB)"
    finally:
        client.close()


@contextlib.contextmanager
def s3_floor(env: Env, ours: Session) -> Iterator[tuple[Callable[[], None], str]]:
    counter = ours.opened.requests
    assert counter is not None
    thread = ShapeThread("floor-count")
    drive(ours, lambda sv: thread.puts(sv, 2, writes=False))
    before = counter()
    drive(ours, lambda sv: thread.puts(sv, 1, writes=False))
    puts = max(1, (counter() - before).get("PUT", 1))
    client, bucket = env.s3.client(), env.s3.fresh_bucket()

    def one() -> None:
        for _ in range(puts):
            client.put_object(Bucket=bucket, Key=uuid.uuid4().hex, Body=ROW[:1100])

    yield one, f"the {puts} S3 PUT(s) our put sends, one after the other (~1.1 KB each, boto3)"


@contextlib.contextmanager
def postgres_floor(env: Env, _: Session) -> Iterator[tuple[Callable[[], None], str]]:
    import psycopg

    conn = psycopg.connect(env.postgres.fresh(), autocommit=True)
    conn.execute("CREATE TABLE t (thread text, id text, value bytea, PRIMARY KEY (thread, id))")
    try:
        yield (lambda: conn.execute("INSERT INTO t VALUES (%s, %s, %s)", ("floor", uuid.uuid4().hex, ROW))
               and None), "one autocommit INSERT of one ~3.3 KB row"
    finally:
        conn.close()


FLOORS = {"sqlite": sqlite_floor, "redis": redis_floor, "s3": s3_floor, "postgres": postgres_floor}


def put_round(ctx: Context, s: Session) -> float | None:
    """Median seconds of ``floor_ops`` sync puts (no writes) on a fresh thread."""
    clock: Clock = {}
    thread = ShapeThread(f"floor-{uuid.uuid4().hex[:8]}")
    drive(s, lambda sv: thread.puts(sv, ctx.sizes.floor_ops, writes=False, clock=clock))
    return median(clock.get("put", []))


def floor_round(ctx: Context, one: Callable[[], None]) -> float | None:
    times = []
    for _ in range(ctx.sizes.floor_ops):
        t = time.perf_counter()
        one()
        times.append(time.perf_counter() - t)
    return median(times)


def floor_family(ctx: Context, family: str, stack: contextlib.ExitStack, table: Table) -> None:
    """One row of (h): ours, the reference and the floor, interleaved."""
    ours = next((e for e in ctx.of([family]) if e.ours and e.sync is not None), None)
    if ours is None:
        return
    ref = ctx.reference(ours)
    sessions = {e: stack.enter_context(session(e, "sync", ctx.env)) for e in (ours, ref) if e is not None}
    one, what = stack.enter_context(FLOORS[family](ctx.env, sessions[ours]))
    keys: list[Any] = [*sessions, "floor"]
    errors: dict[Any, str] = {}
    got = interleaved(ctx.sizes.rounds, keys, lambda k: floor_round(ctx, one) if k == "floor"
                      else put_round(ctx, sessions[k]), errors)
    m = {k: median([x for x in v if x is not None]) for k, v in got.items()}
    table.rows.append([family, fmt_time(m[ours]), fmt_time(m.get(ref)) if ref else "—", fmt_time(m["floor"]),
                       fmt_ratio(ratio(m[ours], m["floor"])),
                       fmt_ratio(ratio(m.get(ref), m["floor"])) if ref else "—", what,
                       "; ".join(f"{k if isinstance(k, str) else k.name}: {v}" for k, v in errors.items())])
    table.measure("h", ours, "sync", "put (floor run)", m[ours])
    if ref is not None:
        table.measure("h", ref, "sync", "put (floor run)", m.get(ref))
    if m["floor"] is not None:
        table.measures.append(Measure("h", "floor", family, f"floor: {family}", what, False, "sync",
                                      m["floor"], "s"))


def workload_floor(ctx: Context) -> list[Table]:
    table = Table("(h) Limit side: our sync put (3 x 1 KB, one channel changing) against the floor of its "
                  "storage, measured in the same interleaved rounds (lower is better)",
                  ["backend", "ours put", "reference put", "floor", "ours / floor", "reference / floor",
                   "floor is", "errors"])
    with contextlib.ExitStack() as stack:
        for family in FAMILIES:
            if family in FLOORS:
                try:
                    floor_family(ctx, family, stack, table)
                except Exception as exc:
                    table.rows.append([family, f"error: {type(exc).__name__}: {exc}"[:160]])
    table.notes.append(f"{ctx.sizes.rounds} rounds of {ctx.sizes.floor_ops} calls each; medians. The gap "
                       "between ours and the floor is the saver's own work per put: encoding, digests, "
                       "the isolation and append-only checks, and any statements or requests beyond one.")
    return [table]
