"""The benchmark runner still runs (no timing is asserted: numbers live in benchmarks/)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_quick_benchmark_runs_and_reports_our_savers(tmp_path: Path) -> None:
    out = tmp_path / "results.md"
    cmd = [sys.executable, "-m", "benchmarks.run", "--quick", "--only", "c,d",
           "--backends", "memory,sqlite", "--history", "50", "--out", str(out)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    text = out.read_text()
    for saver in ("ours: Checkpointer(memory)", "ours: Checkpointer(sqlite)", "SqliteSaver"):
        rows = [line for line in text.splitlines() if line.startswith(f"| {saver} |")]
        assert len(rows) == 2, (saver, rows)  # one row in (c), one in (d)
        assert not any("error:" in r or "not installed" in r for r in rows), rows
    # (d) bytes at rest: every saver reports a positive byte count.
    footprint = text.split("### (d)")[1]
    sizes = re.findall(r"^\| [^|]+ \| sync \| ([\d,]+)", footprint, flags=re.M)
    assert sizes and all(int(s.replace(",", "")) > 0 for s in sizes), sizes


def _agent_framework_table(**sizes: object) -> dict[str, list[str]]:
    """Run workload (f) in-process on memory + SQLite (+ the framework's storages); rows by name."""
    from dataclasses import replace

    from benchmarks import workloads
    from benchmarks.savers import Env, storage_entries
    from benchmarks.workloads import Context, Sizes, workload_agent_framework

    env = Env()
    try:
        storages = [e for e in storage_entries() if e.family in ("memory", "sqlite", "framework")]
        ctx = Context(env, replace(Sizes.quick(), rounds=1, **sizes), [], [], storages, [])
        table = workload_agent_framework(ctx)
    finally:
        env.close()
        if workloads.LOOP is not None:
            workloads.LOOP.close()
            workloads.LOOP = None
    return {row[0]: row[1:] for row in table.rows} | {"notes": table.notes}


def test_agent_framework_workload_measures_every_size() -> None:
    rows = _agent_framework_table()
    for name in ("ours: memory", "ours: sqlite", "FileCheckpointStorage"):
        cells = rows[name][:12]  # save, load, get_latest, list_checkpoint_ids at 3 sizes
        assert all(re.fullmatch(r"[\d.,]+ (µs|ms|s)", c) for c in cells), (name, rows[name])


def test_agent_framework_slow_call_stops_only_the_slow_operation() -> None:
    # Every read counts as too slow past the first size: saves (and so the stores
    # behind every size) must still be measured, and the reads at the first size.
    rows = _agent_framework_table(slow_call=1e-9)
    save, load, latest, ids = (rows["ours: sqlite"][i : i + 3] for i in range(0, 12, 3))
    assert all(re.fullmatch(r"[\d.,]+ (µs|ms|s)", c) for c in save), save
    for cells in (load, latest, ids):
        assert re.fullmatch(r"[\d.,]+ (µs|ms|s)", cells[0]) and cells[1:] == ["too slow"] * 2, cells
    assert any(n.startswith("ours: sqlite: get_latest too slow") for n in rows["notes"]), rows["notes"]
