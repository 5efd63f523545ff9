"""Run the suite against a target and collect a report per capability group.

Capability groups:

==================  =========================================================
``contract``        the item API over the backend: caps, tags, etags, steps,
                    atomic batches and visibility, corruption detection,
                    records moved, spliced or with forged tags refused
``isolation``       users never meet: fixed hostile ids and hypothesis
                    properties over the encoding, the raw backend, the Store;
                    a record copied from another user's partition refused
``backend``         the backend interface itself: conditions, listing, drop
``langgraph``       a LangGraph saver per user, every method; a config naming
                    another user against a bound view; crafted checkpoint
                    bytes never run code; copied threads refused
``agent_framework`` an Agent Framework ``CheckpointStorage`` per user; crafted
                    pickled leaves never run code; copied checkpoints refused
==================  =========================================================

(The adversarial checks are in :mod:`.adversarial`.) A group that cannot
run against a target (no saver for a plain backend when
``checkpointers.savers`` is missing, no backend behind a saver factory) is
reported *not applicable* with the reason; it never counts as passed. So is
a single check that cannot run (it raises :class:`~.adversarial.NotApplicable`:
the crafted-payload checks need to write behind a saver's back, which only
our own savers and storage allow); the report names it and why.
"""

from __future__ import annotations

import re
import traceback
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from ..backends.base import Backend
from ..store import Store
from .adversarial import (
    AGENT_FRAMEWORK_ADVERSARIAL_CHECKS,
    CONTRACT_ADVERSARIAL_CHECKS,
    ISOLATION_ADVERSARIAL_CHECKS,
    LANGGRAPH_ADVERSARIAL_CHECKS,
    NotApplicable,
)
from .contract import BACKEND_CHECKS, CONTRACT_CHECKS, Api, modes_of
from .isolation import BACKEND_ISOLATION_CHECKS, ISOLATION_CHECKS

__all__ = ["GROUPS", "CheckResult", "Report", "run_checks", "run_suite"]

GROUPS = ("contract", "isolation", "backend", "langgraph", "agent_framework")
#: ``store_factory(backend, max_item_bytes=n)`` -> the Store the item checks use.
StoreFactory = Callable[..., Store]


@dataclass(frozen=True)
class CheckResult:
    """Outcome of one check in one mode (``async``, ``sync``, ``backend``, ``property``, ...).

    ``applicable=False``: the check could not run against this target
    (``detail`` says why); it is neither passed nor failed.
    """

    name: str
    mode: str
    passed: bool
    detail: str = ""
    group: str = ""
    applicable: bool = True


@dataclass
class Report:
    """Every result of one run, plus the groups that did not apply and why."""

    target: str
    results: list[CheckResult] = field(default_factory=list)
    not_applicable: dict[str, str] = field(default_factory=dict)

    @property
    def failed(self) -> list[CheckResult]:
        """The failing results."""
        return [r for r in self.results if not r.passed]

    @property
    def skipped(self) -> list[CheckResult]:
        """The checks that could not run against this target (not applicable)."""
        return [r for r in self.results if not r.applicable]

    def passed_all(self) -> bool:
        """True when something ran and nothing failed (not-applicable groups and checks aside)."""
        return any(r.applicable for r in self.results) and not self.failed

    def format(self, *, verbose: bool = False) -> str:
        """The text report: one line per group, then each failing case with its detail."""
        lines = [f"checkpointers conformance: {self.target}", ""]
        for group in GROUPS:
            rs = [r for r in self.results if r.group == group]
            if group in self.not_applicable:
                lines.append(f"{group:<16} N/A   {self.not_applicable[group]}")
                continue
            bad = [r for r in rs if not r.passed]
            na = [r for r in rs if not r.applicable]
            status = "FAIL" if bad else "PASS" if len(na) < len(rs) else "N/A "
            summary = f"{len(rs) - len(bad) - len(na)} passed" + (f", {len(bad)} failed" if bad else "")
            summary += f", {len(na)} not applicable" if na else ""
            lines.append(f"{group:<16} {status}  {summary}")
            for r in rs:
                if verbose or not r.passed or r.detail:
                    mark = "n/a " if not r.applicable else "ok  " if r.passed else "FAIL"
                    lines.append(f"    {mark} {r.name} [{r.mode}]")
                    if r.detail:
                        lines.append("         " + r.detail.strip().replace("\n", "\n         "))
        failed, skipped = len(self.failed), len(self.skipped)
        tail = f", {skipped} checks not applicable" if skipped else ""
        lines += ["", f"{len(self.results) - failed - skipped} passed, {failed} failed, "
                  f"{len(self.not_applicable)} groups not applicable{tail}"]
        return "\n".join(lines)


def _shorten(detail: str) -> str:
    """Squeeze long runs of one character (1,000-char ids) so a report stays readable."""
    return re.sub(r"(.)\1{15,}", lambda m: f"{m.group(1) * 3}...(x{len(m.group(0))})", detail)


async def _one(
    group: str, check: Callable[..., Awaitable[Any]], mode: str, arg: Callable[[], Any]
) -> CheckResult:
    try:
        async with arg() as value:
            note = await (check() if value is None else check(value))
        return CheckResult(check.__name__, mode, True, note or "", group)
    except NotApplicable as exc:
        return CheckResult(check.__name__, mode, True, f"not applicable: {exc}", group, applicable=False)
    except AssertionError as exc:
        if str(exc):
            detail = str(exc)
        else:  # a bare assert: name the line that failed
            frame = traceback.extract_tb(exc.__traceback__)[-1]
            detail = f"{frame.filename.rsplit('/', 1)[-1]}:{frame.lineno}: {frame.line}"
        return CheckResult(check.__name__, mode, False, _shorten(detail), group)
    except Exception as exc:  # a crash is a failure too, reported with its type
        return CheckResult(check.__name__, mode, False, _shorten(f"{type(exc).__name__}: {exc}"), group)


@asynccontextmanager
async def _nothing() -> AsyncIterator[None]:
    yield None


def _backend_arg(factory: Callable[[], Backend]) -> Callable[[], Any]:
    @asynccontextmanager
    async def arg() -> AsyncIterator[Backend]:
        backend = factory()
        try:
            yield backend
        finally:
            await backend.aclose()

    return arg


def _store_arg(
    factory: Callable[[], Backend], store_factory: StoreFactory, max_item_bytes: int, sync: bool
) -> Callable[[], Any]:
    @asynccontextmanager
    async def arg() -> AsyncIterator[Api]:
        async with _backend_arg(factory)() as backend:
            store = store_factory(backend, max_item_bytes=max_item_bytes).for_user(f"u-{uuid.uuid4().hex}")
            yield Api(store, sync=sync)

    return arg


def _bound_arg(factory: Callable[[], Backend], bind: Callable[[Backend], Any]) -> Callable[[], Any]:
    @asynccontextmanager
    async def arg() -> AsyncIterator[Any]:
        async with _backend_arg(factory)() as backend:
            yield bind(backend)

    return arg


def _given(value: Any) -> Callable[[], Any]:
    @asynccontextmanager
    async def arg() -> AsyncIterator[Any]:
        yield value

    return arg


def saver_binder() -> Callable[[Backend], Callable[[str], Any]]:
    """How to bind our LangGraph saver to a backend; ImportError if it is unavailable."""
    from ..savers import Checkpointer  # type: ignore[import-not-found,unused-ignore]

    return lambda backend: Checkpointer(backend).for_user


def storage_binder() -> Callable[[Backend], Callable[[str], Any]]:
    """How to bind our Agent Framework storage to a backend; ImportError if unavailable."""
    from adapters.agent_framework import IsolatedCheckpointStorage  # type: ignore[import-not-found,unused-ignore]

    return lambda backend: lambda user: IsolatedCheckpointStorage(backend, user=user)


async def run_suite(
    *,
    backend_factory: Callable[[], Backend] | None = None,
    saver_for: Callable[[str], Any] | None = None,
    storage_for: Callable[[str], Any] | None = None,
    store_factory: StoreFactory = Store,
    max_item_bytes: int = 4096,
    target: str = "",
    groups: tuple[str, ...] = GROUPS,
) -> Report:
    """Run every applicable group against a target and return the :class:`Report`.

    Give ``backend_factory`` (a zero-argument callable returning a fresh
    :class:`Backend`; every check gets its own), and/or ``saver_for`` (user ->
    LangGraph saver over one shared store) and/or ``storage_for`` (user ->
    Agent Framework ``CheckpointStorage``). With only a backend, the LangGraph
    and Agent Framework groups run through our own saver and storage when
    they are importable. ``store_factory(backend, max_item_bytes=n)`` builds the
    Store the item checks use (to vet a Store subclass or wrapper).
    ``max_item_bytes`` keeps the cap checks small; the logic is the same at 1 MiB.
    """
    from . import agent_framework_checks, langgraph_checks, properties

    report = Report(target or "(factories)")
    plan: list[tuple[str, Callable[..., Awaitable[Any]], str, Callable[[], Any]]] = []
    # the check lists take a Backend, an Api, a saver or a storage factory: one loop variable for all
    check: Callable[..., Awaitable[Any]]
    checks: Sequence[Callable[..., Awaitable[Any]]]
    if backend_factory is None:
        for group in ("contract", "isolation", "backend"):
            report.not_applicable[group] = "needs a Backend (give a URL or a Backend factory)"
    else:
        f = backend_factory
        for check in BACKEND_CHECKS:
            plan.append(("backend", check, "backend", _backend_arg(f)))
        for group, checks in (
            ("contract", CONTRACT_CHECKS + CONTRACT_ADVERSARIAL_CHECKS),
            ("isolation", ISOLATION_CHECKS + ISOLATION_ADVERSARIAL_CHECKS + properties.PROPERTY_CHECKS_STORE),
        ):
            for check in checks:
                for mode in modes_of(check):
                    plan.append((group, check, mode, _store_arg(f, store_factory, max_item_bytes, mode == "sync")))
        for check in BACKEND_ISOLATION_CHECKS + properties.PROPERTY_CHECKS_BACKEND:
            plan.append(("isolation", check, "backend", _backend_arg(f)))
        plan.append(("isolation", properties.check_prop_encoding, "pure", _nothing))

    for group, given, binder, checks in (
        ("langgraph", saver_for, saver_binder, langgraph_checks.LANGGRAPH_CHECKS + LANGGRAPH_ADVERSARIAL_CHECKS),
        (
            "agent_framework",
            storage_for,
            storage_binder,
            agent_framework_checks.AGENT_FRAMEWORK_CHECKS + AGENT_FRAMEWORK_ADVERSARIAL_CHECKS,
        ),
    ):
        if given is not None:
            arg = _given(given)
        elif backend_factory is not None:
            try:
                arg = _bound_arg(backend_factory, binder())
            except ImportError as exc:
                report.not_applicable[group] = f"not importable here: {exc}"
                continue
        else:
            report.not_applicable[group] = "no factory for this face was given"
            continue
        for check in checks:
            plan.append((group, check, getattr(check, "mode", "property"), arg))

    for group, check, mode, arg in plan:
        if group in groups:
            report.results.append(await _one(group, check, mode, arg))
    for group in GROUPS:
        if group not in groups:
            report.not_applicable.setdefault(group, "not selected")
    return report


async def run_checks(
    backend_factory: Callable[[], Backend],
    *,
    max_item_bytes: int = 4096,
    store_factory: StoreFactory = Store,
) -> list[CheckResult]:
    """Run every applicable check against fresh backends; one result per check and mode.

    Store checks run through the async and the sync API (unless a check is
    meaningful in one mode only).
    """
    report = await run_suite(
        backend_factory=backend_factory, max_item_bytes=max_item_bytes, store_factory=store_factory
    )
    return report.results
