"""The ``checkpointers`` command line on real stores (SQLite files, the test Redis).

Every verb is run through :func:`checkpointers.cli.main` with ``--json`` and
its output compared with what the saver's own API returns. ``verify`` is run
on a clean store (nothing reported, exit 0) and on one whose records a test
damaged with bytes written straight into the SQLite file or the Redis hash
(each damaged record reported, exit 1). ``export`` then ``import`` into
another backend gives the same ``get_tuple``/``list`` results, twice over.
"""

from __future__ import annotations

import datetime
import json
import sqlite3
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langgraph.types import Command

from checkpointers._names import Partition
from checkpointers.cli import EXIT_DAMAGED, EXIT_OK, EXIT_REFUSED, EXIT_STORE, EXIT_USAGE, build_parser, main
from checkpointers.cli._scan import kind_of, walk
from checkpointers.savers import Checkpointer
from tests.graph_apps import nested_graph
from tests.test_migrate import CONFIG, work_graph

USER = "alice"


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, Any]:
    """Run the command line with ``--json --quiet``; its exit code and its parsed stdout (None if empty)."""
    code = main([*args, "--json", "--quiet"])
    out = capsys.readouterr().out
    return code, json.loads(out) if out.strip() else None


def fill(url: str) -> None:
    """Two threads of ``alice``: one interrupted (a blob, task paths), one through nested subgraphs; one of bob."""
    with Checkpointer.from_url(url) as saver:
        work_graph(saver.for_user(USER)).invoke({"n": 0}, CONFIG)
        nested = {"configurable": {"thread_id": "nested"}}
        nested_graph(saver.for_user(USER)).invoke({"trail": []}, nested)
        work_graph(saver.for_user("bob")).invoke({"n": 0}, CONFIG)


@pytest.fixture
def store(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    fill(url)
    return url


@pytest.fixture
def redis_store(redis_url: str) -> Iterator[tuple[str, str]]:
    """An empty store on the test Redis under a fresh prefix (removed after): (URL, prefix)."""
    import redis

    prefix = f"clitest{uuid.uuid4().hex[:10]}"
    yield f"{redis_url}?prefix={prefix}", prefix
    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter(match=f"{prefix}*", count=500))
    if keys:
        client.delete(*keys)
    client.close()


def tuples(url: str, user: str) -> dict[str, list[Any]]:
    """Every checkpoint tuple of every thread of ``user``, as ``list`` returns them, by thread."""
    with Checkpointer.from_url(url) as saver:
        view = saver.for_user(user)
        threads = sorted({t.config["configurable"]["thread_id"] for t in view.list(None)})
        return {t: list(view.list({"configurable": {"thread_id": t}})) for t in threads}


def record_count(url: str, user: str) -> int:
    with Checkpointer.from_url(url) as saver:
        parts = [Partition(user, "langgraph", n) for n in saver.backend.partitions(user, "langgraph")]
        return sum(1 for p in parts for _ in walk(saver.backend, p))


# -- help and errors ---------------------------------------------------------------


@pytest.mark.parametrize("verb", ["threads", "history", "show", "stats", "verify", "gc", "export", "import", "migrate"])
def test_every_verb_has_help(verb: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main([verb, "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    assert "--user" in text and "--json" in text and f"checkpointers {verb}" in text


def test_top_level_help_names_verbs_urls_and_exit_codes() -> None:
    text = build_parser().format_help()
    for needle in ("migrate", "verify", "langgraph+sqlite:///", "exit codes", "3 store or file unreadable"):
        assert needle in text
    assert main([]) == EXIT_USAGE


def test_errors_have_exit_codes(tmp_path: Path, store: str, capsys: pytest.CaptureFixture[str]) -> None:
    missing = f"sqlite:///{tmp_path / 'typo.db'}"
    assert main(["threads", missing, "--user", USER]) == EXIT_STORE
    assert "no such SQLite file" in capsys.readouterr().err
    assert not (tmp_path / "typo.db").exists()  # reading never creates a store
    assert main(["threads", "nosuch://x", "--user", USER]) == EXIT_USAGE
    assert "unknown store URL" in capsys.readouterr().err
    assert main(["show", store, "--user", USER, "--thread", "nope"]) == EXIT_DAMAGED
    assert "not found" in capsys.readouterr().err
    with pytest.raises(SystemExit) as done:
        main(["gc", store, "--user", USER, "--keep", "0"])
    assert done.value.code == EXIT_USAGE


# -- threads, history, show, stats -------------------------------------------------------


def test_threads_history_show_stats_match_the_saver(store: str, capsys: pytest.CaptureFixture[str]) -> None:
    expected = tuples(store, USER)
    code, threads = run(capsys, "threads", store, "--user", USER)
    assert code == EXIT_OK
    assert {t["thread_id"]: t["checkpoints"] for t in threads} == {k: len(v) for k, v in expected.items()}
    assert all(t["bytes"] > 0 and t["last_write"] for t in threads)
    code, history = run(capsys, "history", store, "--user", USER, "--thread", "thread-1")
    want = [t.config["configurable"]["checkpoint_id"] for t in expected["thread-1"]]
    assert code == EXIT_OK and [h["checkpoint_id"] for h in history] == want
    assert [h["parent_checkpoint_id"] for h in history] == [
        t.parent_config["configurable"]["checkpoint_id"] if t.parent_config else None for t in expected["thread-1"]
    ]
    code, shown = run(capsys, "show", store, "--user", USER, "--thread", "thread-1")
    latest = expected["thread-1"][0]
    assert code == EXIT_OK and shown["config"]["configurable"]["checkpoint_id"] == want[0]
    assert shown["checkpoint"]["channel_values"]["n"] == latest.checkpoint["channel_values"]["n"] == 3
    assert [(w["task_id"], w["channel"]) for w in shown["pending_writes"]] == [
        (task, channel) for task, channel, _ in latest.pending_writes
    ]
    assert all(w["task_path"] for w in shown["pending_writes"])  # stored task paths are shown
    code, stats = run(capsys, "stats", store, "--user", USER, "--top", "1")
    assert code == EXIT_OK and stats["threads"] == 2 and len(stats["largest"]) == 1
    assert stats["checkpoints"] == sum(len(v) for v in expected.values())
    assert stats["largest"][0]["bytes"] == max(t["bytes"] for t in threads)


def test_tables_for_people(store: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["threads", store, "--user", USER, "--quiet"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "thread-1" in out and "nested" in out and "checkpoints" in out
    assert main(["verify", store, "--user", USER, "--quiet"]) == EXIT_OK
    assert "0 problem(s)" in capsys.readouterr().out


# -- verify -----------------------------------------------------------------------------------


def _records(db: Path, p: Partition) -> dict[str, bytes]:
    with sqlite3.connect(db) as conn:
        return dict(conn.execute(f"SELECT name, value FROM records WHERE {_PID}", (p.key,)).fetchall())


#: A SQLite records row's partition (schema v6: rows carry the partition's integer id).
_PID = "pid = (SELECT id FROM partitions WHERE pkey = ?)"


def _flip(value: bytes) -> bytes:
    middle = len(value) // 2
    return value[:middle] + bytes([value[middle] ^ 0x01]) + value[middle + 1 :]


def test_verify_finds_every_record_damaged_in_the_sqlite_file(
    tmp_path: Path, store: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, clean = run(capsys, "verify", store, "--user", USER)
    assert code == EXIT_OK and clean["problems"] == [] and clean["records"] > 10
    db = tmp_path / "state.db"
    work, nested = Partition(USER, "langgraph", "thread-1"), Partition(USER, "langgraph", "nested")
    recs, nested_recs = _records(db, work), _records(db, nested)
    checkpoint = sorted(n for n in recs if kind_of(n).kind == "checkpoint")[1]
    writes = next(n for n in recs if kind_of(n).kind == "writes")
    blob = sorted(n for n in recs if kind_of(n).kind == "blob")[0]  # a state holding the 4 KiB note
    moved = next(n for n in nested_recs if kind_of(n).kind == "checkpoint")
    tagged = sorted(n for n in nested_recs if kind_of(n).kind == "checkpoint")[-1]
    unreadable = sorted(n for n in nested_recs if kind_of(n).kind == "writes")[0]  # the backend refuses the row
    with sqlite3.connect(db) as conn:
        for name in (checkpoint, writes):
            conn.execute(
                f"UPDATE records SET value = ? WHERE {_PID} AND name = ?", (_flip(recs[name]), work.key, name)
            )
        conn.execute(f"DELETE FROM records WHERE {_PID} AND name = ?", (work.key, blob))
        # a record of one thread copied over another record of another thread: its seal names its place
        conn.execute(
            f"UPDATE records SET value = (SELECT value FROM records WHERE {_PID} AND name = ?),"
            f" digest = (SELECT digest FROM records WHERE {_PID} AND name = ?) WHERE {_PID} AND name = ?",
            (work.key, checkpoint, work.key, checkpoint, nested.key, moved),
        )
        conn.execute(f"UPDATE records SET tags = '{{}}' WHERE {_PID} AND name = ?", (nested.key, tagged))
        conn.execute(f"UPDATE records SET tags = '{{not json' WHERE {_PID} AND name = ?", (nested.key, unreadable))
    code, report = run(capsys, "verify", store, "--user", USER)
    found = {(f["partition"], f["record"], f["problem"]) for f in report["problems"]}
    assert code == EXIT_DAMAGED
    assert found == {
        ("thread-1", checkpoint, "corrupt"),
        ("thread-1", writes, "corrupt"),
        ("thread-1", blob, "missing"),
        ("nested", moved, "corrupt"),
        ("nested", tagged, "corrupt"),
        ("nested", unreadable, "corrupt"),
    }
    code, bob = run(capsys, "verify", store, "--user", "bob")
    assert code == EXIT_OK and bob["problems"] == []  # another user's threads are untouched
    export = tmp_path / "alice.jsonl"
    assert main(["export", store, str(export), "--user", USER, "--quiet"]) == EXIT_STORE
    assert "is corrupt" in capsys.readouterr().err
    assert list(tmp_path.glob("alice.jsonl*")) == []  # a failed export leaves no truncated file


def test_verify_finds_records_damaged_in_redis(
    redis_store: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    import redis

    url, prefix = redis_store
    fill(url)
    assert run(capsys, "verify", url, "--user", USER)[0] == EXIT_OK
    p = Partition(USER, "langgraph", "thread-1")
    client = redis.Redis.from_url(url.split("?")[0])
    key = f"{prefix}:{{{p.key}}}:r"
    names = sorted(f.decode()[2:] for f in client.hkeys(key) if f.startswith(b"m:"))
    checkpoint = [n for n in names if kind_of(n).kind == "checkpoint"][0]
    blob = [n for n in names if kind_of(n).kind == "blob"][0]
    assert "lease" in names  # the vacant lease record an unleased write keeps: checked like the rest
    for name in (checkpoint, blob, "lease"):
        value = client.hget(key, f"v:{name}")
        if value is not None:  # a value in its own field (a staged blob)
            client.hset(key, f"v:{name}", _flip(value))
        else:  # a small value, inline: after the metadata's five lines and the flag byte
            meta = client.hget(key, f"m:{name}")
            head, inline = meta.split(b"\n", 5)[:5], meta.split(b"\n", 5)[5]
            client.hset(key, f"m:{name}", b"\n".join(head) + b"\n" + inline[:1] + _flip(inline[1:]))
    client.close()
    code, report = run(capsys, "verify", url, "--user", USER)
    assert code == EXIT_DAMAGED
    found = sorted((f["partition"], f["record"], f["problem"]) for f in report["problems"])
    expected = [("thread-1", checkpoint, "corrupt"), ("thread-1", blob, "corrupt"), ("thread-1", "lease", "corrupt")]
    assert found == sorted(expected)  # each once


def test_verify_reports_orphans_and_gc_removes_them(store: str, capsys: pytest.CaptureFixture[str]) -> None:
    with Checkpointer.from_url(store) as saver:
        lost = {"configurable": {"thread_id": "thread-1", "checkpoint_ns": "", "checkpoint_id": "no-such-checkpoint"}}
        saver.for_user(USER).put_writes(lost, [("notes", ["orphan"])], "task-x", "~")
    code, report = run(capsys, "verify", store, "--user", USER)
    assert code == EXIT_DAMAGED and [f["problem"] for f in report["problems"]] == ["orphaned"]
    before = record_count(store, USER)
    code, dry = run(capsys, "gc", store, "--user", USER, "--dry-run")
    assert code == EXIT_OK and dry["deleted"] == {"checkpoint": 0, "writes": 1, "blob": 0}
    assert record_count(store, USER) == before  # a dry run deletes nothing
    code, done = run(capsys, "gc", store, "--user", USER)
    assert code == EXIT_OK and done["per_thread"][0]["deleted"] == dry["per_thread"][0]["deleted"]
    assert record_count(store, USER) == before - 1
    assert run(capsys, "verify", store, "--user", USER)[0] == EXIT_OK


def test_gc_keep_then_the_interrupted_thread_still_resumes(store: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, dry = run(capsys, "gc", store, "--user", USER, "--thread", "thread-1", "--keep", "1", "--dry-run")
    with Checkpointer.from_url(store) as saver:
        blobs = [
            r for r in walk(saver.backend, Partition(USER, "langgraph", "thread-1")) if kind_of(r.name).kind == "blob"
        ]
    assert code == EXIT_OK and dry["deleted"]["checkpoint"] == len(tuples(store, USER)["thread-1"]) - 1
    assert dry["deleted"]["blob"] == len(blobs) - 1 >= 1  # the latest state's blob is kept
    code, done = run(capsys, "gc", store, "--user", USER, "--thread", "thread-1", "--keep", "1")
    assert code == EXIT_OK and done["per_thread"][0]["deleted"] == dry["per_thread"][0]["deleted"]
    assert len(tuples(store, USER)["thread-1"]) == 1
    assert run(capsys, "verify", store, "--user", USER)[0] == EXIT_OK
    with Checkpointer.from_url(store) as saver:
        graph = work_graph(saver.for_user(USER))
        result = graph.invoke(Command(resume="yes"), CONFIG)
    assert result["notes"][-1] == "answered yes" and result["n"] == 3


def test_gc_older_than_keeps_newer_checkpoints_and_the_newest(store: str, capsys: pytest.CaptureFixture[str]) -> None:
    total = len(tuples(store, USER)["thread-1"])
    code, nothing = run(capsys, "gc", store, "--user", USER, "--thread", "thread-1", "--older-than", "30d", "--dry-run")
    assert code == EXIT_OK and nothing["deleted"]["checkpoint"] == 0  # every checkpoint is newer than 30 days
    future = (datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(days=1)).isoformat()
    code, done = run(capsys, "gc", store, "--user", USER, "--thread", "thread-1", "--older-than", future)
    assert code == EXIT_OK and done["deleted"]["checkpoint"] == total - 1 >= 1  # the newest of the namespace stays
    assert len(tuples(store, USER)["thread-1"]) == 1
    assert run(capsys, "verify", store, "--user", USER)[0] == EXIT_OK
    with pytest.raises(SystemExit) as refused:
        main(["gc", store, "--user", USER, "--older-than", "yesterday", "--quiet"])
    assert refused.value.code == 2


def test_checkpoint_time_reads_langgraphs_uuid6_ids() -> None:
    from langgraph.checkpoint.base.id import uuid6

    from checkpointers._names import encode_component
    from checkpointers.cli._verify import checkpoint_time, doomed_checkpoints

    start = time.time()
    ids = [str(uuid6(clock_seq=i)) for i in range(3)]
    names = [f"c/{encode_component('')}/{encode_component(cid)}" for cid in ids]
    made = [checkpoint_time(n) for n in names]
    assert all(m is not None and abs(m - start) < 5 for m in made), made
    assert checkpoint_time("c/x/" + encode_component("not-a-uuid")) is None
    assert checkpoint_time("c/x/" + encode_component(str(uuid.uuid4()))) is None  # not v6: never judged old
    assert doomed_checkpoints(names, None, start + 60) == set(names[:2])  # the newest stays
    assert doomed_checkpoints(names, None, start - 60) == set()
    assert doomed_checkpoints(names, 2, None) == {names[0]}


# -- export / import, migrate between our stores ---------------------------------------------


def _same(a: dict[str, list[Any]], b: dict[str, list[Any]]) -> None:
    assert a.keys() == b.keys()
    for thread in a:
        assert [tuple(t) for t in a[thread]] == [tuple(t) for t in b[thread]], thread


@pytest.fixture
def other_store(request: pytest.FixtureRequest) -> str:
    """An empty store of another backend: the test Redis (fresh prefix) or S3 (moto in-process, fresh prefix)."""
    if request.param == "redis":
        url: str = request.getfixturevalue("redis_store")[0]
        return url
    from tests.plugins.s3_plugin import BUCKET

    request.getfixturevalue("s3_inprocess_client")  # moto's mock is on, the bucket exists
    return f"s3://{BUCKET}/cli-{uuid.uuid4().hex}"


@pytest.mark.parametrize(
    ("other_store", "suffix"),
    [("redis", ".jsonl"), ("redis", ".jsonl.gz"), ("s3", ".jsonl.gz")],  # S3 on moto: ~8 s, once
    indirect=["other_store"],
)
def test_export_then_import_into_another_backend_twice_gives_the_same_tuples(
    suffix: str, tmp_path: Path, store: str, other_store: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url = other_store
    file = tmp_path / f"alice{suffix}"
    code, exported = run(capsys, "export", store, str(file), "--user", USER)
    expected = tuples(store, USER)
    assert code == EXIT_OK and exported["checkpoints"] == sum(len(v) for v in expected.values())
    code, imported = run(capsys, "import", str(file), url, "--user", USER)
    assert code == EXIT_OK and imported["checkpoints"] == exported["checkpoints"]
    _same(tuples(url, USER), expected)
    count = record_count(url, USER)
    assert run(capsys, "import", str(file), url, "--user", USER)[0] == EXIT_OK  # again: nothing new
    assert record_count(url, USER) == count
    _same(tuples(url, USER), expected)
    assert run(capsys, "verify", url, "--user", USER)[0] == EXIT_OK
    assert tuples(url, "bob") == {}


def _lines(file: Path) -> list[str]:
    return file.read_text().splitlines(keepends=True)


def test_import_refuses_a_damaged_file_and_writes_nothing(
    tmp_path: Path, store: str, capsys: pytest.CaptureFixture[str]
) -> None:
    file = tmp_path / "alice.jsonl"
    assert run(capsys, "export", store, str(file), "--user", USER)[0] == EXIT_OK
    lines = _lines(file)
    changed = json.loads(lines[3])
    changed["checkpoint_id"] = "x" + changed["checkpoint_id"][1:]
    damaged = {
        "a changed line": [*lines[:3], json.dumps(changed) + "\n", *lines[4:]],
        "a lost line": [*lines[:3], *lines[4:]],
        "a truncated file": lines[:-1],
        "no header": lines[1:],
    }
    dst = f"sqlite:///{tmp_path / 'target.db'}"
    for what, content in damaged.items():
        bad = tmp_path / "bad.jsonl"
        bad.write_text("".join(content))
        assert main(["import", str(bad), dst, "--user", USER, "--quiet"]) == EXIT_REFUSED, what
        assert "nothing was imported" in capsys.readouterr().err
    assert not (tmp_path / "target.db").exists() or tuples(dst, USER) == {}


def test_migrate_between_our_stores_to_another_user(
    store: str, redis_store: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    url, _ = redis_store
    code, moved = run(capsys, "migrate", store, url, "--from-user", USER, "--user", "carol")
    assert code == EXIT_OK and moved["threads"] == 2
    _same(tuples(url, "carol"), tuples(store, USER))
    assert tuples(url, USER) == {}


@pytest.mark.parametrize("page", [1, 2, 3, 7])
def test_walks_page_through_every_record_in_name_order(
    page: int, tmp_path: Path, store: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``walk`` and ``walk_resilient`` a few records a listing give what one listing of everything gives."""
    from checkpointers.backends.base import ListQuery
    from checkpointers.cli._scan import walk_resilient

    p = Partition(USER, "langgraph", "nested")
    with Checkpointer.from_url(store) as saver:
        every = [r.name for r in saver.backend.list(p, ListQuery())]
        assert [r.name for r in walk(saver.backend, p, page=page)] == every
        checkpoints = [r.name for r in saver.backend.list(p, ListQuery(prefix="c/", depth=1))]
        assert [r.name for r in walk(saver.backend, p, "c/", depth=1, page=page)] == checkpoints
    damaged = every[len(every) // 2]
    with sqlite3.connect(tmp_path / "state.db") as conn:
        conn.execute(f"UPDATE records SET tags = '{{not json' WHERE {_PID} AND name = ?", (p.key, damaged))
    with Checkpointer.from_url(store) as saver:
        got = list(walk_resilient(saver.backend, p, page=page))
    assert [r.name if not isinstance(r, Exception) else r.key for r in got] == every
    assert [type(r).__name__ for r in got if isinstance(r, Exception)] == ["CorruptItemError"]


def test_a_checkpoint_id_held_with_other_content_is_kept_not_replaced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from langgraph.checkpoint.base import create_checkpoint, empty_checkpoint

    from checkpointers.cli import EXIT_CONFLICT

    checkpoint = create_checkpoint(empty_checkpoint(), None, 1)
    urls = [f"sqlite:///{tmp_path / name}" for name in ("src.db", "dst.db")]
    for url, n in zip(urls, (1, 2), strict=True):
        with Checkpointer.from_url(url) as saver:
            body = {**checkpoint, "channel_values": {"n": n}, "channel_versions": {"n": "1"}}
            saver.for_user(USER).put(CONFIG, body, {"source": "input", "step": n}, {"n": "1"})
    assert main(["migrate", urls[0], urls[1], "--user", USER, "--quiet"]) == EXIT_CONFLICT
    assert "the destination keeps what it holds" in capsys.readouterr().err
    with Checkpointer.from_url(urls[1]) as saver:
        kept = saver.for_user(USER).get_tuple(CONFIG)
    assert kept is not None and kept.checkpoint["channel_values"] == {"n": 2}


def test_import_option_lets_the_command_decode_a_state_type_of_yours(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dataclass of a module the command has not imported is refused (exit 3) until ``--import`` names it."""
    import importlib
    import os
    import subprocess
    import sys

    from langgraph.graph import StateGraph

    (tmp_path / "mystate.py").write_text(
        "from dataclasses import dataclass\nfrom typing import TypedDict\n\n"
        "@dataclass\nclass Ticket:\n    id: int\n    title: str\n\n"
        "class State(TypedDict, total=False):\n    ticket: Ticket\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "mystate", raising=False)
    mystate = importlib.import_module("mystate")
    url = f"sqlite:///{tmp_path / 'state.db'}"
    builder = StateGraph(mystate.State)
    builder.add_node("open", lambda s: {"ticket": mystate.Ticket(7, "disk full")})
    builder.set_entry_point("open")
    with Checkpointer.from_url(url) as saver:
        builder.compile(checkpointer=saver.for_user(USER)).invoke({}, {"configurable": {"thread_id": "t"}})
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}

    def show(*extra: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "checkpointers", "show", url, "--user", USER, "--thread", "t", *extra]
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)

    refused = show()
    assert refused.returncode == EXIT_STORE, refused.stderr
    assert "Ticket" in refused.stderr and "pass --import mystate" in refused.stderr
    shown = show("--import", "mystate")
    assert shown.returncode == EXIT_OK, shown.stderr
    values = json.loads(shown.stdout)["checkpoint"]["channel_values"]
    assert values["ticket"] == {"type": "Ticket", "id": 7, "title": "disk full"}


def test_gc_collects_expired_threads_of_every_user_and_stats_spans_users(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A store written with ?ttl=: threads shows each expiry; after it, gc --dry-run lists every user's
    expired threads, gc removes them (and nothing live), stats without --user counts users."""
    import time

    url = f"sqlite:///{tmp_path / 'ttl.db'}"
    ttl, start = 4.0, time.monotonic()  # long enough to fill and look on a loaded machine; then wait it out
    fill(f"{url}?ttl={ttl}")
    filled = time.monotonic()
    with Checkpointer.from_url(url) as saver:  # no ttl: carol's thread never expires
        work_graph(saver.for_user("carol")).invoke({"n": 0}, CONFIG)
    code, threads = run(capsys, "threads", url, "--user", USER)
    assert code == EXIT_OK and all(t["expires"] for t in threads)
    code, stats = run(capsys, "stats", url)
    assert code == EXIT_OK and {u["user"] for u in stats["largest"]} == {USER, "bob", "carol"}
    assert time.monotonic() - start < ttl, "the fill and the looks took longer than the ttl"
    time.sleep(max(0.0, filled + ttl + 0.2 - time.monotonic()))
    code, dry = run(capsys, "gc", url, "--dry-run")
    assert code == EXIT_OK and dry["expired"]["count"] == 3
    assert sorted((e["user"], e["name"]) for e in dry["expired"]["partitions"]) == [
        (USER, "nested"), (USER, "thread-1"), ("bob", "thread-1")
    ]  # fmt: skip
    assert record_count(url, USER) == 0  # already invisible before collection
    code, done = run(capsys, "gc", url)
    assert code == EXIT_OK and done["expired"]["count"] == 3
    assert run(capsys, "gc", url, "--dry-run")[1]["expired"]["count"] == 0
    code, stats = run(capsys, "stats", url)
    assert [u["user"] for u in stats["largest"]] == ["carol"] and stats["largest"][0]["checkpoints"] > 0
    with pytest.raises(SystemExit) as refused:  # --keep needs --user
        main(["gc", url, "--keep", "1", "--quiet"])
    assert refused.value.code == EXIT_USAGE
