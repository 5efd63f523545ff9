"""The fleet demo (``python -m checkpointers demo --fleet``): its verdicts, and one full run under --deep.

The full run spawns seven worker processes (about 45 s on this machine), so
it is a deep check; the lease behaviour it shows is tested on its own, faster,
in ``tests/test_saver_leases.py``. The verdict function is tested here on
outcomes built by hand: a forked history, two winners, a stale holder that
was not fenced, a step that ran twice are each reported.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from checkpointers import fleet_demo

GOOD: dict[str, Any] = {
    "kind": "paused",
    "thread": "paused-x",
    "workers": [
        {"status": "lost", "owner": "A", "token": 10},
        {"status": "done", "owner": "B", "token": 11},
        {"status": "held", "owner": "C", "token": None},
    ],
    "history": {"checkpoints": 6, "forks": [], "trail": [["A", 1], ["A", 2], ["B", 3], ["B", 4]]},
    "executions": ["A 1", "A 2", "A 3", "B 3", "B 4"],
    "steps": 4,
}


def spoiled(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    result = copy.deepcopy(GOOD)
    target = result
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return result


def test_the_contract_outcome_passes() -> None:
    assert fleet_demo.check(GOOD) == []


@pytest.mark.parametrize(
    ("path", "value", "found"),
    [
        (("history", "forks"), ["c1"], "forked history"),
        (("workers", 2, "status"), "done", "one winner"),
        (("workers", 0, "status"), "done", "expected LeaseLostError"),
        (("executions",), ["A 1", "A 2", "A 3", "B 2", "B 3", "B 4"], "steps ran"),
        (("history", "trail"), [["A", 1], ["A", 2], ["A", 3], ["B", 4]], "final trail"),
        (("workers", 1, "token"), 9, "token is not above"),
    ],
)
def test_each_breach_is_reported(path: tuple[Any, ...], value: Any, found: str) -> None:
    problems = fleet_demo.check(spoiled(path, value))
    assert any(found in p for p in problems), problems
    assert fleet_demo.report([spoiled(path, value)]) == 1


@pytest.mark.deep
def test_the_demo_runs_both_races_without_a_fork(capsys: pytest.CaptureFixture[str]) -> None:
    assert fleet_demo.main(["--steps", "4"]) == 0
    out = capsys.readouterr().out
    assert out.count("won: finished the run") == 2 and out.count("lost the race") == 2
    assert "LeaseLostError: its write landed nothing" in out and "killed in step 3" in out
    assert out.count("(no fork)") == 2 and "PROBLEMS" not in out
