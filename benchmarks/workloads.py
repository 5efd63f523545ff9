"""The workloads (a)-(f), each returning a markdown :class:`Table`.

Every workload runs all its savers in this one process, in **interleaved
rounds** (round r visits the savers in an order rotated by r, so none is
always first or last), and reports the **median** over rounds. Ratios are
against the reference anchor of the saver's family (:data:`~.savers.REFERENCE`)
measured in the same run; targets come from the issues.

(a) graph       real compiled graph, T threads x 25 steps, a channel growing ~1 KB/step
(b) ops         raw put + put_writes + get_tuple + list(limit=10), ops/s
(c) history     latest get_tuple and list(limit=10) at 10 vs N checkpoints
(d) footprint   50 KB channel written once + a counter changing every step: bytes at rest
(e) requests    Redis round trips / S3 requests per operation and per graph step
(f) agent-fw    Agent Framework save/load/get_latest/list_checkpoint_ids at 3 sizes
"""

from __future__ import annotations

import asyncio
import contextlib
import operator
import random
import statistics
import threading
import time
import traceback
import uuid
from collections.abc import Awaitable, Callable, Generator, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, TypedDict, TypeVar

from .savers import REFERENCE, Env, Opened, SaverEntry, StorageEntry
from .services import (
    REDIS_TRIPS,
    S3_REQUESTS,
    RemoteCounter,
    RequestCounter,
    counting_redis_round_trips,
)

Counter = RequestCounter | RemoteCounter

__all__ = ["Sizes", "Table", "WORKLOADS"]

T = TypeVar("T")
MODES = ("sync", "async")


# -- sizes -----------------------------------------------------------------------


@dataclass(frozen=True)
class Sizes:
    """How big each workload is. :meth:`quick` finishes in well under 2 minutes."""

    rounds: int = 3
    graph_threads: int = 20
    graph_steps: int = 25
    ops: int = 200
    history: int = 5_000
    samples: int = 15
    footprint_steps: int = 200
    requests_graph_steps: int = 25
    agent_sizes: tuple[int, ...] = (100, 1_000, 5_000)
    #: seconds one timed cell of (c)/(f) may take before it stops sampling
    budget: float = 3.0
    #: seconds one (a)/(b) cell may run before it stops (its rate stays valid)
    cell_budget: float = 4.0
    #: (f) skips a size where one call is expected to take longer than this
    slow_call: float = 5.0
    #: (c) gives up on a saver that cannot put its history within this many seconds
    fill_budget: float = 100.0

    @classmethod
    def quick(cls) -> Sizes:
        return cls(
            rounds=2,
            graph_threads=2,
            graph_steps=10,
            ops=30,
            history=200,
            samples=5,
            footprint_steps=40,
            requests_graph_steps=5,
            agent_sizes=(10, 50, 150),
            budget=0.3,
            cell_budget=0.5,
            slow_call=0.5,
            fill_budget=15.0,
        )


# -- output ------------------------------------------------------------------------


@dataclass
class Table:
    """One markdown table with a title and notes."""

    title: str
    headers: list[str]
    rows: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def markdown(self) -> str:
        lines = [f"### {self.title}", ""]
        lines.append("| " + " | ".join(self.headers) + " |")
        lines.append("|" + "|".join("---" for _ in self.headers) + "|")
        for row in self.rows:
            cells = row + [""] * (len(self.headers) - len(row))
            lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
        if self.notes:
            lines.append("")
            lines.extend(f"- {n}" for n in self.notes)
        return "\n".join(lines) + "\n"


def fmt(value: float | None, unit: str = "") -> str:
    """A number with 3 significant digits, thousands separated."""
    if value is None:
        return "—"
    if value >= 100:
        text = f"{value:,.0f}"
    elif value >= 10:
        text = f"{value:.1f}"
    else:
        text = f"{value:.3g}"
    return text + unit


def fmt_time(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def ratio(value: float | None, ref: float | None) -> float | None:
    if value is None or ref is None or ref == 0:
        return None
    return value / ref


def fmt_ratio(r: float | None, ref_label: str = "") -> str:
    if r is None:
        return "—"
    return f"{r:.2f}x" + (f" {ref_label}" if ref_label else "")


def verdict(ok: bool | None, text: str) -> str:
    """A target cell: the target and ✅ / ❌ (or just the target when unmeasured)."""
    if ok is None:
        return f"{text} (not measured)"
    return f"{text} {'✅' if ok else '❌'}"


def median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def short_error(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".splitlines()[0]
    return text[:160]


# -- running sync and async savers -----------------------------------------------


class BackgroundLoop:
    """One event loop for the whole run, in its own thread.

    Async savers are loop-bound (aiosqlite, redis.asyncio), so every async
    call of the run goes through this one loop, while sync calls stay on the
    main thread. Async timings are taken inside the coroutines, so the hop
    between threads is not measured.
    """

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="bench-loop")
        self._thread.start()

    def run(self, coro: Awaitable[T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()  # type: ignore[arg-type]

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)


LOOP: BackgroundLoop | None = None


def loop() -> BackgroundLoop:
    global LOOP
    if LOOP is None:
        LOOP = BackgroundLoop()
    return LOOP


class Session:
    """A saver kept open across rounds, sync or async."""

    def __init__(self, entry: SaverEntry, mode: str, env: Env) -> None:
        self.entry, self.mode = entry, mode
        factory = entry.factory(mode)
        assert factory is not None
        if mode == "sync":
            self._stack: Any = contextlib.ExitStack()
            self.opened: Opened = self._stack.enter_context(factory(env))  # type: ignore[arg-type]
        else:
            self._stack = contextlib.AsyncExitStack()
            self.opened = loop().run(self._stack.enter_async_context(factory(env)))  # type: ignore[arg-type]

    @property
    def saver(self) -> Any:
        return self.opened.saver

    def call(self, work: Callable[[Any], T], awork: Callable[[Any], Awaitable[T]]) -> T:
        """``work(saver)`` on the main thread, or ``await awork(saver)`` on the loop."""
        if self.mode == "sync":
            return work(self.saver)
        return loop().run(awork(self.saver))

    def close(self) -> None:
        if self.mode == "sync":
            self._stack.close()
        else:
            loop().run(self._stack.aclose())


@contextlib.contextmanager
def session(entry: SaverEntry, mode: str, env: Env) -> Any:
    s = Session(entry, mode, env)
    try:
        yield s
    finally:
        s.close()


def primary_mode(entry: SaverEntry) -> str:
    """The mode a one-mode workload uses: sync when the saver has it."""
    return "sync" if entry.sync is not None else "async"


def cells(entries: Iterable[SaverEntry], modes: Sequence[str] = MODES) -> list[tuple[SaverEntry, str]]:
    return [(e, m) for e in entries for m in modes if e.factory(m) is not None]


def interleaved(
    rounds: int, keys: Sequence[T], once: Callable[[T], Any], errors: dict[T, str]
) -> dict[T, list[Any]]:
    """``once(key)`` for every key, ``rounds`` times, in rotated order; failures recorded once."""
    results: dict[T, list[Any]] = {k: [] for k in keys}
    for r in range(rounds):
        shift = r % max(1, len(keys))
        for key in list(keys[shift:]) + list(keys[:shift]):
            if key in errors:
                continue
            try:
                results[key].append(once(key))
            except Exception as exc:  # a saver failing must not stop the others
                errors[key] = short_error(exc)
                traceback.print_exc()
    return results


def timed_samples(call: Callable[[], Any], samples: int, budget: float) -> list[float]:
    """Time ``call`` up to ``samples`` times, stopping early once ``budget`` s are spent."""
    times: list[float] = []
    start = time.perf_counter()
    for _ in range(samples):
        t = time.perf_counter()
        call()
        times.append(time.perf_counter() - t)
        if time.perf_counter() - start > budget:
            break
    return times


async def atimed_samples(call: Callable[[], Awaitable[Any]], samples: int, budget: float) -> list[float]:
    times: list[float] = []
    start = time.perf_counter()
    for _ in range(samples):
        t = time.perf_counter()
        await call()
        times.append(time.perf_counter() - t)
        if time.perf_counter() - start > budget:
            break
    return times


# -- graphs -----------------------------------------------------------------------

CHUNK = "".join(random.Random(1).choices("abcdefghijklmnopqrstuvwxyz0123456789", k=1024))
BIG = random.Random(2).randbytes(25_000).hex()  # 50 KB, incompressible


class GrowingState(TypedDict):
    log: Annotated[str, operator.add]
    step: int


class BigState(TypedDict):
    big: str
    counter: int


def growing_graph(checkpointer: Any, steps: int) -> Any:
    """A loop of ``steps`` supersteps; each appends ~1 KB to the ``log`` channel."""
    from langgraph.graph import END, START, StateGraph

    def work(state: GrowingState) -> dict[str, Any]:
        return {"log": CHUNK, "step": state["step"] + 1}

    builder = StateGraph(GrowingState)
    builder.add_node("work", work)
    builder.add_edge(START, "work")
    builder.add_conditional_edges("work", lambda s: "work" if s["step"] < steps else END)
    return builder.compile(checkpointer=checkpointer)


def big_graph(checkpointer: Any, steps: int) -> Any:
    """``init`` writes a 50 KB channel once, then ``tick`` increments a counter ``steps`` times."""
    from langgraph.graph import END, START, StateGraph

    def init(state: BigState) -> dict[str, Any]:
        return {"big": BIG, "counter": 0}

    def tick(state: BigState) -> dict[str, Any]:
        return {"counter": state["counter"] + 1}

    builder = StateGraph(BigState)
    builder.add_node("init", init)
    builder.add_node("tick", tick)
    builder.add_edge(START, "init")
    builder.add_edge("init", "tick")
    builder.add_conditional_edges("tick", lambda s: "tick" if s["counter"] < steps else END)
    return builder.compile(checkpointer=checkpointer)


def run_config(thread_id: str, steps: int) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread_id}, "recursion_limit": steps + 10}


def run_graph(
    s: Session,
    graph: Any,
    inputs: list[tuple[dict[str, Any], dict[str, Any]]],
    budget: float = float("inf"),
) -> tuple[int, float]:
    """Invoke (or ainvoke) ``graph`` per ``(input, config)`` until ``budget`` s are spent.

    Returns ``(runs done, seconds spent)``; at least one run is done.
    """

    def work(_: Any) -> tuple[int, float]:
        t = time.perf_counter()
        for done, (value, config) in enumerate(inputs, 1):
            graph.invoke(value, config)
            if time.perf_counter() - t > budget:
                return done, time.perf_counter() - t
        return len(inputs), time.perf_counter() - t

    async def awork(_: Any) -> tuple[int, float]:
        t = time.perf_counter()
        for done, (value, config) in enumerate(inputs, 1):
            await graph.ainvoke(value, config)
            if time.perf_counter() - t > budget:
                return done, time.perf_counter() - t
        return len(inputs), time.perf_counter() - t

    return s.call(work, awork)


# -- raw saver operations, written once for sync and async ----------------------------


@dataclass(frozen=True)
class Op:
    """One saver call: ``label`` for timing, ``method`` (sync name), arguments."""

    label: str
    method: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)


Flow = Generator[Op, Any, None]


def thread_config(thread_id: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}


def raw_ops(
    saver: Any, thread_id: str, count: int, *, writes: bool = True, reads: bool = True, blobs: bool = False
) -> Flow:
    """``count`` checkpoints, each changing 2 channels (a counter and ~1 KB of new text).

    With ``writes``, each checkpoint gets 2 pending writes; with ``reads``, the
    latest checkpoint is read back and the last 10 are listed. With ``blobs``,
    both channels are ~4 KB texts instead, over any saver's inline limit, so
    a put stores 2 new values of their own (what (e) counts requests for).
    """
    from langgraph.checkpoint.base import empty_checkpoint
    from langgraph.checkpoint.base.id import uuid6

    base = thread_config(thread_id)
    config: Any = base
    versions: dict[str, Any] = {}
    for i in range(count):
        checkpoint = empty_checkpoint()
        checkpoint["id"] = str(uuid6(clock_seq=i))
        new_versions = {}
        for channel in ("counter", "payload"):
            versions[channel] = saver.get_next_version(versions.get(channel), None)
            new_versions[channel] = versions[channel]
        checkpoint["channel_versions"] = dict(versions)
        if blobs:
            checkpoint["channel_values"] = {ch: f"{ch}:{thread_id}:{i:08d}:{CHUNK * 4}" for ch in new_versions}
        else:
            checkpoint["channel_values"] = {"counter": i, "payload": f"{thread_id}:{i:08d}:{CHUNK}"}
        metadata = {"source": "loop", "step": i, "parents": {}}
        config = yield Op("put", "put", (config, checkpoint, metadata, new_versions))
        if writes:
            yield Op("put_writes", "put_writes",
                     (config, [("counter", i + 1), ("payload", f"w{i}")], f"task-{i}"))
        if reads:
            yield Op("get_tuple", "get_tuple", (base,))
            yield Op("list", "list", (base,), {"limit": 10})


def time_saver_calls(saver: Any, flow: Flow, clock: dict[str, list[float]] | None = None,
          budget: float = float("inf")) -> None:
    """Call the saver methods a workload script yields (sync), timing each call into ``clock``.

    Not a backend flow driver (that is ``checkpointers._flows.run``): a workload
    script yields saver calls, not backend operations.

    Stops at the end of the flow, or at the next ``put`` once ``budget`` s are spent.
    """
    start = time.perf_counter()
    try:
        op = next(flow)
        while not (op.label == "put" and time.perf_counter() - start > budget):
            t = time.perf_counter()
            result = getattr(saver, op.method)(*op.args, **op.kwargs)
            if op.method == "list":
                result = list(result)
            if clock is not None:
                clock.setdefault(op.label, []).append(time.perf_counter() - t)
            op = flow.send(result)
    except StopIteration:
        pass


async def atime_saver_calls(saver: Any, flow: Flow, clock: dict[str, list[float]] | None = None,
                 budget: float = float("inf")) -> None:
    """Run ``flow`` with the saver's async (``a``-prefixed) methods (see :func:`time_saver_calls`)."""
    start = time.perf_counter()
    try:
        op = next(flow)
        while not (op.label == "put" and time.perf_counter() - start > budget):
            t = time.perf_counter()
            if op.method == "list":
                result: Any = [x async for x in saver.alist(*op.args, **op.kwargs)]
            else:
                result = await getattr(saver, "a" + op.method)(*op.args, **op.kwargs)
            if clock is not None:
                clock.setdefault(op.label, []).append(time.perf_counter() - t)
            op = flow.send(result)
    except StopIteration:
        pass


def run_flow(s: Session, make_flow: Callable[[Any], Flow],
             budget: float = float("inf")) -> dict[str, list[float]]:
    """Drive ``make_flow(saver)`` in the session's mode; per-label timings."""

    def work(saver: Any) -> dict[str, list[float]]:
        clock: dict[str, list[float]] = {}
        time_saver_calls(saver, make_flow(saver), clock, budget)
        return clock

    async def awork(saver: Any) -> dict[str, list[float]]:
        clock: dict[str, list[float]] = {}
        await atime_saver_calls(saver, make_flow(saver), clock, budget)
        return clock

    return s.call(work, awork)


def read_latest(s: Session, thread_id: str) -> Any:
    return s.call(lambda sv: sv.get_tuple(thread_config(thread_id)),
                  lambda sv: sv.aget_tuple(thread_config(thread_id)))


def read_list(s: Session, thread_id: str) -> list[Any]:
    async def alist(sv: Any) -> list[Any]:
        return [x async for x in sv.alist(thread_config(thread_id), limit=10)]

    return s.call(lambda sv: list(sv.list(thread_config(thread_id), limit=10)), alist)


# -- shared table pieces --------------------------------------------------------------


@dataclass
class Context:
    """What every workload gets: the entries that can run, those that cannot, sizes, env."""

    env: Env
    sizes: Sizes
    entries: list[SaverEntry]
    skipped: list[tuple[SaverEntry, str]]
    storages: list[StorageEntry]
    skipped_storages: list[tuple[StorageEntry, str]]

    def of(self, families: Iterable[str]) -> list[SaverEntry]:
        fam = set(families)
        return [e for e in self.entries if e.family in fam]

    def skipped_rows(self, width: int, families: Iterable[str] | None = None) -> list[list[str]]:
        fam = None if families is None else set(families)
        return [
            [e.name, "—", reason] + [""] * (width - 3)
            for e, reason in self.skipped
            if fam is None or e.family in fam
        ]


def reference(ctx: Context, entry: SaverEntry) -> SaverEntry | None:
    name = REFERENCE.get(entry.family)
    return next((e for e in ctx.entries if e.name == name), None)


def ref_label(ref: SaverEntry | None, mode: str) -> str:
    return f"vs {ref.label(mode)}" if ref is not None else ""


# -- (a) graph throughput ---------------------------------------------------------------------


def graph_target(entry: SaverEntry, ref: SaverEntry | None, mode: str) -> tuple[float, str] | None:
    """The steps/s target of an entry (issues 2 and 3), as (min ratio, text)."""
    if not entry.ours or ref is None:
        return None
    minimum = {"sqlite": 1.0, "redis": 1.5}.get(entry.family)
    return None if minimum is None else (minimum, f"≥{minimum:.1f}x {ref.label(mode)}")


def workload_graph(ctx: Context) -> Table:
    sz = ctx.sizes
    keys = cells(ctx.entries)
    errors: dict[tuple[SaverEntry, str], str] = {}

    def once(key: tuple[SaverEntry, str]) -> float:
        entry, mode = key
        with session(entry, mode, ctx.env) as s:
            graph = growing_graph(s.saver, sz.graph_steps)
            run_id = uuid.uuid4().hex[:8]
            inputs = [({"log": "", "step": 0}, run_config(f"g-{run_id}-{t}", sz.graph_steps))
                      for t in range(sz.graph_threads)]
            runs, seconds = run_graph(s, graph, inputs, sz.cell_budget)
        return runs * sz.graph_steps / seconds

    results = interleaved(sz.rounds, keys, once, errors)
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
        ref = reference(ctx, entry)
        r = ratio(speed[entry, mode], speed.get((ref, mode))) if ref and ref is not entry else None
        target = graph_target(entry, ref, mode)
        tcell = verdict(None if r is None else r >= target[0], target[1]) if target else ""
        table.rows.append([entry.label(mode), mode, fmt(speed[entry, mode]),
                           fmt_ratio(r, ref_label(ref, mode)) if r is not None else "", tcell])
    table.rows += ctx.skipped_rows(5)
    table.notes.append(f"{sz.rounds} interleaved rounds; each round opens a fresh saver on fresh "
                       "storage and runs the threads one after the other (`invoke` / `ainvoke`); "
                       f"a saver still running after {sz.cell_budget:g} s stops after its current "
                       "thread (steps/s is over the threads it ran).")
    return table


# -- (b) raw operations -------------------------------------------------------------------------

OP_LABELS = ("put", "put_writes", "get_tuple", "list")


def workload_ops(ctx: Context) -> Table:
    sz = ctx.sizes
    keys = cells(ctx.entries)
    errors: dict[tuple[SaverEntry, str], str] = {}

    def once(key: tuple[SaverEntry, str]) -> dict[str, float]:
        entry, mode = key
        with session(entry, mode, ctx.env) as s:
            tid = f"ops-{uuid.uuid4().hex[:8]}"
            clock = run_flow(s, lambda saver: raw_ops(saver, tid, sz.ops), sz.cell_budget)
        return {label: len(times) / sum(times) for label, times in clock.items()}

    results = interleaved(sz.rounds, keys, once, errors)
    rate = {k: {label: median([r[label] for r in rs]) for label in OP_LABELS} if rs else {}
            for k, rs in results.items()}
    table = Table(
        f"(b) Raw saver operations: {sz.ops} x (put with 2 new channel values + put_writes of 2 "
        "+ latest get_tuple + list(limit=10)) on one thread — ops/s (higher is better)",
        ["saver", "mode", "put/s", "put_writes/s", "get_tuple/s", "list(10)/s",
         "put ratio vs reference", "target (put)"],
    )
    for entry, mode in keys:
        if (entry, mode) in errors:
            table.rows.append([entry.label(mode), mode, f"error: {errors[entry, mode]}"])
            continue
        ref = reference(ctx, entry)
        mine = rate[entry, mode]
        r = (ratio(mine["put"], rate.get((ref, mode), {}).get("put"))
             if ref and ref is not entry else None)
        tcell = ""
        if entry.ours and entry.family == "sqlite" and ref is not None:
            tcell = verdict(None if r is None else r >= 1.0, f"≥1.0x {ref.label(mode)}")
        table.rows.append([entry.label(mode), mode, *(fmt(mine[label]) for label in OP_LABELS),
                           fmt_ratio(r, ref_label(ref, mode)) if r is not None else "", tcell])
    table.rows += ctx.skipped_rows(8)
    table.notes.append(f"{sz.rounds} interleaved rounds on fresh storage; each op timed alone, "
                       "ops/s = calls / time spent in that call. A saver still running after "
                       f"{sz.cell_budget:g} s stops early (its rate is over the calls it made).")
    return table


# -- (c) history length -----------------------------------------------------------------------------


def fill(s: Session, thread_id: str, count: int, budget: float = float("inf")) -> None:
    """Put ``count`` checkpoints on one thread; raise if that takes longer than ``budget`` s."""
    clock = run_flow(s, lambda saver: raw_ops(saver, thread_id, count, writes=False, reads=False),
                     budget)
    done = len(clock.get("put", []))
    if done < count:
        spent = sum(clock["put"])
        raise TimeoutError(f"not measured: filling {count:,} checkpoints would take "
                           f"~{spent * count / done:.0f} s ({done:,} in {spent:.0f} s)")


def request_counter(entry: SaverEntry) -> Counter | None:
    return {"redis": REDIS_TRIPS, "s3": S3_REQUESTS}.get(entry.family)


def count_requests(counter: Counter, call: Callable[[], Any]) -> tuple[int, dict[str, int]]:
    counter.reset()
    call()
    snap = counter.snapshot()
    return sum(snap.values()), dict(snap)


def fmt_requests(total: int, kinds: dict[str, int]) -> str:
    if set(kinds) <= {"sync", "async"}:
        return str(total)
    return f"{total} ({', '.join(f'{k} {v}' for k, v in sorted(kinds.items()))})"


def workload_history(ctx: Context) -> Table:
    sz = ctx.sizes
    small, big = 10, sz.history
    entries = list(ctx.entries)
    sessions: dict[SaverEntry, Session] = {}
    errors: dict[SaverEntry, str] = {}
    expected: dict[tuple[SaverEntry, str], str] = {}
    for entry in entries:
        try:
            s = Session(entry, primary_mode(entry), ctx.env)
            sessions[entry] = s
            for tid, n in (("small", small), ("big", big)):
                fill(s, tid, n, sz.fill_budget)
                expected[entry, tid] = read_latest(s, tid).checkpoint["id"]
        except Exception as exc:
            errors[entry] = short_error(exc)
            traceback.print_exc()

    def once(entry: SaverEntry) -> dict[str, float]:
        s = sessions[entry]
        out: dict[str, float] = {}
        for tid in ("small", "big"):
            latest = read_latest(s, tid)
            if latest.checkpoint["id"] != expected[entry, tid]:
                raise AssertionError(f"get_tuple returned {latest.checkpoint['id']}, not the latest")
            out[f"get_{tid}"] = median(timed_samples(lambda: read_latest(s, tid), sz.samples, sz.budget))
            out[f"list_{tid}"] = median(timed_samples(lambda: read_list(s, tid), sz.samples, sz.budget))
        return out

    results = interleaved(sz.rounds, [e for e in entries if e in sessions], once, errors)
    requests: dict[SaverEntry, dict[str, str]] = {}
    with counting_redis_round_trips():
        for entry, s in sessions.items():
            counter = request_counter(entry)
            if counter is None or entry in errors:
                continue
            requests[entry] = {
                f"{op}_{tid}": fmt_requests(*count_requests(counter, lambda: fn(s, tid)))
                for tid in ("small", "big")
                for op, fn in (("get", read_latest), ("list", read_list))
            }
    for s in sessions.values():
        s.close()

    table = Table(
        f"(c) History length: one thread with {small} vs {big:,} checkpoints — "
        "latest get_tuple and list(limit=10), median time (lower is better)",
        ["saver", "mode", f"get_tuple @{small}", f"get_tuple @{big:,}", "ratio", "target",
         f"list(10) @{small}", f"list(10) @{big:,}", "ratio",
         f"requests get_tuple @{small} / @{big:,}", f"requests list(10) @{small} / @{big:,}"],
    )
    for entry in entries:
        mode = primary_mode(entry)
        if entry in errors:
            table.rows.append([entry.label(mode), mode, f"error: {errors[entry]}"])
            continue
        m = {k: median([r[k] for r in results[entry]]) for k in results[entry][0]}
        g_ratio, l_ratio = ratio(m["get_big"], m["get_small"]), ratio(m["list_big"], m["list_small"])
        req = requests.get(entry, {})
        if not entry.ours:
            target = ""
        elif entry.family == "s3":  # issue 4 counts requests; moto's LIST time grows with the bucket
            target = verdict(req["get_small"] == req["get_big"] if req else None, "same requests")
        else:
            target = verdict(None if g_ratio is None else g_ratio <= 1.5, "≤1.5x")
        table.rows.append([
            entry.label(mode), mode, fmt_time(m["get_small"]), fmt_time(m["get_big"]),
            fmt_ratio(g_ratio), target, fmt_time(m["list_small"]), fmt_time(m["list_big"]),
            fmt_ratio(l_ratio),
            f"{req['get_small']} / {req['get_big']}" if req else "",
            f"{req['list_small']} / {req['list_big']}" if req else "",
        ])
    table.rows += ctx.skipped_rows(11)
    table.notes.append(
        f"Each saver is filled once (checkpoints with 2 changed channels each), then {sz.rounds} "
        f"interleaved rounds of up to {sz.samples} timed calls per cell. Mode: sync where the "
        "saver has it. The latest checkpoint returned is checked against the last one put.")
    return table


# -- (d) bytes at rest ------------------------------------------------------------------------------


def workload_footprint(ctx: Context) -> Table:
    sz = ctx.sizes
    sizes: dict[SaverEntry, int | None] = {}
    errors: dict[SaverEntry, str] = {}
    for entry in ctx.entries:
        try:
            with session(entry, primary_mode(entry), ctx.env) as s:
                graph = big_graph(s.saver, sz.footprint_steps)
                run_graph(s, graph, [({"big": "", "counter": 0},
                                      run_config("footprint", sz.footprint_steps + 2))])
                sizes[entry] = s.opened.footprint() if s.opened.footprint else None
        except Exception as exc:
            errors[entry] = short_error(exc)
            traceback.print_exc()
    sqlite_ref = next((e for e in ctx.entries if e.name == REFERENCE["sqlite"]), None)
    table = Table(
        f"(d) Bytes at rest: a 50 KB channel written once + a counter changing every step, "
        f"{sz.footprint_steps} steps (lower is better)",
        ["saver", "mode", "bytes", "what is measured", "ratio vs SqliteSaver",
         "ratio vs reference", "target"],
    )
    what = {"sqlite": "file + WAL after checkpoint", "memory": "serialized bytes held",
            "redis": "MEMORY USAGE of its keys", "s3": "sum of object sizes"}
    for entry in ctx.entries:
        mode = primary_mode(entry)
        if entry in errors:
            table.rows.append([entry.label(mode), mode, f"error: {errors[entry]}"])
            continue
        r_sqlite = ratio(sizes[entry], sizes.get(sqlite_ref)) if sqlite_ref else None
        ref = reference(ctx, entry)
        r_ref = ratio(sizes[entry], sizes.get(ref)) if ref and ref is not entry else None
        target = ""
        if entry.ours and entry.family == "sqlite":
            target = verdict(None if r_sqlite is None else r_sqlite <= 0.25, "≤0.25x SqliteSaver")
        table.rows.append([
            entry.label(mode), mode, fmt(sizes[entry]), what[entry.family],
            fmt_ratio(r_sqlite), fmt_ratio(r_ref, ref_label(ref, mode)) if r_ref is not None else "",
            target,
        ])
    table.rows += ctx.skipped_rows(7)
    table.notes.append("One run per saver (sizes are deterministic). Redis sizes are server memory, "
                       "not disk; memory savers count the serialized bytes they hold.")
    return table


# -- (e) requests per operation ------------------------------------------------------------------------


def workload_requests(ctx: Context) -> Table:
    sz = ctx.sizes
    entries = ctx.of(("redis", "s3"))
    measured: dict[SaverEntry, dict[str, tuple[int, dict[str, int]]]] = {}
    errors: dict[SaverEntry, str] = {}

    class Probe:
        """Each op of one raw_ops checkpoint, counted separately; between put and
        put_writes, also the latest get_tuple while the checkpoint has no pending writes."""

        def __init__(self, s: Session, counter: Counter) -> None:
            self.s, self.counter = s, counter
            self.counts: dict[str, tuple[int, dict[str, int]]] = {}

        def counted(self, op: Op) -> Flow:
            self.counter.reset()
            result = yield op
            snap = self.counter.snapshot()
            self.counts[op.label] = (sum(snap.values()), dict(snap))
            return result

        def flow(self, saver: Any) -> Flow:
            inner = raw_ops(saver, "req", 1, blobs=True)
            try:
                op = next(inner)
                while True:
                    if op.label == "put_writes":
                        yield from self.counted(Op("get_tuple_bare", "get_tuple", (thread_config("req"),)))
                    op = inner.send((yield from self.counted(op)))
            except StopIteration:
                pass

    with counting_redis_round_trips():
        for entry in entries:
            counter = request_counter(entry)
            assert counter is not None
            try:
                with session(entry, primary_mode(entry), ctx.env) as s:
                    fill(s, "req", 3)  # warm connections; the probe writes the 4th checkpoint
                    probe = Probe(s, counter)
                    run_flow(s, probe.flow)
                    graph = growing_graph(s.saver, sz.requests_graph_steps)
                    counter.reset()
                    run_graph(s, graph, [({"log": "", "step": 0},
                                          run_config("req-graph", sz.requests_graph_steps))])
                    snap = counter.snapshot()
                    probe.counts["graph"] = (sum(snap.values()), dict(snap))
                    measured[entry] = probe.counts
            except Exception as exc:
                errors[entry] = short_error(exc)
                traceback.print_exc()

    steps = sz.requests_graph_steps
    per_step = {e: c["graph"][0] / steps for e, c in measured.items()}
    table = Table(
        "(e) Requests per operation: Redis round trips (client-side) / S3 HTTP requests "
        "(server-side), one op on a thread with 3 checkpoints (lower is better)",
        ["saver", "mode", "put (2 new blobs)", "latest get_tuple, no writes yet", "put_writes (2)",
         "latest get_tuple", "list(10)",
         f"per graph step ({steps}-step run)", "targets"],
    )
    for entry in entries:
        mode = primary_mode(entry)
        if entry in errors:
            table.rows.append([entry.label(mode), mode, f"error: {errors[entry]}"])
            continue
        c = measured[entry]
        targets: list[str] = []
        if entry.ours and entry.family == "redis":
            targets.append(verdict(c["put"][0] <= 1, "put ≤1 trip"))
            targets.append(verdict(max(c["get_tuple"][0], c["get_tuple_bare"][0]) <= 2, "get_tuple ≤2 trips"))
        if entry.ours and entry.family == "s3":
            kinds = c["put"][1]
            targets.append(verdict(kinds.get("PUT", 0) <= 3 and not kinds.get("LIST"),
                                   "put ≤3 PUT (2 blobs + 1), no LIST"))
            targets.append(verdict(c["get_tuple_bare"][0] <= 2 + 2, "get_tuple ≤2 + 2 blob GETs"))
            anchors = [per_step[e] for e in measured if e.family == "s3" and not e.ours]
            targets.append(verdict(all(per_step[entry] < a for a in anchors) if anchors else None,
                                   "fewer per step than every anchor"))
        table.rows.append([
            entry.label(mode), mode,
            *(fmt_requests(*c[label]) for label in ("put", "get_tuple_bare", *OP_LABELS[1:])),
            f"{per_step[entry]:.2f}", "; ".join(targets),
        ])
    table.rows += ctx.skipped_rows(9, ("redis", "s3"))
    table.notes.append("The latest get_tuple of a checkpoint with pending writes also reads its writes "
                       "records: one per put_writes call (S3: one GET each, found by the same LIST).")
    table.notes.append("Redis: one request written = one round trip (a pipeline or MULTI/EXEC is one). "
                       "S3: counted by a middleware in the moto server, LIST = bucket listing. "
                       "The history-length requests (latest get_tuple at 10 vs N) are in table (c).")
    return table


# -- (f) Agent Framework -----------------------------------------------------------------------------


def make_workflow_checkpoint(i: int, previous: str | None) -> Any:
    """Checkpoint ``i`` of the benchmark workflow: the same shape and size (~640 bytes) at every ``i``."""
    from agent_framework import WorkflowCheckpoint

    return WorkflowCheckpoint(
        workflow_name="bench-workflow",
        graph_signature_hash="sig-0123456789abcdef",
        previous_checkpoint_id=previous,
        state={"counter": i, "notes": CHUNK[:256]},
        iteration_count=i,
    )


AF_OPS = ("save", "load", "get_latest", "list_checkpoint_ids")
AF_WORKFLOW = "bench-workflow"


def af_requests(storage: Any, call: Callable[[], Awaitable[Any]]) -> dict[str, int] | None:
    """S3 requests one ``call`` sends, by operation, read from our S3 backend's own counter."""
    backend = getattr(storage, "backend", None)
    if getattr(backend, "kind", None) != "s3":
        return None
    backend.reset_counters()
    loop().run(call())
    return dict(backend.requests)


def workload_agent_framework(ctx: Context) -> Table:
    """(f): one storage per (storage kind, size), grown once, then every size measured in the same rounds.

    Each size has its own store (a fresh file, bucket or Redis database, and
    for ours a user per size), so the sizes are measured side by side in each
    interleaved round instead of one after the other: drift of the process or
    the machine during the run lands on every size alike. An operation whose
    one call would take longer than ``slow_call`` at a size is not measured
    there (that cell says so); the other operations of that storage still are.
    """
    sz = ctx.sizes
    lp = loop()
    stack = contextlib.AsyncExitStack()
    errors: dict[StorageEntry, str] = {}
    stores: dict[tuple[StorageEntry, int], Any] = {}
    ids: dict[tuple[StorageEntry, int], list[str]] = {}
    saves: dict[tuple[StorageEntry, int], float | None] = {}
    skipped: dict[tuple[StorageEntry, str], str] = {}  # (storage, op) -> why larger sizes are not measured
    skip_from: dict[tuple[StorageEntry, str], int] = {}  # (storage, op) -> first size not measured
    requests: dict[tuple[StorageEntry, int], dict[str, dict[str, int] | None]] = {}
    started = time.perf_counter()

    async def grow(key: tuple[StorageEntry, int]) -> float | None:
        """Save ``n`` checkpoints into the store of ``key``; median time of the last saves."""
        storage, have, n = stores[key], ids[key], key[1]
        times: list[float] = []
        while len(have) < n:
            cp = make_workflow_checkpoint(len(have), have[-1] if have else None)
            t = time.perf_counter()
            await storage.save(cp)
            times.append(time.perf_counter() - t)
            have.append(cp.checkpoint_id)
            if len(times) == 20 and median(times) * n > sz.fill_budget:
                raise TimeoutError(f"filling {n:,} checkpoints would take ~{median(times) * n:.0f} s")
        return median(times[-sz.samples * 4:])

    def calls(key: tuple[StorageEntry, int]) -> dict[str, Callable[[], Awaitable[Any]]]:
        storage, have = stores[key], ids[key]
        rng = random.Random(len(have))
        return {
            "load": lambda: storage.load(rng.choice(have)),
            "get_latest": lambda: storage.get_latest(workflow_name=AF_WORKFLOW),
            "list_checkpoint_ids": lambda: storage.list_checkpoint_ids(workflow_name=AF_WORKFLOW),
        }

    async def measure(key: tuple[StorageEntry, int]) -> dict[str, float | None]:
        storage, have = stores[key], ids[key]
        latest = await storage.get_latest(workflow_name=AF_WORKFLOW)
        if latest is None or latest.checkpoint_id != have[-1]:
            raise AssertionError("get_latest did not return the last saved checkpoint")
        return {op: median(await atimed_samples(call, sz.samples, sz.budget))
                for op, call in calls(key).items() if not measured_elsewhere(key, op)}

    def measured_elsewhere(key: tuple[StorageEntry, int], op: str) -> bool:
        """Whether ``op`` is too slow to measure at this size (decided by :func:`probe`)."""
        first = skip_from.get((key[0], op))
        return first is not None and key[1] >= first

    def probe(entry: StorageEntry) -> None:
        """Time one call of each read at each size, smallest first, and mark the slow ones.

        An operation is left out at a size (and every larger one) when one call
        there is expected, scaling linearly from the size below, to take longer
        than ``slow_call``: only that operation, never the storage's whole column.
        """
        previous: dict[str, tuple[int, float]] = {}
        for n in sz.agent_sizes:
            key = (entry, n)
            if key not in stores:
                continue
            for op, call in calls(key).items():
                if (entry, op) in skip_from:
                    continue
                if op in previous:
                    m, took = previous[op]
                    expected = took * n / m
                    if expected > sz.slow_call:
                        skip_from[entry, op] = n
                        skipped[entry, op] = (f"one call took {fmt_time(took)} at {m:,}, "
                                              f"~{fmt_time(expected)} expected at {n:,}")
                        continue
                t = time.perf_counter()
                lp.run(call())
                previous[op] = (n, time.perf_counter() - t)

    for entry in ctx.storages:
        for n in sz.agent_sizes:
            key = (entry, n)
            try:
                storage = lp.run(stack.enter_async_context(entry.open(ctx.env)))
                if entry.ours:  # a user of its own per size, whatever the backend shares
                    storage = storage.for_user(f"bench-{n}")
                stores[key], ids[key] = storage, []
                saves[key] = lp.run(grow(key))
            except TimeoutError as exc:
                stores.pop(key, None)
                skipped.setdefault((entry, "save"), f"not measured at {n:,}: {exc}")
                skip_from.setdefault((entry, "save"), n)
                break  # larger sizes would take longer still
            except Exception as exc:
                errors[entry] = short_error(exc)
                traceback.print_exc()
                break
        if entry not in errors:
            try:
                probe(entry)
            except Exception as exc:
                errors[entry] = short_error(exc)
                traceback.print_exc()
    keys = [k for k in stores if k[0] not in errors]
    failed: dict[tuple[StorageEntry, int], str] = {}
    results = interleaved(sz.rounds, keys, lambda k: lp.run(measure(k)), failed)
    for (entry, n), why in failed.items():
        errors.setdefault(entry, f"@{n:,}: {why}")
    at: dict[tuple[StorageEntry, int], dict[str, float | None]] = {}
    for key, rs in results.items():
        if rs and key not in failed:
            at[key] = {"save": saves.get(key), **{op: median([r[op] for r in rs]) for op in rs[0]}}
            if key[0].ours and key[0].family == "s3":
                requests[key] = {op: af_requests(stores[key], call) for op, call in calls(key).items()
                                 if op != "load" and not measured_elsewhere(key, op)}
    lp.run(stack.aclose())
    elapsed = time.perf_counter() - started

    first, last = sz.agent_sizes[0], sz.agent_sizes[-1]
    file_entry = next((e for e in ctx.storages if e.name == "FileCheckpointStorage"), None)
    table = Table(
        "(f) Agent Framework CheckpointStorage: median time per call at "
        f"{', '.join(f'{n:,}' for n in sz.agent_sizes)} checkpoints of one workflow (lower is better)",
        ["storage", *(f"{op} @{n:,}" for op in AF_OPS for n in sz.agent_sizes),
         f"get_latest {last:,}/{first:,}", "target", f"get_latest speed-up vs File @{last:,}",
         "target"],
    )
    for entry in ctx.storages:
        if entry in errors:
            table.rows.append([entry.name, f"error: {errors[entry]}"])
            continue
        if entry not in {k[0] for k in stores} and (entry, "save") not in skipped:
            continue  # skipped as unavailable: listed below
        cells_ = []
        for op in AF_OPS:
            for n in sz.agent_sizes:
                value = at.get((entry, n), {}).get(op)
                first_skipped = skip_from.get((entry, op))
                if value is None and first_skipped is not None and n >= first_skipped:
                    cells_.append("too slow")
                else:
                    cells_.append(fmt_time(value))
        get = {n: at.get((entry, n), {}).get("get_latest") for n in sz.agent_sizes}
        growth = ratio(get[last], get[first])
        speedup = (ratio(at.get((file_entry, last), {}).get("get_latest"), get[last])
                   if file_entry is not None and entry is not file_entry else None)
        table.rows.append([
            entry.name, *cells_, fmt_ratio(growth),
            verdict(None if growth is None else growth <= 1.5, "≤1.5x") if entry.ours else "",
            fmt_ratio(speedup),
            verdict(None if speedup is None else speedup >= 100, "≥100x") if entry.ours else ""])
    for (entry, op), why in skipped.items():
        table.notes.append(f"{entry.name}: {op} too slow at larger sizes, not measured there: {why}.")
    width = len(table.headers)
    table.rows += [[e.name, reason] + [""] * (width - 2) for e, reason in ctx.skipped_storages]
    for (entry, n), per_op in sorted(requests.items(), key=lambda kv: kv[0][1]):
        shown = "; ".join(f"{op} {sum(c.values())} ({', '.join(f'{k} {v}' for k, v in sorted(c.items()))})"
                          for op, c in per_op.items() if c)
        if shown:
            table.notes.append(f"{entry.name} @{n:,}: S3 requests per call: {shown}.")
    table.notes += [
        f"Each size has its own store, grown once; save = median of the last saves while growing it. "
        f"load/get_latest/list_checkpoint_ids: {sz.rounds} interleaved rounds over every (storage, size) "
        f"of up to {sz.samples} calls, so drift during the run falls on all sizes alike. Every checkpoint "
        "has the same shape and size (~640 bytes encoded) whatever its position, so sizes compare like "
        "with like. get_latest is checked to return the last saved checkpoint.",
        "SQLite get_latest is one query: a seek in the (pkey, k, v, seq) tag index read backwards, "
        "LIMIT 1, plus one primary-key lookup of the record (EXPLAIN QUERY PLAN: `SEARCH t USING COVERING "
        "INDEX tags_seq`, `SEARCH r USING INDEX sqlite_autoindex_records_1`); no sort, no scan.",
        "S3: get_latest is one LIST of the workflow's tag index (newest first) plus one GET, at every "
        "size (request counts above). moto's ListObjectsV2 filters and sorts every key of the bucket "
        "on each call, so S3 time under moto grows with the number of objects where AWS S3's does not: "
        "load (one GET) stays flat, get_latest minus load is that LIST. With one moto request costing "
        "milliseconds, ≥100x faster than a local-disk FileCheckpointStorage is out of reach for S3 here. "
        "list_checkpoint_ids costs one GET per checkpoint on S3: an index entry is written before its "
        "record, so an entry alone may name a checkpoint that was never written (a crash in between), "
        "was deleted or rewritten; only the record's own header (its seq) proves it, and S3 has no "
        "multi-object read.",
        f"(f) took {elapsed:.0f} s.",
    ]
    return table


#: workload letter -> (name, function)
WORKLOADS: dict[str, tuple[str, Callable[[Context], Table]]] = {
    "a": ("graph", workload_graph),
    "b": ("ops", workload_ops),
    "c": ("history", workload_history),
    "d": ("footprint", workload_footprint),
    "e": ("requests", workload_requests),
    "f": ("agent-framework", workload_agent_framework),
}
