"""(b) raw saver operations and (c) flatness in history, measured on the same stores.

Each (saver, mode) cell opens three fresh stores and fills them once in the
issue-15 shape (:mod:`benchmarks.shape`): a short thread (``small``, 10
checkpoints), a thread listed whole (``whole``, 100) and a long thread
(``history``, 5,000; its ``put_writes`` only on the last 10, to bound the
fill). Then, in interleaved rounds, each cell puts on a fresh thread and on
the long one, and times every read at both lengths. (b) prints per backend
our time against the anchors' with the ratio; (c) prints how each read
grows from 10 to 5,000 checkpoints, and for Redis and S3 the requests it sends.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from .harness import (
    MODES,
    PROGRESS,
    Clock,
    Context,
    SaverCall,
    SaverEntry,
    Script,
    Session,
    Table,
    cells,
    drive,
    fmt_ratio,
    fmt_time,
    interleaved,
    median,
    ratio,
    report_error,
    timed,
    verdict,
)
from .savers import FAMILIES
from .services import counting_redis_py
from .shape import ShapeThread, by_id_config, thread_config

__all__ = ["workload_ops"]

#: The reads of (b)/(c): label -> (the call on a thread, the result's expected length or None).
READS: dict[str, Callable[[ShapeThread], SaverCall]] = {
    "get_tuple": lambda t: SaverCall("get_tuple", "get_tuple", (thread_config(t.thread_id),)),
    "get_tuple(id)": lambda t: SaverCall("get_tuple(id)", "get_tuple", (by_id_config(t.thread_id, by_id(t)),)),
    "list(10)": lambda t: SaverCall("list(10)", "list", (thread_config(t.thread_id),), {"limit": 10}),
    "list(10) no ns": lambda t: SaverCall("list(10) no ns", "list", (thread_config(t.thread_id, None),),
                                          {"limit": 10}),
    "list(None, 10)": lambda t: SaverCall("list(None, 10)", "list", (None,), {"limit": 10}),
}
def by_id(thread: ShapeThread) -> str:
    """The id ``get_tuple(id)`` reads: the 5th newest, which has its pending writes at every length."""
    return thread.ids[max(0, len(thread.ids) - 5)]


#: The reads (b) compares at both lengths; (c) shows every read of :data:`READS`.
B_READS = ("get_tuple", "get_tuple(id)", "list(10)")
WRITES_ON_LONG_THREAD = 10


@dataclass
class Stores:
    """One cell's stores and threads; ``big`` is None when the long thread could not be filled."""

    small: Session
    whole: Session
    big: Session | None
    threads: dict[str, ShapeThread]
    big_error: str = ""
    puts_done: int = 0
    sessions: list[Session] = field(default_factory=list)

    def close(self) -> None:
        for s in self.sessions:
            with contextlib.suppress(Exception):
                s.close()


def fill(s: Session, thread: ShapeThread, count: int, budget: float, writes_last: int) -> None:
    """Put ``count`` checkpoints (``put_writes`` on the last ``writes_last``) within ``budget`` s."""
    probe = min(20, count)
    t = time.perf_counter()
    drive(s, lambda sv: thread.puts(sv, probe, writes=count - probe < writes_last))
    projected = (time.perf_counter() - t) / probe * count
    if projected > budget:
        raise TimeoutError(f"filling {count:,} checkpoints would take ~{projected:.0f} s")
    bare = max(0, count - probe - writes_last)
    drive(s, lambda sv: thread.puts(sv, bare, writes=False))
    drive(s, lambda sv: thread.puts(sv, count - len(thread.ids)))


def open_stores(ctx: Context, entry: SaverEntry, mode: str) -> Stores:
    sz = ctx.sizes
    sessions = [Session(entry, mode, ctx.env) for _ in range(2)]
    stores = Stores(sessions[0], sessions[1], None, {}, sessions=sessions)
    try:
        for name, s, n in (("small", stores.small, sz.small), ("whole", stores.whole, sz.whole)):
            stores.threads[name] = ShapeThread(name)
            fill(s, stores.threads[name], n, sz.fill_budget, n)
        big = Session(entry, mode, ctx.env)
        sessions.append(big)
        stores.threads["big"] = ShapeThread("big")
        try:
            fill(big, stores.threads["big"], sz.history, sz.fill_budget, WRITES_ON_LONG_THREAD)
            stores.big = big
        except TimeoutError as exc:
            stores.big_error = f"not measured: {exc}"
    except BaseException:
        stores.close()
        raise
    return stores


def check(label: str, thread: ShapeThread, result: Any) -> None:
    """A read returned what was written (the latest, the id asked for, a full page)."""
    if label == "get_tuple" and result.checkpoint["id"] != thread.ids[-1]:
        raise AssertionError(f"get_tuple returned {result.checkpoint['id']}, not the latest")
    if label == "get_tuple(id)" and result.checkpoint["id"] != by_id(thread):
        raise AssertionError("get_tuple by id returned another checkpoint")
    if label.startswith("list(10)") and len(result) != min(10, len(thread.ids)):
        raise AssertionError(f"{label} returned {len(result)} checkpoints")


def reads(thread: ShapeThread, suffix: str, samples: int, budget: float, clock: Clock,
          names: tuple[str, ...] = tuple(READS)) -> Script[None]:
    """Time each read of ``names`` up to ``samples`` times (``budget`` s each) into ``clock``."""
    for name in names:
        start = time.perf_counter()
        for _ in range(samples):
            op = READS[name](thread)
            result = yield from timed(clock, SaverCall(name + suffix, op.method, op.args, op.kwargs))
            check(name, thread, result)
            if time.perf_counter() - start > budget:
                break


def whole_list(thread: ShapeThread, label: str, samples: int, budget: float, clock: Clock) -> Script[None]:
    start = time.perf_counter()
    for _ in range(samples):
        result = yield from timed(clock, SaverCall(label, "list", (thread_config(thread.thread_id),)))
        if len(result) != len(thread.ids):
            raise AssertionError(f"list of the whole thread returned {len(result)} of {len(thread.ids)}")
        if time.perf_counter() - start > budget:
            break


def one_round(ctx: Context, stores: Stores) -> dict[str, float]:
    """Puts on a fresh thread and on the long one, then every read; median seconds per label."""
    sz, clock = ctx.sizes, {}
    stores.puts_done += 1
    fresh = ShapeThread(f"put-{stores.puts_done}")
    deadline = time.perf_counter() + sz.cell_budget
    drive(stores.whole, lambda sv: fresh.puts(sv, sz.ops, clock=clock, deadline=deadline))
    drive(stores.whole, lambda sv: whole_list(stores.threads["whole"], whole_label(ctx), sz.samples,
                                              sz.budget, clock))
    drive(stores.small, lambda sv: reads(stores.threads["small"], f" @{sz.small:,}", sz.samples,
                                         sz.budget, clock))
    if stores.big is not None:
        big, at = stores.threads["big"], f" @{sz.history:,}"
        drive(stores.big, lambda sv: big.puts(sv, sz.deep_ops, clock=clock, suffix=at))
        drive(stores.big, lambda sv: reads(big, at, sz.samples, sz.budget, clock))
    return {label: m for label, times in clock.items() if (m := median(times)) is not None}


def whole_label(ctx: Context) -> str:
    return f"list(thread) @{ctx.sizes.whole:,}"


def count_reads(stores: Stores, ctx: Context) -> dict[str, int]:
    """Requests of one call of each read at both lengths (Redis round trips, S3 requests).

    Counted in each mode: a long thread may be filled in one mode only (S3's
    async face fills faster than its sync one)."""
    out: dict[str, int] = {}
    targets = [(stores.small, stores.threads["small"], ctx.sizes.small)]
    if stores.big is not None:
        targets.append((stores.big, stores.threads["big"], ctx.sizes.history))
    for s, thread, n in targets:
        counter = s.opened.requests  # each store's own: ours reads its backend's counter
        if counter is None:
            return out
        for name, make in READS.items():
            before = counter()
            op = make(thread)
            drive(s, lambda sv, op=op: timed(None, op))
            out[f"{name} @{n:,}"] = sum((counter() - before).values())
    return out


@dataclass
class OpsRun:
    """What the (b)/(c) measurement gathered, per cell."""

    medians: dict[tuple[SaverEntry, str], dict[str, float]]
    errors: dict[tuple[SaverEntry, str], str]
    big_errors: dict[tuple[SaverEntry, str], str]
    requests: dict[tuple[SaverEntry, str], dict[str, int]]


@contextlib.contextmanager
def opened_cells(ctx: Context) -> Iterator[tuple[dict[tuple[SaverEntry, str], Stores], dict[Any, str]]]:
    stores: dict[tuple[SaverEntry, str], Stores] = {}
    errors: dict[Any, str] = {}
    for entry, mode in cells(ctx.entries):
        PROGRESS.saver(entry.label(mode), mode, "filling")
        try:
            stores[entry, mode] = open_stores(ctx, entry, mode)
        except Exception as exc:
            report_error(errors, (entry, mode), exc)
    try:
        yield stores, errors
    finally:
        for s in stores.values():
            s.close()


def measure(ctx: Context) -> OpsRun:
    with opened_cells(ctx) as (stores, errors):
        keys = list(stores)
        results = interleaved(ctx.sizes.rounds, keys, lambda k: one_round(ctx, stores[k]), errors)
        medians = {k: {label: m for label in rs[0] if (m := median([r[label] for r in rs if label in r]))
                       is not None} for k, rs in results.items() if rs and k not in errors}
        requests: dict[tuple[SaverEntry, str], dict[str, int]] = {}
        with counting_redis_py():
            for key, st in stores.items():
                if key not in errors:
                    try:
                        requests[key] = count_reads(st, ctx)
                    except Exception as exc:
                        report_error(errors, key, exc)
        big_errors = {k: st.big_error for k, st in stores.items() if st.big_error}
    return OpsRun(medians, errors, big_errors, requests)


# -- (b) tables -----------------------------------------------------------------------------------


def b_labels(ctx: Context) -> list[str]:
    small, big = f" @{ctx.sizes.small:,}", f" @{ctx.sizes.history:,}"
    return ["put", "put_writes", "put" + big, "put_writes" + big,
            *(name + at for name in B_READS for at in (small, big)), whole_label(ctx)]


#: The per-operation target of ours against the reference (issues 15 and 18): min speed ratio.
B_TARGET = {"sqlite": 1.0, "redis": 1.0, "postgres": 1.0, "memory": 0.5}


def family_table(ctx: Context, family: str, got: OpsRun) -> Table | None:
    entries = ctx.of([family])
    ours = next((e for e in entries if e.ours), None)
    ref = ctx.reference(ours) if ours is not None else None
    if ours is None or not entries:
        return None
    others = [e for e in entries if e is not ours]
    headers = ["operation"]
    for mode in MODES:
        headers += [f"{e.label(mode)} ({mode})" for e in [ours, *others]]
        headers += [f"speed ours vs {ref.label(mode)} ({mode})" if ref else f"ratio ({mode})", "target"]
    table = Table(f"(b) {family}: median time per call, ours and the anchors side by side "
                  "(lower is better; speed ratio = anchor time / ours, ≥1 means ours is as fast or faster)",
                  headers)
    for label in b_labels(ctx):
        row = [label]
        for mode in MODES:
            row += [cell_time(got, e, mode, label, f"@{ctx.sizes.history:,}") for e in [ours, *others]]
            r = ratio(value(got, ref, mode, label), value(got, ours, mode, label)) if ref else None
            minimum = B_TARGET.get(family)
            row += [fmt_ratio(r), verdict(None if r is None else r >= minimum, f"≥{minimum:g}x")
                    if minimum is not None and ref is not None else ""]
        table.rows.append(row)
    table.notes += b_notes(ctx, entries, got)
    return table


def value(got: OpsRun, entry: SaverEntry | None, mode: str, label: str) -> float | None:
    return None if entry is None else got.medians.get((entry, mode), {}).get(label)


def cell_time(got: OpsRun, entry: SaverEntry, mode: str, label: str, long_thread: str) -> str:
    """The cell of one saver's median, or why there is none."""
    if entry.factory(mode) is None:
        return "n/a"
    if (entry, mode) in got.errors:
        return "error"
    seconds = value(got, entry, mode, label)
    if seconds is None and label.endswith(long_thread) and (entry, mode) in got.big_errors:
        return "not measured"
    return fmt_time(seconds)


def b_notes(ctx: Context, entries: list[SaverEntry], got: OpsRun) -> list[str]:
    sz = ctx.sizes
    notes = [f"Shape: 3 channels x 1 KB, one changing per put, each put followed by put_writes of 2. "
             f"{sz.rounds} interleaved rounds; per round {sz.ops} puts on a fresh thread, {sz.deep_ops} on "
             f"the {sz.history:,}-checkpoint thread, up to {sz.samples} calls of each read; medians. "
             "get_tuple(id) reads the 5th newest checkpoint (it has pending writes at both lengths); "
             "reads are checked against what was put."]
    for (entry, mode), why in got.errors.items():
        if entry in entries:
            notes.append(f"{entry.label(mode)} ({mode}): error: {why}")
    for (entry, mode), why in got.big_errors.items():
        if entry in entries:
            notes.append(f"{entry.label(mode)} ({mode}) @{sz.history:,}: {why}")
    return notes


# -- (c) table ------------------------------------------------------------------------------------


def c_table(ctx: Context, got: OpsRun) -> Table:
    sz = ctx.sizes
    small, big = f"@{sz.small:,}", f"@{sz.history:,}"
    headers = ["saver", "mode"]
    for name in READS:
        headers += [f"{name} {small}", f"{name} {big}", "growth"]
    headers += ["requests " + " / ".join(READS) + f" {small} → {big}", "target (ours)"]
    table = Table(f"(c) Flat in history: each read at {sz.small} vs {sz.history:,} checkpoints, median time "
                  "(lower is better; growth = time at the long thread / at the short one)", headers)
    for entry, mode in cells(ctx.entries):
        if (entry, mode) in got.errors:
            table.rows.append([entry.label(mode), mode, f"error: {got.errors[entry, mode]}"])
            continue
        table.rows.append(c_row(ctx, got, entry, mode))
    table.rows += ctx.skipped_rows(len(headers))
    table.notes.append("list(10) no ns: the thread's config without checkpoint_ns; list(None, 10): every "
                       "thread of the store (the short store holds only its 10 checkpoints, the long one "
                       f"its {sz.history:,}). Ours' target: every growth ≤1.5x; S3 (moto's LIST time grows "
                       "with the bucket): no more requests at the long thread than at the short one.")
    return table


def c_row(ctx: Context, got: OpsRun, entry: SaverEntry, mode: str) -> list[str]:
    sz = ctx.sizes
    row = [entry.label(mode), mode]
    growths = []
    for name in READS:
        a, b = (value(got, entry, mode, f"{name} @{n:,}") for n in (sz.small, sz.history))
        growths.append(ratio(b, a))
        row += [fmt_time(a), fmt_time(b) if b is not None else "not measured", fmt_ratio(growths[-1])]
    req = got.requests.get((entry, mode), {})
    counts = [(req.get(f"{n} @{sz.small:,}"), req.get(f"{n} @{sz.history:,}")) for n in READS]
    row.append(" / ".join(f"{a}→{b}" for a, b in counts) if req else "")
    if not entry.ours:
        row.append("")
    elif entry.family == "s3":
        complete = bool(req) and all(b is not None for _, b in counts)
        row.append(verdict(all(b <= a for a, b in counts) if complete else None, "no more requests"))
    else:
        row.append(verdict(None if None in growths else all(g <= 1.5 for g in growths if g), "≤1.5x"))
    return row


def workload_ops(ctx: Context) -> list[Table]:
    got = measure(ctx)
    tables = [t for family in FAMILIES if (t := family_table(ctx, family, got)) is not None]
    tables.append(c_table(ctx, got))
    for (entry, mode), labels in got.medians.items():
        for label, seconds in labels.items():
            tables[0].measure("b", entry, mode, label, seconds)
    for (entry, mode), counts in got.requests.items():
        for label, n in counts.items():
            tables[-1].measure("c", entry, mode, f"requests {label}", n, "requests")
    return tables
