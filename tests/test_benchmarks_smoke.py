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
