"""What every workload shares: sizes, tables and measures, the event loop, sessions,
interleaved rounds, progress, and saver-call scripts driven by checkpointers' own core.

A workload script is a generator that yields :class:`SaverCall` objects and
receives each one's :class:`Timed` result. It is driven by
:func:`checkpointers._flows.run` (sync) or :func:`checkpointers._flows.arun`
(async), the same driver as the library's backend flows: a ``SaverCall`` has
the ``call`` / ``acall`` pair those drivers invoke, with the saver in the
backend's place. So a script is written once for both faces, as the library's
flows are.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import sys
import threading
import time
import traceback
from collections.abc import Awaitable, Callable, Generator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from checkpointers._flows import arun, run

from .savers import REFERENCE, Env, Opened, SaverEntry, StorageEntry

__all__ = [
    "MODES",
    "Context",
    "Measure",
    "SaverCall",
    "Session",
    "Sizes",
    "Table",
    "Timed",
    "drive",
    "interleaved",
    "loop",
    "timed",
]

T = TypeVar("T")
MODES = ("sync", "async")


# -- sizes -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Sizes:
    """How big each workload is. :meth:`quick` runs every workload in seconds to a minute."""

    rounds: int = 3
    graph_threads: int = 20
    graph_steps: int = 25
    #: (b) puts (each with its put_writes) per round per saver, on a fresh thread
    ops: int = 50
    #: (b) puts per round onto the long thread (the put @history rows)
    deep_ops: int = 10
    #: (b)/(c) the short thread, the whole-thread list, the long thread
    small: int = 10
    whole: int = 100
    history: int = 5_000
    samples: int = 15
    footprint_steps: int = 200
    #: (d) puts of the 3 x 1 KB shape whose bytes at rest are divided per put
    shape_puts: int = 200
    #: (g) the concurrency shape: threads x puts
    conc_threads: int = 20
    conc_puts: int = 100
    #: (h) calls per round of our put, the anchor's put and the floor
    floor_ops: int = 50
    requests_graph_steps: int = 25
    agent_sizes: tuple[int, ...] = (100, 1_000, 5_000)
    #: seconds one timed cell of (b)/(c)/(f) may take before it stops sampling
    budget: float = 3.0
    #: seconds one (a)/(g) cell may run before it stops (its rate stays valid)
    cell_budget: float = 4.0
    #: (f) skips a size where one call is expected to take longer than this
    slow_call: float = 5.0
    #: (b)/(c)/(f) give up on a saver that cannot put its history within this many seconds
    #: (S3's sync face on moto needs ~100-200 s for 5,000)
    fill_budget: float = 250.0

    @classmethod
    def quick(cls) -> Sizes:
        return cls(
            rounds=2, graph_threads=2, graph_steps=10, ops=10, deep_ops=3, small=10, whole=20,
            history=200, samples=5, footprint_steps=40, shape_puts=30, conc_threads=4, conc_puts=10,
            floor_ops=10, requests_graph_steps=5, agent_sizes=(10, 50, 150), budget=0.3,
            cell_budget=0.5, slow_call=0.5, fill_budget=15.0,
        )  # fmt: skip


# -- tables and measures -------------------------------------------------------------------


@dataclass(frozen=True)
class Measure:
    """One number of one saver in one mode: what the JSON output and the chart are made of."""

    workload: str
    metric: str
    family: str
    saver: str  #: the entry's name (stable), e.g. ``ours: sqlite``
    label: str  #: the class shown, e.g. ``SqliteSaver``
    ours: bool
    mode: str
    value: float
    unit: str  #: ``s``, ``ops/s``, ``steps/s``, ``bytes``, ``requests``
    higher_is_better: bool = False


@dataclass
class Table:
    """One markdown table with a title and notes, and the measures behind it."""

    title: str
    headers: list[str]
    rows: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    measures: list[Measure] = field(default_factory=list)

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

    def measure(self, workload: str, entry: SaverEntry, mode: str, metric: str, value: float | None,
                unit: str = "s") -> None:
        """Record ``value`` (skipped when None); rates (``/s`` units) are higher-is-better."""
        if value is not None:
            self.measures.append(Measure(workload, metric, entry.family, entry.name, entry.label(mode),
                                         entry.ours, mode, float(value), unit, unit.endswith("/s")))


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


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "—"
    return f"{n / 1024:.1f} KiB" if n >= 1024 else f"{n:.0f} B"


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


def report_error(errors: dict[Any, str], key: Any, exc: BaseException) -> None:
    """Record why ``key`` failed (its row says so) and print the traceback to stderr."""
    errors[key] = short_error(exc)
    traceback.print_exc()


# -- progress --------------------------------------------------------------------------------


class Progress:
    """One line per saver while a workload runs (a rich progress bar on a terminal)."""

    def __init__(self) -> None:
        from rich.console import Console

        self.console = Console(stderr=True)
        self._bar: Any = None
        self._task: Any = None

    @contextlib.contextmanager
    def workload(self, name: str, total: int | None = None) -> Iterator[None]:
        from rich.progress import Progress as Bar

        self.name = name
        if not self.console.is_terminal:
            yield
            return
        with Bar(console=self.console, transient=True) as bar:
            self._bar, self._task = bar, bar.add_task(name, total=total)
            try:
                yield
            finally:
                self._bar = self._task = None

    def saver(self, label: str, mode: str = "", what: str = "") -> None:
        """The saver now running (a new line, or the bar's description on a terminal)."""
        text = f"{getattr(self, 'name', '')}: {label}" + (f" ({mode})" if mode else "") + (
            f" {what}" if what else "")
        if self._bar is None:
            self.console.print(f"[bench] {text}", markup=False, highlight=False)
        else:
            self._bar.update(self._task, description=text, advance=1)


PROGRESS = Progress()


# -- running sync and async savers --------------------------------------------------------------


class BackgroundLoop:
    """One event loop for the whole run, in its own thread.

    Async savers are loop-bound (aiosqlite, redis.asyncio, psycopg), so every
    async call of the run goes through this one loop, while sync calls stay on
    the main thread. Async timings are taken inside the coroutines, so the hop
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


def close_loop() -> None:
    global LOOP
    if LOOP is not None:
        LOOP.close()
        LOOP = None


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
def session(entry: SaverEntry, mode: str, env: Env) -> Iterator[Session]:
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


def _key_label(key: Any) -> tuple[str, str]:
    if isinstance(key, tuple) and key and isinstance(key[0], (SaverEntry, StorageEntry)):
        entry = key[0]
        second = str(key[1]) if len(key) > 1 else ""
        return (entry.label(second) if isinstance(entry, SaverEntry) else entry.name), second
    if isinstance(key, SaverEntry):
        return key.label(primary_mode(key)), ""
    return str(key), ""


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
            label, mode = _key_label(key)
            PROGRESS.saver(label, mode, f"round {r + 1}/{rounds}")
            try:
                results[key].append(once(key))
            except Exception as exc:  # a saver failing must not stop the others
                report_error(errors, key, exc)
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


# -- saver-call scripts, driven by checkpointers' run / arun ---------------------------------------


@dataclass(frozen=True)
class Timed:
    """What a :class:`SaverCall` returns to its script: the saver's result and the call's seconds."""

    result: Any
    seconds: float


@dataclass(frozen=True)
class SaverCall:
    """One saver call a script yields: ``label`` for timing, ``method`` (sync name), arguments.

    ``call`` / ``acall`` are what :func:`checkpointers._flows.run` / ``arun``
    invoke on a yielded operation, here with a saver where a backend would be;
    ``list`` / ``alist`` are drained into a list inside the timed span.
    """

    label: str
    method: str
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    def call(self, saver: Any) -> Timed:
        t = time.perf_counter()
        result = getattr(saver, self.method)(*self.args, **self.kwargs)
        if self.method == "list":
            result = list(result)
        return Timed(result, time.perf_counter() - t)

    async def acall(self, saver: Any) -> Timed:
        t = time.perf_counter()
        if self.method == "list":
            result: Any = [x async for x in saver.alist(*self.args, **self.kwargs)]
        else:
            result = await getattr(saver, "a" + self.method)(*self.args, **self.kwargs)
        return Timed(result, time.perf_counter() - t)


Script = Generator[SaverCall, Timed, T]
Clock = dict[str, list[float]]


def timed(clock: Clock | None, op: SaverCall) -> Script[Any]:
    """``result = yield from timed(clock, op)``: the call's seconds go into ``clock[op.label]``."""
    done = yield op
    if clock is not None:
        clock.setdefault(op.label, []).append(done.seconds)
    return done.result


def drive(s: Session, script: Callable[[Any], Script[T]]) -> T:
    """Run ``script(saver)`` in the session's mode through checkpointers' ``run`` / ``arun``."""

    def work(saver: Any) -> T:
        return run(cast(Any, script(saver)), saver)

    async def awork(saver: Any) -> T:
        return await arun(cast(Any, script(saver)), saver)

    return s.call(work, awork)


# -- what every workload gets -----------------------------------------------------------------------


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

    def reference(self, entry: SaverEntry) -> SaverEntry | None:
        """The reference anchor of ``entry``'s family, when it runs here."""
        name = REFERENCE.get(entry.family)
        return next((e for e in self.entries if e.name == name), None)


def ref_label(ref: SaverEntry | None, mode: str) -> str:
    return f"vs {ref.label(mode)}" if ref is not None else ""


def log(text: str) -> None:
    print(f"[bench] {text}", file=sys.stderr, flush=True)
