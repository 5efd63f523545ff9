"""The conformance kit finds real bugs: each broken backend fails the right check.

``tests/broken_backends.py`` holds backends (and one Store) with one realistic
mistake each. The suite must report each as failing, naming the check that
catches the mistake, and pass our memory backend and the documented example.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from checkpointers.backends import MemoryBackend
from checkpointers.conformance import GROUPS, run_suite
from checkpointers.conformance.example_backend import ExampleBackend
from checkpointers.conformance.properties import use_depth
from tests import broken_backends as bb

pytest_plugins = ["checkpointers.conformance.pytest_plugin"]

ROOT = Path(__file__).resolve().parent.parent
ITEM_GROUPS = ("contract", "isolation", "backend")


@pytest.fixture(autouse=True)
def _fast_failures() -> Iterator[None]:
    use_depth(False, shrink=False)  # failures are expected here: skip minimizing them
    yield
    use_depth(False)


@pytest.mark.parametrize("factory", [MemoryBackend, ExampleBackend], ids=["memory", "example"])
async def test_good_backends_pass_every_group(factory) -> None:  # type: ignore[no-untyped-def]
    report = await run_suite(backend_factory=factory)
    assert report.passed_all(), report.format()
    assert report.not_applicable == {}, report.not_applicable
    assert {r.group for r in report.results} == set(GROUPS)


BROKEN = {
    "undelimited_user_prefix": (
        bb.UndelimitedPrefixBackend, None,
        {"check_backend_partitions_disjoint", "check_backend_partitions_and_drop", "check_prop_backend_isolation"},
    ),
    "unescaped_glob_listing": (bb.GlobListingBackend, None, {"check_backend_partitions_disjoint"}),
    "non_atomic_batch": (
        bb.NonAtomicBackend, None, {"check_atomic_batch", "check_backend_conditions_and_noops"},
    ),
    "checkpoint_before_blobs": (bb.TornWriteBackend, None, {"check_atomic_visibility"}),
    "append_overwrites": (
        bb.AppendOverwritesBackend, None, {"check_append_only_steps", "check_backend_conditions_and_noops"},
    ),
    "cap_after_write": (ExampleBackend, bb.CapAfterWriteStore, {"check_size_cap_before_write"}),
    "conditions_after_write": (
        bb.ConditionAfterWriteBackend, None,
        {"check_create_refuses_existing", "check_concurrent_if_match_one_winner", "check_backend_conditions_and_noops"},
    ),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
async def test_suite_names_the_bug(case: str) -> None:
    factory, store_factory, expected = BROKEN[case]
    extra = {"store_factory": store_factory} if store_factory else {}
    report = await run_suite(backend_factory=factory, groups=ITEM_GROUPS, **extra)
    failed = {r.name for r in report.failed}
    assert not report.passed_all()
    assert expected <= failed, f"{case}: expected {expected} among failures, got {failed}\n{report.format()}"


async def test_cap_after_write_fails_for_the_right_reason() -> None:
    report = await run_suite(backend_factory=ExampleBackend, store_factory=bb.CapAfterWriteStore, groups=ITEM_GROUPS)
    assert {(r.name, r.detail) for r in report.failed} == {
        ("check_size_cap_before_write", "a refused item changed the store")
    }
    assert len(report.failed) == 2  # through the async and the sync API


@pytest.mark.parametrize(
    ("kwargs", "group", "passes"),
    [
        ({"saver_for": bb.shared_saver}, "langgraph", False),
        ({"saver_for": bb.per_user_saver}, "langgraph", True),
        ({"storage_for": bb.shared_storage}, "agent_framework", False),
        ({"storage_for": bb.per_user_storage}, "agent_framework", True),
    ],
    ids=["shared-saver", "per-user-saver", "shared-storage", "per-user-storage"],
)
async def test_framework_faces(kwargs, group: str, passes: bool) -> None:  # type: ignore[no-untyped-def]
    report = await run_suite(**kwargs)
    (result,) = report.results
    assert (result.group, result.passed) == (group, passes), report.format()
    assert set(report.not_applicable) == set(GROUPS) - {group}
    if group == "langgraph" and passes:  # InMemorySaver lacks the optional methods: said, not hidden
        assert "copy_thread" in result.detail and "prune" in result.detail


async def test_pytest_plugin_fixture(checkpointers_conformance) -> None:  # type: ignore[no-untyped-def]
    report = await checkpointers_conformance(backend_factory=ExampleBackend, groups=("backend",))
    assert report.passed_all() and {r.group for r in report.results} == {"backend"}
    with pytest.raises(pytest.fail.Exception, match="check_append_only_steps"):
        await checkpointers_conformance(backend_factory=bb.AppendOverwritesBackend, groups=("contract",))


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "checkpointers.conformance", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )


def test_cli_passes_on_memory() -> None:
    out = _cli("memory://")
    assert out.returncode == 0, out.stdout + out.stderr
    for group in GROUPS:
        assert f"{group:<16} PASS" in out.stdout, out.stdout


def test_cli_fails_a_broken_backend_naming_the_case() -> None:
    out = _cli("tests.broken_backends:UndelimitedPrefixBackend", "--no-shrink")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "isolation        FAIL" in out.stdout and "check_backend_partitions_disjoint" in out.stdout


def test_cli_saver_factory_and_bad_target() -> None:
    out = _cli("tests.broken_backends:shared_saver", "--no-shrink")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "langgraph        FAIL" in out.stdout and "contract         N/A" in out.stdout
    bad = _cli("tests.broken_backends:nothing_here")
    assert bad.returncode == 2 and "nothing_here" in bad.stderr


async def test_the_example_in_the_docs_passes() -> None:
    """The code block of docs/backends.md itself, executed, passes the suite."""
    text = (ROOT / "docs" / "backends.md").read_text()
    section = text[text.index("## A minimal backend") :]
    code = section[section.index("```python\n") + 10 : section.index("```\n", section.index("```python"))]
    namespace: dict[str, object] = {}
    exec(compile(code, "docs/backends.md", "exec"), namespace)
    report = await run_suite(backend_factory=namespace["ExampleBackend"], groups=ITEM_GROUPS)  # type: ignore[arg-type]
    assert report.passed_all(), report.format()
