"""Run LangGraph's own test suite against our savers and compare with LangGraph's.

    python -m tests.langgraph_suite                      # every saver
    python -m tests.langgraph_suite --savers memory,sqlite -k interrupt
    python -m tests.langgraph_suite --out /tmp/lg.txt -- -x   # after --: more pytest args

What it does:

1. downloads the sdist of the *installed* langgraph version with
   ``pip download --no-deps --no-binary :all: langgraph==<version>`` and keeps its
   ``tests/`` (and ``pyproject.toml``, which holds its pytest settings) in
   ``.cache/langgraph-suite/<version>/`` (the package itself is not unpacked:
   the tests run on the installed langgraph);
2. picks every ``tests/test_*.py`` that uses the ``sync_checkpointer`` or
   ``async_checkpointer`` fixture;
3. runs them once per saver, each in its own pytest process (``--jobs`` at a
   time), with ``checkpointers_lg_plugin`` (next to this file) putting that
   saver into those fixtures without editing LangGraph's files; tests that
   use neither fixture are deselected, as they do not depend on the saver;
4. prints a table per saver (passed / failed / skipped against
   ``InMemorySaver``) and lists every test that passes on ``InMemorySaver``
   but not on a saver of ours, with its failure line.

Savers: ``InMemorySaver`` (always run: the reference) and ``SqliteSaver``
(``langgraph-checkpoint-sqlite``) are the controls; ``memory``, ``sqlite``,
``redis``, ``s3`` and ``postgres`` are ours (``MemoryCheckpointer``,
``SqliteCheckpointer`` on a per-test file, ``RedisCheckpointer``,
``S3Checkpointer`` on moto in the test process, ``PostgresCheckpointer`` in
a schema of its own, dropped after), each bound to a fresh user per test
(``--unbound``: not bound). PostgreSQL is ``POSTGRES_URL`` when set, else the
server on 127.0.0.1:5432 (database ``test``) if it answers, else skipped.
Redis is ``REDIS_URL`` when set, else the server on 127.0.0.1:6379 if one
answers (database ``--redis-db``, 9 by default), else a throwaway
``redis-server`` on a free loopback port when the binary is installed;
every key of the run carries a unique prefix and is removed at the end.

The environment passes through: ``LANGGRAPH_STRICT_MSGPACK=true`` runs the
suite in LangGraph's strict msgpack mode (its controls get an allowlisting
serializer; compiled graphs then call ``with_allowlist`` with their schema's
types, which LangGraph skips otherwise).

Exit status: 0 when every test that passes on ``InMemorySaver`` passes on each
saver of ours (bar the :data:`KNOWN` differences, listed with their reason), 1
otherwise, 2 when a run could not start. Needs the ``langgraph-suite`` extra
(``pip install -e '.[test,langgraph-suite]'``; ``make langgraph-suite`` does it).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
from collections import Counter
from importlib import metadata
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
DEFAULT_CACHE = REPO / ".cache" / "langgraph-suite"
REFERENCE = "InMemorySaver"
CONTROLS = ("InMemorySaver", "SqliteSaver")
OURS = ("memory", "sqlite", "redis", "s3", "postgres")
LOCAL_POSTGRES = "postgresql://postgres@127.0.0.1:5432/test"
FIXTURE_RE = re.compile(r"\b(sync_checkpointer|async_checkpointer)\b")
#: Tests that pass on InMemorySaver and cannot pass on a saver of ours, with why
#: (a test reading InMemorySaver's internals is such a reason; a behaviour
#: difference is not). Keys as the plugin writes them: "<file>::<test>[<param>=<index>,...]",
#: the test's parameters other than the saver, by index.
KNOWN: dict[str, str] = {}
#: The same, by the failure line (a regular expression searched in it).
KNOWN_CRASHES: dict[str, str] = {}


def known(key: str, result: dict[str, Any]) -> str | None:
    """Why a test that passes on InMemorySaver cannot pass on ours, if it is known."""
    if key in KNOWN:
        return KNOWN[key]
    for pattern, reason in KNOWN_CRASHES.items():
        if re.search(pattern, result.get("crash", "")):
            return reason
    return None


def saver_id(name: str) -> str:
    """The saver's name inside the pytest process (and in the test ids)."""
    return name if name in CONTROLS else f"ours-{name}"


# -- the sdist ------------------------------------------------------------------------


def langgraph_version() -> str:
    return metadata.version("langgraph")


def fetch_suite(version: str, cache: Path) -> Path:
    """``cache/<version>`` holding LangGraph's ``tests/`` and ``pyproject.toml``."""
    root = cache / version
    if (root / "tests" / "conftest.py").is_file() and (root / "pyproject.toml").is_file():
        return root
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        command = [
            sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
            "--no-binary", ":all:", "--dest", tmp, f"langgraph=={version}",
        ]  # fmt: skip
        print(f"downloading the langgraph {version} sdist: {' '.join(command[2:])}", flush=True)
        subprocess.run(command, check=True)
        archives = sorted(Path(tmp).glob("langgraph-*.tar.gz"))
        if not archives:
            raise SystemExit(f"pip download left no langgraph-*.tar.gz in {tmp}")
        staging = Path(tmp) / "unpacked"
        with tarfile.open(archives[0]) as tar:
            top = f"langgraph-{version}/"
            members = [
                m
                for m in tar.getmembers()
                if (m.name.startswith(top + "tests/") or m.name == top + "pyproject.toml")
                and (m.isfile() or m.isdir())
                and ".." not in Path(m.name).parts
            ]
            tar.extractall(staging, members=members)  # noqa: S202 (members filtered above)
        if root.exists():
            shutil.rmtree(root)
        (staging / f"langgraph-{version}").rename(root)
    return root


def suite_files(root: Path) -> list[str]:
    """Every ``tests/test_*.py`` that uses a checkpointer fixture, relative to ``root``."""
    return [
        str(path.relative_to(root))
        for path in sorted((root / "tests").glob("test_*.py"))
        if FIXTURE_RE.search(path.read_text(encoding="utf-8", errors="replace"))
    ]


def export_rev(rev: str, cache: Path) -> Path:
    """``checkpointers/`` and ``adapters/`` as of git ``rev``, in ``cache/rev-<sha>`` (put first on PYTHONPATH)."""
    sha = subprocess.run(
        ["git", "rev-parse", "--verify", f"{rev}^{{commit}}"], cwd=REPO, check=True, capture_output=True, text=True
    ).stdout.strip()
    target = cache / f"rev-{sha[:12]}"
    if not (target / "checkpointers" / "__init__.py").is_file():
        target.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(
            ["git", "archive", "--format=tar", sha, "checkpointers", "adapters"], cwd=REPO, check=True, capture_output=True
        ).stdout
        import io

        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(target)  # noqa: S202 (our own repository's archive)
    return target


# -- Redis ----------------------------------------------------------------------------


def _answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def postgres_url() -> str:
    """``POSTGRES_URL``, else the local server if it answers, else ``""``."""
    url = os.environ.get("POSTGRES_URL", "")
    if url:
        return url
    try:
        import psycopg

        with psycopg.connect(LOCAL_POSTGRES, connect_timeout=3):
            return LOCAL_POSTGRES
    except Exception:  # psycopg missing or nothing answers
        return ""


class RedisSource:
    """Where ``redis`` runs: REDIS_URL, a local server that answers, or one we start."""

    def __init__(self, db: int, wanted: bool = True) -> None:
        self.db = db
        self.wanted = wanted
        self.server: Any = None  # a benchmarks.launchers.RedisServer when we start one
        self.directory: str | None = None
        self.url = ""
        self.reason = ""

    def __enter__(self) -> RedisSource:
        if not self.wanted:
            pass
        elif os.environ.get("REDIS_URL"):
            self.url, self.reason = os.environ["REDIS_URL"], "REDIS_URL"
        elif _answers("127.0.0.1", 6379):
            self.url, self.reason = f"redis://127.0.0.1:6379/{self.db}", "the server on 127.0.0.1:6379"
        elif shutil.which("redis-server"):
            from benchmarks.launchers import RedisServer, free_port

            self.directory = tempfile.mkdtemp(prefix="lgsuite-redis-")
            self.server = RedisServer(Path(self.directory), free_port()).start()
            self.url, self.reason = self.server.url, f"a throwaway redis-server on port {self.server.port}"
        return self

    def __exit__(self, *exc: object) -> None:
        if self.server is not None:
            self.server.stop()
        if self.directory:
            shutil.rmtree(self.directory, ignore_errors=True)


# -- running --------------------------------------------------------------------------


def run_saver(
    name: str, root: Path, files: list[str], args: argparse.Namespace, redis_url: str, out_dir: Path, tag: str = ""
) -> dict[str, Any]:
    sid = saver_id(name)
    results = out_dir / f"{sid}{tag}.json"
    log = out_dir / f"{sid}{tag}.log"
    results.unlink(missing_ok=True)
    env = dict(os.environ)
    env.update(
        NO_DOCKER="true",  # LangGraph's own Postgres / Redis fixtures stay off
        CHECKPOINTERS_LG_SAVER=sid,
        CHECKPOINTERS_LG_RESULTS=str(results),
        CHECKPOINTERS_LG_UNBOUND="1" if args.unbound else "",
        CHECKPOINTERS_LG_REDIS_URL=redis_url,
        CHECKPOINTERS_LG_REDIS_PREFIX=f"lgsuite-{uuid.uuid4().hex[:12]}",
        CHECKPOINTERS_LG_S3_PLUGIN=str(REPO / "tests" / "plugins" / "s3_plugin.py"),
        CHECKPOINTERS_LG_POSTGRES_URL=args.postgres_url,
        CHECKPOINTERS_LG_POSTGRES_SCHEMA=f"lgsuite_{uuid.uuid4().hex[:12]}",
        PYTHONPATH=os.pathsep.join([str(HERE), *args.code_path, *filter(None, [os.environ.get("PYTHONPATH")])]),
        PYTHONDONTWRITEBYTECODE="1",
    )
    command = [
        sys.executable, "-m", "pytest",
        "-p", "checkpointers_lg_plugin",
        "-p", "no:cacheprovider",
        "-p", "no:asyncio",  # LangGraph's async tests run on anyio, as in its own CI
        "--rootdir", str(root), "-c", str(root / "pyproject.toml"),
        "-q", "--no-header", "-rfE", f"--timeout={args.timeout}",
        *(["-k", args.k] if args.k and not tag else []),
        *files,
        *args.pytest_args,
    ]  # fmt: skip
    started = time.monotonic()
    with log.open("w") as handle:
        handle.write(" ".join(command) + "\n\n")
        handle.flush()
        code = subprocess.run(command, cwd=root, env=env, stdout=handle, stderr=subprocess.STDOUT).returncode
    elapsed = time.monotonic() - started
    if not results.is_file():
        return {"saver": sid, "name": name, "exitstatus": code, "results": {}, "elapsed": elapsed, "log": str(log)}
    data = json.loads(results.read_text())
    data.update(name=name, elapsed=elapsed, log=str(log))
    if not tag:
        results.write_text(json.dumps(data, indent=1, sort_keys=True))
    return data


def retry(
    runs: list[dict[str, Any]],
    root: Path,
    args: argparse.Namespace,
    redis_url: str,
    out_dir: Path,
    pool: concurrent.futures.Executor,
) -> None:
    """Run each saver's failed tests again, once, in a fresh process: a pass marks them flaky.

    Several of LangGraph's tests assert on timings (``sleep`` and stream
    arrival order), which a loaded 2-core machine running several suites at
    once misses now and then, on InMemorySaver too.
    """
    futures = {}
    for run in runs:
        failed = sorted(n for n, v in run.get("results", {}).items() if v["outcome"] in ("failed", "error"))
        if failed and len(failed) <= 100:  # more is no flake: leave it
            futures[pool.submit(run_saver, run["name"], root, failed, args, redis_url, out_dir, ".retry")] = run
    for future in concurrent.futures.as_completed(futures):
        run, again = futures[future], future.result()
        merge_retry(run, again)
        print(f"  {run['saver']}: re-ran {len(again.get('results', {}))} failed, "
              f"{sum(v['outcome'] == 'passed' for v in again.get('results', {}).values())} passed", flush=True)


def merge_retry(run: dict[str, Any], again: dict[str, Any]) -> None:
    """A test that failed in ``run`` and passed in ``again`` counts as passed, marked flaky."""
    for nodeid, v in again.get("results", {}).items():
        if v["outcome"] == "passed" and nodeid in run["results"]:
            first = run["results"][nodeid]
            run["results"][nodeid] = {**v, "flaky": first.get("crash", "") or first["outcome"]}


def load_runs(names: list[str], out_dir: Path) -> list[dict[str, Any]]:
    """The last run's results as left in ``out_dir`` (for --report-only)."""
    runs = []
    for name in names:
        sid = saver_id(name)
        path = out_dir / f"{sid}.json"
        if not path.is_file():
            runs.append({"saver": sid, "name": name, "results": {}, "elapsed": 0.0, "log": str(path)})
            continue
        run = json.loads(path.read_text())
        run.update(name=name, elapsed=float(run.get("elapsed", 0.0)), log=str(out_dir / f"{sid}.log"))
        retry_path = out_dir / f"{sid}.retry.json"
        if retry_path.is_file() and retry_path.stat().st_mtime >= path.stat().st_mtime:
            merge_retry(run, json.loads(retry_path.read_text()))
        runs.append(run)
    return runs


def key_of(nodeid: str, result: dict[str, Any], param_id: str) -> str:
    """What names the same test on every saver: the plugin's key (the test's
    other parameters by index), else the id with the saver's id replaced by ``*``."""
    if result.get("key"):
        return str(result["key"])
    head, sep, params = nodeid.partition("[")
    if not sep:
        return nodeid
    parts = params[:-1].split("-")
    return head + "[" + "-".join("*" if part == param_id else part for part in parts) + "]"


def summarize(runs: list[dict[str, Any]], version: str, files: list[str], args: argparse.Namespace) -> tuple[str, int]:
    lines: list[str] = []
    by_name = {r["name"]: r for r in runs}
    ref = by_name.get(REFERENCE)
    ref_results = {key_of(n, v, ref["param_id"]): v for n, v in ref["results"].items()} if ref and ref.get("results") else {}
    ref_passed = {k for k, v in ref_results.items() if v["outcome"] == "passed"}
    lines.append(
        f"LangGraph {version}'s own tests: {len(files)} files using sync_checkpointer/async_checkpointer"
        f"{f', -k {args.k!r}' if args.k else ''}; savers {'unbound' if args.unbound else 'bound to a fresh user per test'}"
    )
    code = sorted({r["checkpointers"] for r in runs if r.get("checkpointers") and r["name"] in OURS})
    if code:
        lines.append(f"our savers from: {', '.join(code)}{f' (git {args.rev})' if args.rev else ''}")
    lines.append("")
    header = f"{'saver':<22} {'tests':>6} {'passed':>7} {'failed':>7} {'errors':>7} {'skipped':>8} {'xfailed':>8} {'flaky':>6}  {'fail where InMemorySaver passes':>31}  {'time':>6}"
    lines.append(header)
    lines.append("-" * len(header))
    regressions: dict[str, list[tuple[str, str, dict[str, Any]]]] = {}
    status = 0
    for run in runs:
        sid, name = run["saver"], run["name"]
        results = run.get("results", {})
        counts = Counter(v["outcome"] for v in results.values())
        label = {"InMemorySaver": "InMemorySaver (ref)", "SqliteSaver": "SqliteSaver (control)"}.get(name, f"ours: {name}")
        if not results:
            lines.append(f"{label:<22} did not run (pytest exit {run.get('exitstatus')}): see {run.get('log')}")
            status = max(status, 2)
            continue
        mine = {key_of(n, v, run["param_id"]): (n, v) for n, v in results.items()}
        lost = sorted(
            (k, n, v) for k, (n, v) in mine.items() if k in ref_passed and v["outcome"] != "passed"
        )
        missing = sorted(ref_passed - set(mine))
        regressions[name] = lost
        unexplained = [x for x in lost if not known(x[0], x[2])]
        if name in OURS and (unexplained or (missing and not args.k)):
            status = max(status, 1)
        n_known = len(lost) - len(unexplained)
        vs = "-" if name == REFERENCE else (
            f"{len(lost)}" + (f" ({n_known} known)" if n_known else "") + (f" (+{len(missing)} not run)" if missing else "")
        )
        lines.append(
            f"{label:<22} {len(results):>6} {counts['passed']:>7} {counts['failed']:>7} {counts['error']:>7} "
            f"{counts['skipped']:>8} {counts['xfailed']:>8} {sum(1 for v in results.values() if v.get('flaky')):>6}  {vs:>31}  {run['elapsed']:>5.0f}s"
        )
    lines.append("")
    if ref is None:
        lines.append("InMemorySaver did not run: nothing to compare with.")
        status = max(status, 2)
    ref_failed = sorted(n for n, v in (ref or {}).get("results", {}).items() if v["outcome"] in ("failed", "error"))
    if ref_failed:
        lines.append(f"{len(ref_failed)} fail on InMemorySaver itself (not compared):")
        lines.extend(f"  {n}  {ref['results'][n].get('crash', '')[:160]}" for n in ref_failed)
        lines.append("")
    for name, lost in regressions.items():
        if name == REFERENCE or not lost:
            continue
        lines.append(f"{saver_id(name)}: {len(lost)} passing on InMemorySaver, not here:")
        reasons: dict[str, int] = {}
        for key, nodeid, v in lost:
            why = known(key, v)
            tag = ""
            if why:
                reasons.setdefault(why, len(reasons) + 1)
                tag = f"  [known difference {reasons[why]}]"
            lines.append(f"  {v['outcome'].upper():<7} {nodeid}{tag}")
            if v.get("crash"):
                lines.append(f"          {v['crash']}")
        for why, number in reasons.items():
            lines.append(f"  known difference {number}: {why}")
        lines.append("")
    flaky = [(r["saver"], n, v["flaky"]) for r in runs for n, v in sorted(r.get("results", {}).items()) if v.get("flaky")]
    if flaky:
        lines.append(f"flaky: {len(flaky)} failed, then passed when re-run alone (counted as passed):")
        lines.extend(f"  {sid}: {n}\n          {why[:160]}" for sid, n, why in flaky)
        lines.append("")
    ours_run = [r for r in runs if r["name"] in OURS and r.get("results")]
    if ours_run and status == 0:
        if all(not regressions.get(r["name"]) for r in ours_run):
            lines.append("Every test that passes on InMemorySaver passes on each saver of ours.")
        else:
            lines.append("Every test that passes on InMemorySaver passes on each saver of ours, bar the known differences.")
    ours_total = [r for r in runs if r["name"] in OURS]
    passed_ours = sum(Counter(v["outcome"] for v in r.get("results", {}).values())["passed"] for r in ours_total)
    failed_ours = sum(
        sum(1 for v in r.get("results", {}).values() if v["outcome"] in ("failed", "error")) for r in ours_total
    )
    lines.append(f"ours: {passed_ours} passed, {failed_ours} failed")
    return "\n".join(lines), status


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tests.langgraph_suite",
        description="Run LangGraph's own test suite (from its sdist) against our savers.",
        epilog="Arguments after -- go to every pytest run (e.g. -- -x --lf).",
    )
    parser.add_argument(
        "--savers",
        default="SqliteSaver,memory,sqlite,redis,s3,postgres",
        help="comma-separated, from: InMemorySaver, SqliteSaver, memory, sqlite, redis, s3, postgres, all "
        "(InMemorySaver, the reference, is always run; default: all)",
    )
    parser.add_argument("-k", default="", help="pytest -k expression for every run")
    parser.add_argument("--files", default="", help="comma-separated test files (default: every file using the fixtures)")
    parser.add_argument("--jobs", type=int, default=3, help="pytest processes at a time (default 3: the tests wait more than they compute)")
    parser.add_argument("--timeout", type=int, default=300, help="per-test timeout in seconds (pytest-timeout)")
    parser.add_argument(
        "--retries", type=int, default=1, choices=(0, 1),
        help="re-run each saver's failed tests once in a fresh process; a pass counts, marked flaky (default 1)",
    )
    parser.add_argument("--unbound", action="store_true", help="do not bind our savers to a user (Redis: a fresh prefix per test)")
    parser.add_argument("--redis-db", type=int, default=9, help="database on a local 127.0.0.1:6379 server (default 9)")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help=f"where sdists are unpacked (default {DEFAULT_CACHE})")
    parser.add_argument(
        "--rev",
        default="",
        help="run the savers of this git revision (its checkpointers/ and adapters/, exported with "
        "git archive into the cache) instead of the working tree, e.g. --rev HEAD",
    )
    parser.add_argument("--report-only", action="store_true", help="run nothing: report the last run's results (left in the cache)")
    parser.add_argument("--out", type=Path, help="also write the report to this file")
    parser.add_argument("pytest_args", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.savers.split(",") if n.strip()]
    if "all" in names:
        names = [*CONTROLS, *OURS]
    unknown = [n for n in names if n not in (*CONTROLS, *OURS)]
    if unknown:
        parser.error(f"unknown saver(s) {unknown}; known: {', '.join((*CONTROLS, *OURS))}")
    args.names = [REFERENCE] + [n for n in dict.fromkeys(names) if n != REFERENCE]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    version = langgraph_version()
    root = fetch_suite(version, args.cache)
    files = [f.strip() for f in args.files.split(",") if f.strip()] or suite_files(root)
    out_dir = root / "runs"
    out_dir.mkdir(exist_ok=True)
    if args.report_only:
        report, status = summarize(load_runs(args.names, out_dir), version, files, args)
        print(report)
        if args.out:
            args.out.write_text(report + "\n")
        return status
    args.code_path = [str(export_rev(args.rev, args.cache))] if args.rev else []
    if args.rev:
        print(f"savers from git revision {args.rev} ({args.code_path[0]}), not the working tree")
    args.postgres_url = postgres_url() if "postgres" in args.names else ""
    if "postgres" in args.names:
        if not args.postgres_url:
            print("postgres: no PostgreSQL (POSTGRES_URL unset, nothing on 127.0.0.1:5432): skipped")
            args.names.remove("postgres")
        else:
            print(f"postgres: {args.postgres_url}; a schema of its own per run, dropped after")
    with RedisSource(args.redis_db, wanted="redis" in args.names) as redis_source:
        if "redis" in args.names:
            if not redis_source.url:
                print("redis: no Redis (REDIS_URL unset, nothing on 127.0.0.1:6379, no redis-server): skipped")
                args.names.remove("redis")
            else:
                print(f"redis: {redis_source.reason} ({redis_source.url}); keys under a unique lgsuite-* prefix, removed after")
        print(f"langgraph {version}: {len(files)} files, savers {', '.join(args.names)}, {args.jobs} at a time; logs in {out_dir}", flush=True)
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            # the slowest first (S3 on moto takes several times the others), so they overlap
            slow_first = sorted(args.names, key=lambda n: {"s3": 0, "redis": 1, "postgres": 1, "sqlite": 2}.get(n, 3))
            futures = {
                pool.submit(run_saver, name, root, files, args, redis_source.url, out_dir): name for name in slow_first
            }
            done: dict[str, dict[str, Any]] = {}
            for future in concurrent.futures.as_completed(futures):
                run = future.result()
                print(f"  {run['saver']}: done in {run['elapsed']:.0f}s (pytest exit {run.get('exitstatus')})", flush=True)
                done[futures[future]] = run
            runs = [done[name] for name in args.names]
            if args.retries:
                retry(runs, root, args, redis_source.url, out_dir, pool)
    report, status = summarize(runs, version, files, args)
    print()
    print(report)
    if args.out:
        args.out.write_text(report + "\n")
    return status


if __name__ == "__main__":
    sys.exit(main())
