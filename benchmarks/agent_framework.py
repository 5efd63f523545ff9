"""(f) Agent Framework ``CheckpointStorage``: save, load, get_latest, list_checkpoint_ids at 3 sizes.

One storage per (storage kind, size), grown once, then every size measured in
the same interleaved rounds: each size has its own store (a fresh file,
bucket or Redis database, and for ours a user per size), so drift of the
process or the machine lands on every size alike. An operation whose one
call would take longer than ``slow_call`` at a size is not measured there
(that cell says so); the other operations of that storage still are.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from .harness import (
    PROGRESS,
    Context,
    Table,
    atimed_samples,
    fmt_ratio,
    fmt_time,
    interleaved,
    loop,
    median,
    ratio,
    report_error,
    verdict,
)
from .savers import StorageEntry
from .shape import CHUNK

__all__ = ["workload_agent_framework"]

AF_OPS = ("save", "load", "get_latest", "list_checkpoint_ids")
AF_WORKFLOW = "bench-workflow"
Key = tuple[StorageEntry, int]


def make_workflow_checkpoint(i: int, previous: str | None) -> Any:
    """Checkpoint ``i`` of the benchmark workflow: the same shape and size (~640 bytes) at every ``i``."""
    from agent_framework import WorkflowCheckpoint

    return WorkflowCheckpoint(
        workflow_name=AF_WORKFLOW,
        graph_signature_hash="sig-0123456789abcdef",
        previous_checkpoint_id=previous,
        state={"counter": i, "notes": CHUNK[:256]},
        iteration_count=i,
    )


def af_requests(storage: Any, call: Callable[[], Awaitable[Any]]) -> dict[str, int] | None:
    """S3 requests one ``call`` sends, by operation, read from our S3 backend's own counter."""
    backend = getattr(storage, "backend", None)
    if getattr(backend, "kind", None) != "s3":
        return None
    backend.reset_counters()
    loop().run(call())
    return dict(backend.requests)


@dataclass
class AgentRun:
    """The stores of (f) and what was measured on them."""

    ctx: Context
    stack: contextlib.AsyncExitStack = field(default_factory=contextlib.AsyncExitStack)
    errors: dict[StorageEntry, str] = field(default_factory=dict)
    stores: dict[Key, Any] = field(default_factory=dict)
    ids: dict[Key, list[str]] = field(default_factory=dict)
    saves: dict[Key, float | None] = field(default_factory=dict)
    #: (storage, op) -> why larger sizes are not measured, and the first size not measured
    skipped: dict[tuple[StorageEntry, str], str] = field(default_factory=dict)
    skip_from: dict[tuple[StorageEntry, str], int] = field(default_factory=dict)
    at: dict[Key, dict[str, float | None]] = field(default_factory=dict)
    requests: dict[Key, dict[str, dict[str, int] | None]] = field(default_factory=dict)

    async def grow(self, key: Key) -> float | None:
        """Save ``n`` checkpoints into the store of ``key``; median time of the last saves."""
        sz = self.ctx.sizes
        storage, have, n = self.stores[key], self.ids[key], key[1]
        times: list[float] = []
        while len(have) < n:
            cp = make_workflow_checkpoint(len(have), have[-1] if have else None)
            t = time.perf_counter()
            await storage.save(cp)
            times.append(time.perf_counter() - t)
            have.append(cp.checkpoint_id)
            if len(times) == 20 and (median(times) or 0) * n > sz.fill_budget:
                raise TimeoutError(f"filling {n:,} checkpoints would take ~{(median(times) or 0) * n:.0f} s")
        return median(times[-sz.samples * 4:])

    def calls(self, key: Key) -> dict[str, Callable[[], Awaitable[Any]]]:
        storage, have = self.stores[key], self.ids[key]
        rng = random.Random(len(have))
        return {
            "load": lambda: storage.load(rng.choice(have)),
            "get_latest": lambda: storage.get_latest(workflow_name=AF_WORKFLOW),
            "list_checkpoint_ids": lambda: storage.list_checkpoint_ids(workflow_name=AF_WORKFLOW),
        }

    def too_slow(self, key: Key, op: str) -> bool:
        """Whether ``op`` is too slow to measure at this size (decided by :meth:`probe`)."""
        first = self.skip_from.get((key[0], op))
        return first is not None and key[1] >= first

    async def measure(self, key: Key) -> dict[str, float | None]:
        sz = self.ctx.sizes
        latest = await self.stores[key].get_latest(workflow_name=AF_WORKFLOW)
        if latest is None or latest.checkpoint_id != self.ids[key][-1]:
            raise AssertionError("get_latest did not return the last saved checkpoint")
        return {op: median(await atimed_samples(call, sz.samples, sz.budget))
                for op, call in self.calls(key).items() if not self.too_slow(key, op)}

    def probe(self, entry: StorageEntry) -> None:
        """Time one call of each read at each size, smallest first, and mark the slow ones.

        An operation is left out at a size (and every larger one) when one call
        there is expected, scaling linearly from the size below, to take longer
        than ``slow_call``: only that operation, never the storage's whole column.
        """
        previous: dict[str, tuple[int, float]] = {}
        for n in self.ctx.sizes.agent_sizes:
            if (entry, n) not in self.stores:
                continue
            for op, call in self.calls((entry, n)).items():
                if (entry, op) in self.skip_from:
                    continue
                if op in previous and self.projected_too_slow(entry, op, n, *previous[op]):
                    continue
                t = time.perf_counter()
                loop().run(call())
                previous[op] = (n, time.perf_counter() - t)

    def projected_too_slow(self, entry: StorageEntry, op: str, n: int, m: int, took: float) -> bool:
        expected = took * n / m
        if expected <= self.ctx.sizes.slow_call:
            return False
        self.skip_from[entry, op] = n
        self.skipped[entry, op] = f"one call took {fmt_time(took)} at {m:,}, ~{fmt_time(expected)} expected at {n:,}"
        return True

    def open_sizes(self, entry: StorageEntry) -> None:
        """A store per size, grown; stops at the first size too slow to fill."""
        for n in self.ctx.sizes.agent_sizes:
            key = (entry, n)
            PROGRESS.saver(entry.name, "", f"growing to {n:,}")
            try:
                storage = loop().run(self.stack.enter_async_context(entry.open(self.ctx.env)))
                if entry.ours:  # a user of its own per size, whatever the backend shares
                    storage = storage.for_user(f"bench-{n}")
                self.stores[key], self.ids[key] = storage, []
                self.saves[key] = loop().run(self.grow(key))
            except TimeoutError as exc:
                self.stores.pop(key, None)
                self.skipped.setdefault((entry, "save"), f"not measured at {n:,}: {exc}")
                self.skip_from.setdefault((entry, "save"), n)
                return  # larger sizes would take longer still
            except Exception as exc:
                report_error(self.errors, entry, exc)
                return

    def run(self) -> float:
        """Grow, probe and measure every storage; the seconds it took."""
        started = time.perf_counter()
        for entry in self.ctx.storages:
            self.open_sizes(entry)
            if entry not in self.errors:
                try:
                    self.probe(entry)
                except Exception as exc:
                    report_error(self.errors, entry, exc)
        keys = [k for k in self.stores if k[0] not in self.errors]
        failed: dict[Key, str] = {}
        results = interleaved(self.ctx.sizes.rounds, keys, lambda k: loop().run(self.measure(k)), failed)
        for (entry, n), why in failed.items():
            self.errors.setdefault(entry, f"@{n:,}: {why}")
        for key, rs in results.items():
            if rs and key not in failed:
                self.collect(key, rs)
        loop().run(self.stack.aclose())
        return time.perf_counter() - started

    def collect(self, key: Key, rs: list[dict[str, float | None]]) -> None:
        self.at[key] = {"save": self.saves.get(key),
                        **{op: median([r[op] for r in rs if r[op] is not None]) for op in rs[0]}}
        if key[0].ours and key[0].family == "s3":
            self.requests[key] = {op: af_requests(self.stores[key], call) for op, call in self.calls(key).items()
                                  if op != "load" and not self.too_slow(key, op)}


# -- the table -------------------------------------------------------------------------------------


def af_cells(got: AgentRun, entry: StorageEntry) -> list[str]:
    out = []
    for op in AF_OPS:
        for n in got.ctx.sizes.agent_sizes:
            value = got.at.get((entry, n), {}).get(op)
            first_skipped = got.skip_from.get((entry, op))
            out.append("too slow" if value is None and first_skipped is not None and n >= first_skipped
                       else fmt_time(value))
    return out


def af_row(got: AgentRun, entry: StorageEntry, file_entry: StorageEntry | None) -> list[str]:
    sizes = got.ctx.sizes.agent_sizes
    first, last = sizes[0], sizes[-1]
    get = {n: got.at.get((entry, n), {}).get("get_latest") for n in sizes}
    growth = ratio(get[last], get[first])
    speedup = (ratio(got.at.get((file_entry, last), {}).get("get_latest"), get[last])
               if file_entry is not None and entry is not file_entry else None)
    return [entry.name, *af_cells(got, entry), fmt_ratio(growth),
            verdict(None if growth is None else growth <= 1.5, "≤1.5x") if entry.ours else "",
            fmt_ratio(speedup),
            verdict(None if speedup is None else speedup >= 100, "≥100x") if entry.ours else ""]


def af_notes(got: AgentRun, elapsed: float) -> list[str]:
    sz = got.ctx.sizes
    notes = [f"{e.name}: {op} too slow at larger sizes, not measured there: {why}."
             for (e, op), why in got.skipped.items()]
    for (entry, n), per_op in sorted(got.requests.items(), key=lambda kv: kv[0][1]):
        shown = "; ".join(f"{op} {sum(c.values())} ({', '.join(f'{k} {v}' for k, v in sorted(c.items()))})"
                          for op, c in per_op.items() if c)
        if shown:
            notes.append(f"{entry.name} @{n:,}: S3 requests per call: {shown}.")
    return [*notes,
            f"Each size has its own store, grown once; save = median of the last saves while growing it. "
            f"load/get_latest/list_checkpoint_ids: {sz.rounds} interleaved rounds over every (storage, size) "
            f"of up to {sz.samples} calls. Every checkpoint has the same shape and size (~640 bytes encoded); "
            "get_latest is checked to return the last saved checkpoint.",
            "S3: get_latest is one LIST of the workflow's tag index (newest first) plus one GET at every "
            "size; moto's ListObjectsV2 filters and sorts every key of the bucket on each call, so S3 time "
            "under moto grows with the number of objects where AWS S3's does not. list_checkpoint_ids costs "
            "one GET per checkpoint on S3 (an index entry alone does not prove its record).",
            f"(f) took {elapsed:.0f} s."]


def workload_agent_framework(ctx: Context) -> list[Table]:
    got = AgentRun(ctx)
    elapsed = got.run()
    sizes = ctx.sizes.agent_sizes
    first, last = sizes[0], sizes[-1]
    file_entry = next((e for e in ctx.storages if e.name == "FileCheckpointStorage"), None)
    table = Table(
        "(f) Agent Framework CheckpointStorage: median time per call at "
        f"{', '.join(f'{n:,}' for n in sizes)} checkpoints of one workflow (lower is better)",
        ["storage", *(f"{op} @{n:,}" for op in AF_OPS for n in sizes),
         f"get_latest {last:,}/{first:,}", "target", f"get_latest speed-up vs File @{last:,}", "target"],
    )
    for entry in ctx.storages:
        if entry in got.errors:
            table.rows.append([entry.name, f"error: {got.errors[entry]}"])
        elif entry in {k[0] for k in got.stores} or (entry, "save") in got.skipped:
            table.rows.append(af_row(got, entry, file_entry))
    width = len(table.headers)
    table.rows += [[e.name, reason] + [""] * (width - 2) for e, reason in ctx.skipped_storages]
    table.notes += af_notes(got, elapsed)
    return [table]

