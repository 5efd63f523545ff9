"""``python -m checkpointers demo`` end to end, in a subprocess, on SQLite."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from checkpointers.__main__ import main

ROOT = Path(__file__).resolve().parent.parent


def demo(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "checkpointers", "demo", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=180)


def field(report: str, name: str) -> str:
    match = re.search(rf"^{name}:\s*(.*)$", report, re.MULTILINE)
    assert match, f"no {name!r} line in:\n{report}"
    return match.group(1)


def test_demo_default_crash_and_resume() -> None:
    run = demo()
    report = run.stdout
    assert run.returncode == 0, report + run.stderr
    assert report.strip().splitlines()[-1] == "PASS"
    assert field(report, "run 1").startswith("exit -9")
    assert field(report, "run 2").startswith("exit 0")
    assert field(report, "outputs").split() == [str(n) for n in range(20, -1, -1)]
    assert "21 values, repeated: none" in report
    twice = field(report, "ran in two processes")
    pids = re.fullmatch(r"worker step 12 \(pids (\d+) then (\d+)\)", twice)
    assert pids and pids[1] != pids[2], twice
    outbox = field(report, "outbox")
    skipped = r"21 applied, 1 skipped as duplicate \(countdown-\w+:step:12\); 21 rows"
    assert re.fullmatch(skipped, outbox), outbox
    stored = field(report, "checkpoints")
    checkpoints = re.match(r"(\d+) stored for the thread, ([\d,]+) bytes", stored)
    assert checkpoints and int(checkpoints[1]) > 0 and int(checkpoints[2].replace(",", "")) > 0


def test_demo_options_and_explicit_store(tmp_path: Path) -> None:
    db = tmp_path / "mine.db"
    run = demo("--store", f"sqlite:///{db}", "--crash-at", "2", "--start", "4")
    assert run.returncode == 0, run.stdout + run.stderr
    assert field(run.stdout, "outputs").split() == ["4", "3", "2", "1", "0"]
    assert field(run.stdout, "ran in two processes").startswith("worker step 2 ")
    assert field(run.stdout, "outbox").startswith("5 applied, 1 skipped as duplicate")
    assert db.exists() and db.stat().st_size > 0  # the store the user named is kept


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--crash-at", "30"], "--crash-at must be between 0 and --start (20), got 30"),
        (["--start", "-1"], "--start must be >= 0"),
        (["--store", "memory://"], "memory:// does not outlive a process"),
    ],
)
def test_demo_rejects_bad_arguments(
    args: list[str], error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["demo", *args])
    assert exit_.value.code == 2
    assert error in capsys.readouterr().err
