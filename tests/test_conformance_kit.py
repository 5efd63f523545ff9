"""The conformance kit finds real bugs: each broken backend fails the right check.

``tests/broken_backends.py`` holds backends (and one Store) with one realistic
mistake each. The suite must report each as failing, naming the check that
catches the mistake, and pass our memory backend and the documented example.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from checkpointers import Store
from checkpointers._integrity import Integrity
from checkpointers.backends import Backend, MemoryBackend
from checkpointers.conformance import GROUPS, run_suite
from checkpointers.conformance.example_backend import ExampleBackend
from checkpointers.conformance.properties import use_depth
from checkpointers.errors import CorruptItemError
from checkpointers.savers import Checkpointer
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
    assert {r.group for r in report.results} == {group}
    assert report.passed_all() is passes, report.format()
    assert set(report.not_applicable) == set(GROUPS) - {group}
    # Records cannot be written behind a third-party face: those checks say so, and never count as passed.
    assert {r.name for r in report.skipped} == WRITES_BEHIND[group], report.format()
    assert all(r.detail.startswith("not applicable: ") for r in report.skipped)
    isolation = next(r for r in report.results if r.name.endswith("_isolation"))
    assert isolation.passed is passes, report.format()
    if group == "langgraph":
        config = next(r for r in report.results if r.name == "check_langgraph_config_naming_another_user")
        assert config.passed is passes, report.format()
        if passes:  # InMemorySaver lacks the optional methods and ignores user_id: said, not hidden
            assert "copy_thread" in isolation.detail and "prune" in isolation.detail
            assert "ignores configurable.user_id" in config.detail


#: The adversarial checks that write records behind a face's back (our faces only).
WRITES_BEHIND = {
    "langgraph": {"check_langgraph_crafted_checkpoint_never_runs_code", "check_langgraph_checkpoint_copied_from_another_user"},
    "agent_framework": {"check_af_crafted_checkpoint_never_runs_code", "check_af_checkpoint_copied_from_another_user"},
}


# -- the adversarial checks find real bugs ------------------------------------------------


class _Unsealed(Integrity):
    """Record integrity as before seals: the digest covers the value only, not its place or tags."""

    def seal(self, p, name, tags, sha):  # type: ignore[no-untyped-def]
        return sha

    def check(self, p, record, label=None):  # type: ignore[no-untyped-def]
        if hashlib.sha256(record.value).hexdigest() != record.digest.split(".", 1)[0]:
            raise CorruptItemError(label or record.name, "content does not match its sha256 digest")
        return record


def unsealed_store(backend: Backend, **options: Any) -> Store:
    return Store(backend, integrity=_Unsealed([]), **options)


async def test_a_store_that_does_not_bind_records_to_their_place_fails() -> None:
    report = await run_suite(backend_factory=MemoryBackend, store_factory=unsealed_store, groups=("contract", "isolation"))
    assert {(r.name, r.mode) for r in report.failed} == {
        (check, mode)
        for check in ("check_record_copied_from_another_user_is_corrupt", "check_record_moved_or_damaged_is_corrupt")
        for mode in ("async", "sync")
    }, report.format()
    assert "copied into A's partition: expected CorruptItemError" in report.format()


class ConfigWinsCheckpointer(Checkpointer):
    """A saver whose config's user_id overrides the view's binding (checkpointers 0.1 did this)."""

    def _user_of(self, conf):  # type: ignore[no-untyped-def]
        # Every call resolves its user here, from the config's configurable section.
        configured = conf.get("user_id") if conf else None
        return configured if configured is not None else (self.user or "")


async def test_a_saver_that_lets_a_config_override_its_binding_fails() -> None:
    saver = ConfigWinsCheckpointer(MemoryBackend())
    report = await run_suite(saver_for=saver.for_user, groups=("langgraph",))
    assert {r.name for r in report.failed} == {"check_langgraph_config_naming_another_user"}, report.format()
    assert "instead of raising IsolationError" in report.failed[0].detail


async def test_a_saver_whose_serde_rebuilds_any_type_fails_and_the_payload_is_caught_running() -> None:
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    saver = Checkpointer(MemoryBackend(), serde=JsonPlusSerializer(pickle_fallback=False))  # 0.1's default
    report = await run_suite(saver_for=saver.for_user, groups=("langgraph",))
    assert {r.name for r in report.failed} == {"check_langgraph_crafted_checkpoint_never_runs_code"}, report.format()
    assert "the payload ran os.system" in report.failed[0].detail


async def test_a_storage_that_unpickles_without_an_allowlist_fails() -> None:
    pytest.importorskip("agent_framework")
    from agent_framework import WorkflowCheckpoint
    from agent_framework._workflows._checkpoint_encoding import decode_checkpoint_value

    from adapters.agent_framework import IsolatedCheckpointStorage

    class Unrestricted(IsolatedCheckpointStorage):
        def _decode(self, record, checkpoint_id):  # type: ignore[no-untyped-def]
            return WorkflowCheckpoint.from_dict(decode_checkpoint_value(json.loads(record.value)))

    backend = MemoryBackend()
    report = await run_suite(storage_for=lambda user: Unrestricted(backend, user=user), groups=("agent_framework",))
    assert {r.name for r in report.failed} == {
        "check_af_crafted_checkpoint_never_runs_code",
        "check_af_checkpoint_copied_from_another_user",
    }, report.format()
    assert "the payload ran" in next(r.detail for r in report.failed if "crafted" in r.name)


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
