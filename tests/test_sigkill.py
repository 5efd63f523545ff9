"""SIGKILL mid-superstep, then resume in a fresh process from the store.

``tests.graph_apps.sigkill_graph`` runs ``good`` and ``killer`` in one
superstep. ``killer`` waits until ``good``'s writes are visible in the store
(read through another connection), then SIGKILLs its own process. A second
process resumes the thread from the store URL: ``good`` must not run again,
``killer`` must, and ``join`` sees both results.

Only backends another process can reach take part (memory cannot).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import uuid
from pathlib import Path
from urllib.parse import urlencode

import pytest

from checkpointers.backends import Backend
from tests.graph_apps import open_saver, read_count

ROOT = Path(__file__).resolve().parent.parent


def store_url(backend: Backend, request: pytest.FixtureRequest) -> str:
    """The URL another process opens to reach ``backend``'s data.

    Backends expose no URL of their own yet, so it is rebuilt from their
    public attributes (the test fixtures' key prefixes included).
    """
    kind = backend.kind
    if kind == "sqlite":
        return f"sqlite:///{backend.path}"  # type: ignore[attr-defined]
    if kind == "redis":
        server = request.getfixturevalue("redis_url")
        query = urlencode({"prefix": backend.prefix})  # type: ignore[attr-defined]
        return f"{server}{'&' if '?' in server else '?'}{query}"
    if kind == "s3":
        endpoint = backend.client.meta.endpoint_url  # type: ignore[attr-defined]
        query = urlencode({"endpoint_url": endpoint})
        return f"s3://{backend.bucket}/{backend.root}?{query}"  # type: ignore[attr-defined]
    if kind == "postgres":
        conninfo = backend.conninfo  # type: ignore[attr-defined]
        return f"{conninfo}{'&' if '?' in conninfo else '?'}{urlencode({'schema': backend.schema})}"  # type: ignore[attr-defined]
    raise AssertionError(f"no cross-process URL for {kind!r}")


def run_app(
    url: str, directory: Path, thread: str, user: str, durability: str, *, resume: bool
) -> subprocess.CompletedProcess[str]:
    cmd = [
        sys.executable, "-m", "tests.graph_apps", "sigkill",
        "--url", url, "--dir", str(directory), "--thread", thread, "--user", user,
        "--durability", durability,
    ]  # fmt: skip
    if resume:
        cmd.append("--resume")
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)


# "async" (LangGraph's default) on every cross-process backend: the task's
# writes may reach the store before the checkpoint they belong to. "sync" once.
@pytest.mark.parametrize(
    ("backend_name", "durability"),
    [("sqlite", "sync"), ("sqlite", "async"), ("redis", "async"), ("s3_http", "async"), ("postgres", "async")],
)
def test_sigkill_mid_superstep_resumes(
    backend: Backend, request: pytest.FixtureRequest, tmp_path: Path, durability: str
) -> None:
    url = store_url(backend, request)
    thread, user = f"t-{uuid.uuid4().hex[:8]}", f"u-{uuid.uuid4().hex[:8]}"

    first = run_app(url, tmp_path, thread, user, durability, resume=False)
    assert first.returncode == -signal.SIGKILL, first.stderr
    assert (tmp_path / "killed").exists()
    first_pid = read_count(tmp_path, "good")[0]
    assert read_count(tmp_path, "good") == read_count(tmp_path, "killer") == [first_pid]
    assert read_count(tmp_path, "join") == []

    # What the killed process left in the store: good's write, not killer's.
    saver = open_saver(url)
    config = {"configurable": {"thread_id": thread, "user_id": user}}
    tup = saver.get_tuple(config)
    assert tup is not None
    assert tup.checkpoint["channel_values"].get("results") == []
    assert sorted(v for _, ch, v in tup.pending_writes if ch == "results") == [["good"]]

    second = run_app(url, tmp_path, thread, user, durability, resume=True)
    assert second.returncode == 0, second.stderr
    results = second.stdout.strip().split(",")
    assert sorted(results[:2]) == ["good", "killer"] and results[2:] == ["join"]

    good, killer, join = (read_count(tmp_path, n) for n in ("good", "killer", "join"))
    assert good == [first_pid], "the finished node ran again after the crash"
    assert len(killer) == 2 and killer[0] == first_pid and killer[1] != first_pid
    assert join == [killer[1]]

    final = saver.get_tuple(config)
    assert final is not None
    assert sorted(final.checkpoint["channel_values"]["results"]) == ["good", "join", "killer"]
    # Another user sees nothing of this thread.
    other = {"configurable": {"thread_id": thread, "user_id": user + "2"}}
    assert saver.get_tuple(other) is None
    saver.close()
