"""``python -m checkpointers demo`` end to end, in a subprocess, on SQLite (and Redis once); ``--fleet``."""

from __future__ import annotations

import re
import subprocess
import sys
import types
import uuid
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
    assert field(report, "journal") == "21 effects done, 20 by their call, 1 reconciled"
    reconciled = re.search(r"^step 12: unknown outcome, reconciled by key `(fx-[0-9a-f]{32})`: already applied$",
                           report, re.MULTILINE)  # fmt: skip
    assert reconciled, report
    owner = re.search(r"\(intent by (\S+):(\d+) in run 1; receipt (\d+) from the ledger\)", report)
    assert owner and owner[2] == pids[1], report  # the intent was run 1's, the process that was killed
    assert field(report, "ledger") == "21 calls, 21 keys, duplicates: none"
    stored = field(report, "checkpoints")
    checkpoints = re.match(r"(\d+) stored for the thread, ([\d,]+) bytes", stored)
    assert checkpoints and int(checkpoints[1]) > 0 and int(checkpoints[2].replace(",", "")) > 0


def test_demo_options_and_explicit_store(tmp_path: Path) -> None:
    db = tmp_path / "mine.db"
    run = demo("--store", f"sqlite:///{db}", "--crash-at", "2", "--start", "4")
    assert run.returncode == 0, run.stdout + run.stderr
    assert field(run.stdout, "outputs").split() == ["4", "3", "2", "1", "0"]
    assert field(run.stdout, "ran in two processes").startswith("worker step 2 ")
    assert field(run.stdout, "ledger") == "5 calls, 5 keys, duplicates: none"
    assert re.search(r"^step 2: unknown outcome, reconciled by key `fx-", run.stdout, re.MULTILINE)
    assert db.exists() and db.stat().st_size > 0  # the store the user named is kept


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--crash-at", "30"], "--crash-at must be between 0 and --start (20), got 30"),
        (["--start", "-1"], "--start must be >= 0"),
        (["--store", "memory://"], "memory:// does not outlive a process"),
    ],
)
def test_demo_rejects_bad_arguments(args: list[str], error: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["demo", *args])
    assert exit_.value.code == 2
    assert error in capsys.readouterr().err


def test_demo_on_redis(redis_url: str) -> None:
    """The journal works on the store the user names: here Redis (one run, step 1 of 0..3)."""
    store = f"{redis_url}{'&' if '?' in redis_url else '?'}prefix=demo-{uuid.uuid4().hex[:8]}"
    run = demo("--store", store, "--crash-at", "1", "--start", "3")
    assert run.returncode == 0, run.stdout + run.stderr
    assert field(run.stdout, "journal") == "4 effects done, 3 by their call, 1 reconciled"
    assert field(run.stdout, "ledger") == "4 calls, 4 keys, duplicates: none"


def test_fleet_dispatches_the_rest_of_the_arguments(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: list[list[str]] = []
    fake = types.SimpleNamespace(main=lambda argv: seen.append(argv) or 0)
    monkeypatch.setitem(sys.modules, "checkpointers.fleet_demo", fake)
    assert main(["demo", "--store", "sqlite:///x.db", "--fleet", "--ttl", "2"]) == 0
    assert seen == [["--store", "sqlite:///x.db", "--ttl", "2"]]
    monkeypatch.setitem(sys.modules, "checkpointers.fleet_demo", None)  # a build without the module
    assert main(["demo", "--fleet"]) == 2
    assert "checkpointers.fleet_demo" in capsys.readouterr().err
