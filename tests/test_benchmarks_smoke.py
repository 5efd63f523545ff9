"""The benchmark harness still runs and writes what it promises (no timing is asserted:
numbers live in benchmarks/, never in a test)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _quick_run(tmp_path: Path) -> tuple[str, dict[str, object], Path]:
    out, data = tmp_path / "results.md", tmp_path / "results.json"
    cmd = [sys.executable, "-m", "benchmarks.run", "--quick", "--only", "b,d,g,h",
           "--backends", "memory,sqlite", "--set", "history=50", "--set", "cell_budget=0.2",
           "--out", str(out), "--json", str(data)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "[bench] (b) ops: ours: Checkpointer(sqlite) (sync)" in done.stderr  # a progress line per saver
    return out.read_text(), json.loads(data.read_text()), data.with_suffix(".png")


def test_quick_benchmark_writes_tables_json_and_chart(tmp_path: Path) -> None:
    text, data, png = _quick_run(tmp_path)
    # (b): one table per backend, every operation row measured for ours and the anchor, both modes.
    sqlite_b = text.split("### (b) sqlite")[1].split("###")[0]
    for op in ("put", "put_writes", "get_tuple @10", "get_tuple(id) @50", "list(10) @50", "list(thread) @20"):
        row = next(line for line in sqlite_b.splitlines() if line.startswith(f"| {op} |"))
        times = re.findall(r"\| [\d.,]+ (?:µs|ms|s) ", row)
        assert len(times) == 4, row  # ours and SqliteSaver, sync and async
    # (c) and (h): our savers have rows, nothing errored.
    for saver in ("ours: Checkpointer(memory)", "ours: Checkpointer(sqlite)", "SqliteSaver", "InMemorySaver"):
        rows = [line for line in text.splitlines() if line.startswith(f"| {saver} |")]
        assert rows and not any("error" in r or "not installed" in r for r in rows), (saver, rows)
    assert re.search(r"^\| sqlite \| [\d.]+ (µs|ms) \| [\d.]+ (µs|ms) \| [\d.]+ (µs|ms) \|", text, re.M)
    # (d) bytes at rest: every saver reports positive byte counts, per put too.
    footprint = text.split("### (d)")[1].split("###")[0]
    sizes = re.findall(r"^\| [^|]+ \| sync \| ([\d,]+) \|", footprint, flags=re.M)
    assert len(sizes) == 4 and all(int(s.replace(",", "")) > 0 for s in sizes), sizes
    # The JSON holds the measures and the ratios the chart is drawn from.
    measures = data["measures"]
    assert isinstance(measures, list)
    ours_puts = [m for m in measures if m["saver"] == "ours: sqlite" and m["metric"] == "put"]
    assert {m["mode"] for m in ours_puts} == {"sync", "async"} and all(m["value"] > 0 for m in ours_puts)
    ratios = data["ratios"]
    assert isinstance(ratios, list)
    assert {(r["family"], r["anchor"]) for r in ratios} >= {("sqlite", "langgraph-checkpoint-sqlite"),
                                                           ("memory", "InMemorySaver")}
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _agent_framework_table(**sizes: object) -> dict[str, list[str]]:
    """Run workload (f) in-process on memory + SQLite (+ the framework's storages); rows by name."""
    from dataclasses import replace

    from benchmarks import harness
    from benchmarks.agent_framework import workload_agent_framework
    from benchmarks.harness import Context, Sizes
    from benchmarks.savers import Env, storage_entries

    env = Env()
    try:
        storages = [e for e in storage_entries() if e.family in ("memory", "sqlite", "framework")]
        ctx = Context(env, replace(Sizes.quick(), rounds=1, **sizes), [], [], storages, [])
        (table,) = workload_agent_framework(ctx)
    finally:
        env.close()
        harness.close_loop()
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


def test_report_redraws_a_saved_run_and_names_a_missing_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    from benchmarks import report

    saved = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "run-1bd9205.json"
    run = tmp_path / "run.json"
    run.write_bytes(saved.read_bytes())
    assert report.main([str(run)]) == 0
    out = capsys.readouterr().out
    assert "### Summary: speed ratio of ours vs the reference anchor" in out
    assert (tmp_path / "run.png").stat().st_size > 0
    with pytest.raises(SystemExit) as exit_:
        report.main([str(tmp_path / "missing.json")])
    assert exit_.value.code == 2
    assert "missing.json: no such file" in capsys.readouterr().err
