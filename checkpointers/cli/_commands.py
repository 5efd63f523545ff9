"""One function per verb: open what the arguments name, run, print, return the exit code."""

from __future__ import annotations

import argparse
import datetime
import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from .._names import Partition
from ..errors import (
    BackendUnavailableError,
    CheckpointerError,
    ConcurrencyError,
    CorruptItemError,
    DisallowedTypeError,
    StepMismatchError,
)
from ..savers import Checkpointer, default_serde
from . import _inspect, _transfer, _verify
from ._output import Output
from ._scan import thread_partitions

__all__ = ["COMMANDS", "EXIT_CONFLICT", "EXIT_DAMAGED", "EXIT_OK", "EXIT_REFUSED", "EXIT_STORE", "EXIT_USAGE"]

EXIT_OK, EXIT_DAMAGED, EXIT_USAGE, EXIT_STORE, EXIT_REFUSED, EXIT_CONFLICT = 0, 1, 2, 3, 4, 5

Command = Callable[[argparse.Namespace, argparse.ArgumentParser], int]


def _shown(url: str) -> str:
    """A URL without its password, for messages and export headers."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit(parts._replace(netloc=f"{parts.username}:***@{host}"))


def open_store(url: str, *, existing: bool) -> Checkpointer:
    """Our checkpointer on ``url``; ``existing``: a SQLite file must be there already (reads never create one)."""
    parts = urlsplit(url)
    if existing and parts.scheme == "sqlite" and not parts.netloc:
        path = Path(unquote(parts.path[1:]))
        if path.name and not path.exists():
            raise FileNotFoundError(f"{url}: no such SQLite file ({path})")
    return Checkpointer.from_url(url)


def guarded(fn: Command) -> Command:
    """Turn the errors a verb can meet into a message and an exit code."""

    @functools.wraps(fn)
    def run(ns: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
        out = Output(getattr(ns, "json", False), getattr(ns, "quiet", False))
        try:
            return fn(ns, parser)
        except _transfer.ExportError as exc:
            out.error(f"{exc}; nothing was imported")
            return EXIT_REFUSED
        except DisallowedTypeError as exc:
            out.error(f"{exc} (if it is a type of yours, pass --import {exc.module})")
            return EXIT_STORE
        except CorruptItemError as exc:
            out.error(f"{exc} (run `checkpointers verify` to list every damaged record)")
            return EXIT_STORE
        except (StepMismatchError, ConcurrencyError) as exc:
            out.error(f"{exc}; the destination keeps what it holds (the records written before this one stay)")
            return EXIT_CONFLICT
        except (BackendUnavailableError, OSError) as exc:
            out.error(str(exc))
            return EXIT_STORE
        except (ValueError, CheckpointerError) as exc:
            out.error(str(exc))
            return EXIT_USAGE

    return run


@contextmanager
def _store(url: str, *, existing: bool = True) -> Iterator[Checkpointer]:
    saver = open_store(url, existing=existing)
    try:
        yield saver
    finally:
        saver.close()


def _size(n: int) -> str:
    """Bytes for people: ``812 B``, ``16.2 KiB``, ``3.0 GiB``."""
    if n < 1024:
        return f"{n:,} B"
    size = float(n)
    for unit in ("KiB", "MiB", "GiB"):
        size /= 1024
        if size < 1024 or unit == "GiB":
            break
    return f"{size:,.1f} {unit}"


_THREAD_COLUMNS = ("thread", "checkpoints", "writes", "blobs", "bytes", "last write", "expires")


def _thread_row(t: dict[str, Any]) -> list[Any]:
    return [t["thread_id"], t["checkpoints"], t["writes"], t["blobs"], _size(t["bytes"]), t["last_write"], t["expires"]]


def _summaries(ns: argparse.Namespace, out: Output, *, spaces: bool) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every thread's summary (a progress bar over threads) and, with ``spaces``, the other spaces' totals."""
    with _store(ns.url) as saver:
        total = len(saver.backend.partitions(ns.user, "langgraph"))
        with out.progress("reading threads", total) as tick:
            rows = list(_inspect.thread_summaries(saver, ns.user, tick))
        return rows, (_inspect.space_totals(saver, ns.user) if spaces else {})


@guarded
def cmd_threads(ns: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    out = Output(ns.json, ns.quiet)
    rows, _ = _summaries(ns, out, spaces=False)
    if ns.json:
        out.json(rows)
    else:
        title = f"threads of user {ns.user!r} in {_shown(ns.url)}"
        out.table(title, _THREAD_COLUMNS, [_thread_row(t) for t in rows])
    return EXIT_OK


@guarded
def cmd_history(ns: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    out = Output(ns.json, ns.quiet)
    with _store(ns.url) as saver, out.progress("reading records") as tick:
        rows = _inspect.history(saver, ns.user, ns.thread, ns.limit, tick)
    if ns.json:
        out.json(rows)
        return EXIT_OK
    keys = ("checkpoint_id", "checkpoint_ns", "parent_checkpoint_id", "step", "source", "ts", "writes_records")
    cols = ("checkpoint", "ns", "parent", "step", "source", "time", "writes")
    out.table(
        f"history of thread {ns.thread!r} (user {ns.user!r}), newest first", cols, [[r[k] for k in keys] for r in rows]
    )
    return EXIT_OK


@guarded
def cmd_show(ns: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    out = Output(True, ns.quiet)
    with _store(ns.url) as saver:
        shown = _inspect.show(saver, ns.user, ns.thread, ns.checkpoint, ns.ns)
    if shown is None:
        what = f"checkpoint {ns.checkpoint!r}" if ns.checkpoint else "no checkpoint"
        out.error(f"{what} in thread {ns.thread!r} (namespace {ns.ns!r}) of user {ns.user!r}: not found")
        return EXIT_DAMAGED
    out.json(shown)
    return EXIT_OK


@guarded
def cmd_stats(ns: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    out = Output(ns.json, ns.quiet)
    if ns.user is None:
        return _stats_across_users(ns, out)
    rows, others = _summaries(ns, out, spaces=True)
    rows.sort(key=lambda t: -t["bytes"])
    totals = {k: sum(t[k] for t in rows) for k in ("checkpoints", "writes", "blobs", "records", "bytes")}
    data = {"user": ns.user, "threads": len(rows), **totals, "spaces": others, "largest": rows[: ns.top]}
    if ns.json:
        out.json(data)
        return EXIT_OK
    out.line(
        f"user {ns.user!r}: {len(rows)} threads, {totals['checkpoints']} checkpoints, {totals['writes']} writes "
        f"records, {totals['blobs']} blobs, {_size(totals['bytes'])}"
    )
    for space, t in others.items():
        out.line(f"{space}: {t['partitions']} partitions, {t['records']} records, {_size(t['bytes'])}")
    out.table(f"largest {min(ns.top, len(rows))} threads", _THREAD_COLUMNS, [_thread_row(t) for t in rows[: ns.top]])
    return EXIT_OK


_USER_COLUMNS = ("user", "threads", "checkpoints", "writes", "blobs", "bytes", "other partitions")


def _stats_across_users(ns: argparse.Namespace, out: Output) -> int:
    """``stats`` without ``--user``: one row per user holding partitions (``Backend.users()``), largest first."""
    users: list[dict[str, Any]] = []
    with _store(ns.url) as saver:
        names = saver.backend.users()
        with out.progress("reading users", len(names)) as tick:
            for user in names:
                rows = list(_inspect.thread_summaries(saver, user))
                others = _inspect.space_totals(saver, user)
                row = {k: sum(t[k] for t in rows) for k in ("checkpoints", "writes", "blobs", "records", "bytes")}
                row["bytes"] += sum(t["bytes"] for t in others.values())
                row.update(user=user, threads=len(rows), other_partitions=sum(t["partitions"] for t in others.values()))
                users.append(row)
                tick(1)
    users.sort(key=lambda u: -u["bytes"])
    if ns.json:
        out.json({"users": len(users), "bytes": sum(u["bytes"] for u in users), "largest": users[: ns.top]})
        return EXIT_OK
    keys = ("user", "threads", "checkpoints", "writes", "blobs", "bytes", "other_partitions")
    table = [[_size(u[k]) if k == "bytes" else u[k] for k in keys] for u in users[: ns.top]]
    out.line(f"{len(users)} users, {_size(sum(u['bytes'] for u in users))}")
    out.table(f"largest {min(ns.top, len(users))} users", _USER_COLUMNS, table)
    return EXIT_OK


@guarded
def cmd_verify(ns: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    out = Output(ns.json, ns.quiet)
    records, findings, partitions = 0, [], 0
    with _store(ns.url) as saver:
        total = (
            None
            if ns.thread
            else sum(len(saver.backend.partitions(ns.user, s)) for s in ("langgraph", *_inspect.OTHER_SPACES))
        )
        with out.progress("verifying", total) as tick:
            for check in _verify.verify_user(saver, ns.user, ns.thread, tick):
                partitions += 1
                records += check.records
                findings.extend(check.findings)
    if ns.json:
        out.json({"partitions": partitions, "records": records, "problems": [f.as_dict() for f in findings]})
    else:
        if findings:
            cols = ("problem", "space", "partition", "record", "detail")
            rows = [[f.problem, f.space, f.partition, f.record, f.detail] for f in findings]
            out.table(f"{len(findings)} problem(s) for user {ns.user!r}", cols, rows)
        out.line(f"{partitions} partitions, {records} records read, {len(findings)} problem(s)")
    return EXIT_DAMAGED if findings else EXIT_OK


@guarded
def cmd_gc(ns: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    out = Output(ns.json, ns.quiet)
    if ns.keep is not None and ns.keep < 1:
        parser.error("gc: --keep must be >= 1 (to delete a whole thread, use the saver's delete_thread)")
    if ns.user is None and (ns.thread or ns.keep is not None or ns.older_than is not None):
        parser.error("gc: --thread, --keep and --older-than need --user")
    before = None if ns.older_than is None else _cutoff(ns.older_than, parser)
    with _store(ns.url) as saver:
        expired = _collect_expired(saver, out, ns.dry_run)
        results = [] if ns.user is None else _collect_orphans(saver, out, ns, before)
    counts = {k: sum(len(r["deleted"][k]) for r in results) for k in ("checkpoint", "writes", "blob")}
    if ns.json:
        out.json(
            {"dry_run": ns.dry_run, "expired": expired, "threads": len(results), "deleted": counts,
             "per_thread": results}
        )  # fmt: skip
        return EXIT_OK
    verb = "would delete" if ns.dry_run else "deleted"
    if ns.dry_run:
        for e in expired["partitions"]:
            out.line(f"would delete expired {e['space']} partition {e['name']!r} of user {e['user']!r}")
        for r in results:
            for kind, names in r["deleted"].items():
                for name in names:
                    out.line(f"would delete {kind} {name} (thread {r['thread_id']!r})")
    out.line(f"expired partitions (every user): {verb} {expired['count']}")
    if ns.user is not None:
        out.line(
            f"{len(results)} threads: {verb} {counts['checkpoint']} checkpoints, {counts['writes']} writes records, "
            f"{counts['blob']} blobs"
        )
    return EXIT_OK


#: Partitions one ``sweep`` call removes (``gc`` calls it until fewer come back).
_SWEEP_BATCH = 1000


def _collect_expired(saver: Checkpointer, out: Output, dry_run: bool) -> dict[str, Any]:
    """Expired partitions of every user: swept in batches, or (``dry_run``) listed."""
    if dry_run:
        listed = saver.backend.expired(limit=10**9)
        rows = [
            {"user": e.user, "space": e.space, "name": e.name, "expires": _inspect.expiry_text(e.expires_at)}
            for e in listed
        ]
        return {"count": len(rows), "partitions": rows}
    count = 0
    with out.progress("removing expired partitions") as tick:
        while True:
            n = saver.backend.sweep(_SWEEP_BATCH)
            count += n
            tick(n)
            if n < _SWEEP_BATCH:
                break
    return {"count": count, "partitions": []}


def _cutoff(text: str, parser: argparse.ArgumentParser) -> float:
    """``--older-than``: a duration back from now (``30d``, ``12h``, ``90m``, ``45s``) or an ISO 8601 time.

    An ISO time without a zone is UTC.
    """
    units = {"d": 86400, "h": 3600, "m": 60, "s": 1}
    if text[-1:] in units and text[:-1].replace(".", "", 1).isdigit():
        return datetime.datetime.now(datetime.timezone.utc).timestamp() - float(text[:-1]) * units[text[-1]]
    try:
        when = datetime.datetime.fromisoformat(text)
    except ValueError:
        parser.error(f"gc: --older-than {text!r}: expected a duration (30d, 12h, 90m, 45s) or an ISO 8601 time")
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    return when.timestamp()


def _collect_orphans(
    saver: Checkpointer, out: Output, ns: argparse.Namespace, before: float | None
) -> list[dict[str, Any]]:
    """Orphaned blobs and writes (and, with ``--keep``, old checkpoints) of the user's threads."""
    parts = [Partition(ns.user, "langgraph", ns.thread)] if ns.thread else thread_partitions(saver.backend, ns.user)
    results = []
    with out.progress("collecting", len(parts)) as tick:
        for p in parts:
            results.append(_verify.collect(saver, p, ns.keep, ns.dry_run, before))
            tick(1)
    return results


def _serde(ns: argparse.Namespace) -> Any:
    """The serializer values are decoded and encoded with: the savers' own (``--import`` widens its allowlist)."""
    return default_serde()


@guarded
def cmd_export(ns: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    out = Output(ns.json, ns.quiet)
    header = {
        "source": _shown(ns.url),
        "user": ns.user,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(),
    }
    with _store(ns.url) as saver, _transfer.writing(ns.file) as f, out.progress("exporting") as tick:
        counts = _transfer.export_entries(_transfer.OurSource(saver, ns.user), f, _serde(ns), header, tick)
    if ns.json:
        out.json({"file": ns.file, **counts})
    else:
        out.line(
            f"exported {counts['threads']} threads, {counts['checkpoints']} checkpoints, "
            f"{counts['writes']} writes to {ns.file}"
        )
    return EXIT_OK


@guarded
def cmd_import(ns: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    out = Output(ns.json, ns.quiet)
    with out.progress("checking digests") as tick:
        checked = _transfer.check_file(ns.file, tick)
    with _store(ns.url, existing=False) as saver, out.progress("importing", checked["end"]["checkpoints"]) as tick:
        counts = _transfer.import_file(ns.file, saver.for_user(ns.user), _serde(ns), tick)
    if ns.json:
        out.json({"file": ns.file, "user": ns.user, **counts})
    else:
        out.line(
            f"imported {counts['checkpoints']} checkpoints, {counts['writes']} writes "
            f"for user {ns.user!r} into {_shown(ns.url)}"
        )
    return EXIT_OK


def _source(ns: argparse.Namespace) -> _transfer.Source:
    if urlsplit(ns.src).scheme.startswith("langgraph+"):
        from ._langgraph import open_langgraph

        return open_langgraph(ns.src, _serde(ns))
    return _transfer.OurSource(open_store(ns.src, existing=True), ns.from_user if ns.from_user is not None else ns.user)


@guarded
def cmd_migrate(ns: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    out = Output(ns.json, ns.quiet)
    source = _source(ns)
    try:
        with _store(ns.dst, existing=False) as saver, out.progress("migrating checkpoints") as tick:
            counts = _transfer.copy_entries(source, saver.for_user(ns.user), tick)
    finally:
        source.close()
    if ns.json:
        out.json({"source": _shown(ns.src), "destination": _shown(ns.dst), "user": ns.user, **counts})
    else:
        out.line(
            f"migrated {counts['threads']} threads, {counts['checkpoints']} checkpoints, {counts['writes']} writes "
            f"from {_shown(ns.src)} to {_shown(ns.dst)} (user {ns.user!r})"
        )
    return EXIT_OK


COMMANDS: dict[str, Command] = {
    "threads": cmd_threads,
    "history": cmd_history,
    "show": cmd_show,
    "stats": cmd_stats,
    "verify": cmd_verify,
    "gc": cmd_gc,
    "export": cmd_export,
    "import": cmd_import,
    "migrate": cmd_migrate,
}
