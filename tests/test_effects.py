"""The journal of side effects (issue 19) on every backend.

Every transition of absent -> intent -> done, the append-only outcome, the
unknown outcome with and without ``reconcile=`` / ``retry_safe=True``, an
exception inside the block, isolation, the records' life with their
partition, integrity, lease fencing, a property over random crash points
against a SQLite ledger standing in for the downstream service, and real
``kill -9`` runs of a worker process (``tests/effects_app.py``) on SQLite, Redis
and PostgreSQL (S3 over HTTP under ``--deep``).
"""

from __future__ import annotations

import asyncio
import doctest
import operator
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langgraph.graph import END, START, StateGraph

import checkpointers.effects as effects_module
from checkpointers import Store
from checkpointers.backends import Backend
from checkpointers.backends.base import Put
from checkpointers.effects import (
    NOT_APPLIED,
    EffectState,
    Journal,
    UnknownOutcomeError,
    effect,
    record_name,
    task_effect_key,
)
from checkpointers.errors import (
    CheckpointerError,
    CorruptItemError,
    InvalidArgumentError,
    InvalidNameError,
    ItemTooLargeError,
    LeaseHeldError,
    LeaseLostError,
    StepMismatchError,
    UnserializableValueError,
)
from tests.effects_app import EFFECTS, Ledger
from tests.test_sigkill import ROOT, store_url

#: Over HTTP, S3 runs the same logic as in-process moto ("s3"), only slower.
DEEP_BACKENDS = {"s3_http"}
SCOPE = "orders/o-17"


def journal_of(store: Store, scope: str = SCOPE) -> Journal:
    return Journal(store.backend, store.integrity, store.partition(scope))


def states(store: Store, scope: str = SCOPE) -> dict[tuple[str, ...], EffectState]:
    return {e.name: e.state for e in journal_of(store, scope).list()}


# -- transitions ------------------------------------------------------------------


def test_absent_intent_done(store: Store) -> None:
    assert states(store) == {}
    with effect(store, SCOPE, "charge", owner="worker-1") as fx:
        # the intent is stored before the block runs
        assert states(store) == {("charge",): EffectState.INTENT}
        assert (fx.state, fx.done, fx.outcome, fx.attempt) == (EffectState.INTENT, False, None, 1)
        assert fx.intent.owner == "worker-1" and fx.intent.lease_token is None
        assert fx.key.startswith("fx-") and len(fx.key) == 35 and fx.key.isascii() and fx.key.isprintable()
        key = fx.key
        assert fx.record({"receipt": 7}) == {"receipt": 7}
        assert fx.done and fx.outcome == {"receipt": 7}
    assert states(store) == {("charge",): EffectState.DONE}
    (info,) = journal_of(store).list()
    assert (info.key, info.intent.owner, info.outcome, info.via) == (key, "worker-1", {"receipt": 7}, "call")
    with effect(store, SCOPE, "charge", owner="worker-2") as again:
        assert again.done and again.outcome == {"receipt": 7} and again.key == key
        assert not again.reconciled and again.unknown_intent is None


def test_store_effect_is_the_same_journal(store: Store) -> None:
    """``store.effect`` is the journal's Store face; its unknown-outcome error is the library's."""
    import checkpointers.errors

    with store.effect(SCOPE, "mail", owner="w1") as fx:
        fx.record("sent")
    with effect(store, SCOPE, "mail") as again:
        assert again.done and again.outcome == "sent" and again.key == fx.key
    with store.effect(SCOPE, "sms", owner="w1"):
        pass  # left without record: the intent stays
    with pytest.raises(checkpointers.errors.UnknownOutcomeError) as err:
        with store.effect(SCOPE, "sms", owner="w2"):
            raise AssertionError("an unknown outcome must not enter the block")
    assert err.value.owner == "w1" and err.value.key.startswith("fx-")
    assert UnknownOutcomeError is checkpointers.errors.UnknownOutcomeError


def test_key_is_stable_and_distinct(store: Store) -> None:
    with effect(store, SCOPE, "a") as a1:
        pass
    with effect(store, SCOPE, "b") as b:
        pass
    with effect(store, "orders/o-18", "a") as other_scope:
        pass
    assert len({a1.key, b.key, other_scope.key}) == 3
    with effect(store, SCOPE, "a", retry_safe=True) as a2:
        assert a2.key == a1.key and a2.attempt == 2


def test_outcome_is_append_only(store: Store) -> None:
    with effect(store, SCOPE, "mail") as fx:
        fx.record(b"\x00receipt")
        assert fx.record(b"\x00receipt") == b"\x00receipt"  # the same again: a no-op
        with pytest.raises(StepMismatchError) as err:
            fx.record(b"other")
        assert err.value.stored_digest != err.value.new_digest and len(err.value.new_digest) == 64
    with effect(store, SCOPE, "mail") as again:
        assert again.outcome == b"\x00receipt"
        again.record(b"\x00receipt")
        with pytest.raises(StepMismatchError):
            again.record({"different": True})
    (info,) = journal_of(store).list()
    assert info.outcome == b"\x00receipt"


def test_outcome_capped_and_checked_before_any_write(backend: Backend) -> None:
    store = Store(backend, max_item_bytes=64).for_user(f"u-{uuid.uuid4().hex}")
    with effect(store, SCOPE, "big") as fx:
        with pytest.raises(ItemTooLargeError) as err:
            fx.record("x" * 100)
        assert err.value.limit == 64
        with pytest.raises(UnserializableValueError):
            fx.record({"n": float("nan")})
        assert not fx.done
    assert states(store) == {("big",): EffectState.INTENT}


# -- unknown outcome --------------------------------------------------------------


def _leave_unknown(store: Store, name: str = "charge") -> str:
    """Enter an effect and leave without an outcome (a crash between call and record)."""
    with effect(store, SCOPE, name, owner="dead-worker") as fx:
        return fx.key


def test_unknown_outcome_raises(store: Store) -> None:
    key = _leave_unknown(store)
    with pytest.raises(UnknownOutcomeError) as err:
        with effect(store, SCOPE, "charge"):
            pytest.fail("the block must not run")
    e = err.value
    assert isinstance(e, CheckpointerError)
    assert (e.key, e.owner, e.lease_token, e.intent.attempt) == (key, "dead-worker", None, 1)
    assert e.at.tzinfo is not None and "reconcile=" in str(e) and key in str(e)
    assert states(store) == {("charge",): EffectState.INTENT}  # nothing changed


def test_reconcile_applied(store: Store) -> None:
    key = _leave_unknown(store)
    asked: list[str] = []

    def reconcile(k: str) -> Any:
        asked.append(k)
        return {"receipt": 7}

    with effect(store, SCOPE, "charge", reconcile=reconcile) as fx:
        assert fx.done and fx.reconciled and fx.outcome == {"receipt": 7}
        assert fx.unknown_intent is not None and fx.unknown_intent.owner == "dead-worker"
    assert asked == [key]
    with effect(store, SCOPE, "charge", reconcile=reconcile) as again:
        assert again.done and not again.reconciled
    assert asked == [key]  # a done effect asks nobody
    (info,) = journal_of(store).list()
    assert info.via == "reconcile"


def test_reconcile_not_applied_proceeds_as_new(store: Store) -> None:
    key = _leave_unknown(store)
    with effect(store, SCOPE, "charge", reconcile=lambda k: NOT_APPLIED, owner="w2") as fx:
        assert not fx.done and not fx.reconciled and fx.attempt == 2 and fx.key == key
        assert fx.intent.owner == "w2" and fx.unknown_intent is not None
        fx.record("sent")
    with effect(store, SCOPE, "charge") as again:
        assert again.outcome == "sent"


def test_retry_safe_proceeds(store: Store) -> None:
    _leave_unknown(store)
    with effect(store, SCOPE, "charge", retry_safe=True) as fx:
        assert not fx.done and fx.attempt == 2
    with effect(store, SCOPE, "charge", retry_safe=True) as fx3:
        assert fx3.attempt == 3
        fx3.record(1)


def test_exception_inside_the_block_leaves_the_intent(store: Store) -> None:
    class Boom(Exception):
        pass

    with pytest.raises(Boom):
        with effect(store, SCOPE, "charge"):
            raise Boom
    assert states(store) == {("charge",): EffectState.INTENT}
    with pytest.raises(UnknownOutcomeError):
        with effect(store, SCOPE, "charge"):
            pass


def test_reconcile_errors_propagate_and_leave_the_intent(store: Store) -> None:
    _leave_unknown(store)

    def down(k: str) -> Any:
        raise ConnectionError("ledger down")

    with pytest.raises(ConnectionError):
        with effect(store, SCOPE, "charge", reconcile=down):
            pass
    assert states(store) == {("charge",): EffectState.INTENT}


def test_concurrent_entries_let_one_attempt_in(store: Store) -> None:
    """Racing entries of one new effect: one writes the intent, every other finds it."""
    barrier, seen = threading.Barrier(4), []

    def enter() -> None:
        barrier.wait()
        try:
            with effect(store, SCOPE, "charge") as fx:
                seen.append("new" if not fx.done else "done")
        except UnknownOutcomeError:
            seen.append("unknown")

    threads = [threading.Thread(target=enter) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(seen) == ["new", "unknown", "unknown", "unknown"]


# -- async --------------------------------------------------------------------------


def test_async_parity(store: Store) -> None:
    async def main() -> None:
        async with effect(store, SCOPE, "a") as fx:
            assert not fx.done
            assert await fx.arecord([1, 2]) == [1, 2]
            assert await fx.arecord([1, 2]) == [1, 2]
            with pytest.raises(StepMismatchError):
                await fx.arecord([3])
        async with effect(store, SCOPE, "a") as again:
            assert again.done and again.outcome == [1, 2]
        async with effect(store, SCOPE, "b"):
            pass
        with pytest.raises(UnknownOutcomeError):
            async with effect(store, SCOPE, "b"):
                pass

        async def reconcile(key: str) -> Any:
            await asyncio.sleep(0)
            return {"found": key}

        async with effect(store, SCOPE, "b", reconcile=reconcile) as settled:
            assert settled.reconciled and settled.outcome == {"found": settled.key}
        infos = await journal_of(store).alist(EffectState.DONE)
        assert {i.name for i in infos} == {("a",), ("b",)}

    asyncio.run(main())


def test_async_reconcile_under_sync_with_is_refused(store: Store) -> None:
    _leave_unknown(store)

    async def reconcile(key: str) -> Any:
        return 1

    with pytest.raises(InvalidArgumentError, match="async with"):
        with effect(store, SCOPE, "charge", reconcile=reconcile):
            pass
    assert states(store) == {("charge",): EffectState.INTENT}


# -- where the records live -------------------------------------------------------------


def test_isolation_between_users(backend: Backend) -> None:
    base = Store(backend)
    alice, bob = base.for_user("alice-" + uuid.uuid4().hex), base.for_user("bob-" + uuid.uuid4().hex)
    with effect(alice, SCOPE, "charge") as a:
        a.record("alice's")
    with effect(bob, SCOPE, "charge") as b:
        assert not b.done and b.attempt == 1 and b.key != a.key
    assert states(bob) == {("charge",): EffectState.INTENT}
    assert states(alice) == {("charge",): EffectState.DONE}
    # the item API never sees effect records
    assert alice.list_items(SCOPE) == [] and alice.get_item(SCOPE, "charge") is None


def test_removed_with_the_partition(store: Store) -> None:
    with effect(store, SCOPE, "charge") as fx:
        fx.record(1)
    with effect(store, "orders/other", "charge") as kept:
        kept.record(2)
    store.backend.drop(store.partition(SCOPE))
    with effect(store, SCOPE, "charge") as fx2:
        assert not fx2.done and fx2.attempt == 1
    assert states(store, "orders/other") == {("charge",): EffectState.DONE}


@pytest.mark.parametrize("backend_name", ["memory", "sqlite"])
def test_saver_thread_operations_treat_effects_with_the_thread(backend: Backend) -> None:
    from checkpointers.savers import Checkpointer

    saver = Checkpointer(backend).for_user("u-" + uuid.uuid4().hex)

    def journal(thread: str) -> Journal:
        return Journal(saver.backend, saver.integrity, saver._partition(None, thread))

    with journal("t1").effect(("", "task-1", "send-email")) as fx:
        fx.record({"id": "m-1"})
    saver.copy_thread("t1", "t2")
    saver.prune(["t1"])
    (copied,) = journal("t2").list()
    assert copied.outcome == {"id": "m-1"} and copied.key == fx.key  # the key the call was made with
    with journal("t2").effect(("", "task-1", "send-email")) as again:
        assert again.done and again.key == fx.key
    assert [e.state for e in journal("t1").list()] == [EffectState.DONE]  # prune keeps effects
    saver.delete_thread("t1")
    assert journal("t1").list() == [] and len(journal("t2").list()) == 1


class Boom(Exception):
    """The node's process "dies" between the call and its record."""


class PayState(TypedDict):
    receipts: Annotated[list[int], operator.add]


def _pay_graph(saver: Any, ledger: Ledger, crash: list[bool], reconcile: bool) -> Any:
    """prep -> pay -> again: ``pay`` and ``again`` each charge once through the journal."""
    def charge(config: Any) -> dict[str, list[int]]:
        thread, parts = task_effect_key(config, "charge")
        journal = Journal(saver.backend, saver.integrity, saver._partition(config, thread))
        with journal.effect(parts, reconcile=ledger.find if reconcile else None) as fx:
            if not fx.done:
                receipt = ledger.apply(fx.key, parts[0].split(":")[0])
                if crash.pop(0):
                    raise Boom
                fx.record({"receipt": receipt})
        return {"receipts": [fx.outcome["receipt"]]}

    g = StateGraph(PayState)
    g.add_node("prep", lambda s: {"receipts": []})
    g.add_node("pay", lambda s, config: charge(config))
    g.add_node("again", lambda s, config: charge(config))
    g.add_edge(START, "prep")
    g.add_edge("prep", "pay")
    g.add_edge("pay", "again")
    g.add_edge("again", END)
    return g.compile(checkpointer=saver)


@pytest.mark.parametrize("reconcile", [True, False], ids=["reconcile", "default"])
@pytest.mark.parametrize("backend_name", ["memory", "sqlite"])
def test_a_graph_task_rerun_finds_its_own_journal(backend: Backend, tmp_path: Path, reconcile: bool) -> None:
    from checkpointers.savers import Checkpointer

    saver = Checkpointer(backend).for_user("u-" + uuid.uuid4().hex)
    ledger = Ledger(tmp_path / "ledger.db")
    crash = [True, False, False]  # pay's first attempt dies after its call
    app = _pay_graph(saver, ledger, crash, reconcile)
    config = {"configurable": {"thread_id": "t-1"}}
    with pytest.raises(Boom):
        app.invoke({"receipts": []}, config)
    if not reconcile:
        with pytest.raises(UnknownOutcomeError):  # the re-run task finds its unknown intent
            app.invoke(None, config)
        assert ledger.counts() == {"pay": 1}
        return
    final = app.invoke(None, config)  # resume: pay re-runs with the same task id
    assert ledger.counts() == {"pay": 1, "again": 1}
    assert len(final["receipts"]) == 2 and len(set(final["receipts"])) == 2
    effects = Journal(saver.backend, saver.integrity, saver._partition(None, "t-1")).list()
    assert [e.name[0].split(":")[0] for e in effects] == ["pay", "again"]  # one journal per task
    assert {e.name[2] for e in effects} == {"charge"} and len({e.name[1] for e in effects}) == 2
    assert effects[0].via == "reconcile" and effects[1].via == "call"
    ledger.close()


def test_key_parts_do_not_collide(store: Store) -> None:
    j = journal_of(store)
    names = [("a/b",), ("a", "b"), ("a", "b", ""), ("",), ("a:b|c",), ("x" * 500,)]
    assert len({record_name(n) for n in names}) == len(names)
    for n in names:
        with j.effect(n) as fx:
            fx.record(list(n))
    assert {e.name: e.outcome for e in j.list()} == {n: list(n) for n in names}


def test_invalid_arguments(store: Store) -> None:
    j = journal_of(store)
    for bad in ((), ("a\x00",), (1,), ("x" * 2000,)):
        with pytest.raises(InvalidNameError):
            j.effect(bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidNameError):
        effect(store, "bad//scope", "k")
    with pytest.raises(InvalidArgumentError):
        j.effect("k", reconcile="nope")  # type: ignore[arg-type]
    assert states(store) == {}


# -- integrity ----------------------------------------------------------------------


def _copy_raw(backend: Backend, src: Any, name: str, dst: Any, dst_name: str) -> None:
    """Copy a record at the storage level, bytes and digest as they are."""
    (rec,) = backend.get(src, [name])
    assert rec is not None
    backend.write(dst, [Put(dst_name, rec.value, rec.digest, rec.etag + "x", dict(rec.tags))])


def test_copied_records_are_corrupt(backend: Backend) -> None:
    base = Store(backend)
    alice, bob = base.for_user("alice-" + uuid.uuid4().hex), base.for_user("bob-" + uuid.uuid4().hex)
    with effect(alice, SCOPE, "charge") as fx:
        fx.record("done")
    src = alice.partition(SCOPE)
    _copy_raw(backend, src, record_name(["charge"]), src, record_name(["refund"]))
    _copy_raw(backend, src, record_name(["charge"]), bob.partition(SCOPE), record_name(["charge"]))
    with pytest.raises(CorruptItemError):
        with effect(alice, SCOPE, "refund"):
            pass
    with pytest.raises(CorruptItemError):
        with effect(bob, SCOPE, "charge"):
            pass
    with pytest.raises(CorruptItemError):
        journal_of(bob).list()


# -- leases ---------------------------------------------------------------------------


class Clock:
    """A wall clock the test moves (seconds since the epoch)."""

    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def test_a_stale_holders_effect_is_refused(backend: Backend) -> None:
    clock = Clock()
    store = Store(backend, clock=clock).for_user(f"u-{uuid.uuid4().hex}")
    first = store.acquire_lease(SCOPE, "worker-a", ttl=10)
    with effect(store, SCOPE, "charge", lease=first) as fx:
        assert fx.intent.owner == "worker-a" and fx.intent.lease_token == first.token
        fx.record("a")
    with pytest.raises(LeaseHeldError):  # no lease on a held scope: refused, as for items
        with effect(store, SCOPE, "unleased"):
            pytest.fail("must not get into the block")
    clock.now += 11  # a's lease expires; b takes over
    second = store.acquire_lease(SCOPE, "worker-b", ttl=10)
    with pytest.raises(LeaseLostError):
        with effect(store, SCOPE, "refund", lease=first):
            pytest.fail("a stale holder must not get into the block")
    assert states(store) == {("charge",): EffectState.DONE}  # nothing of the stale intent
    with effect(store, SCOPE, "refund", lease=second) as fx2:
        assert fx2.intent.lease_token == second.token > first.token
        fx2.record("b")
    with effect(store, SCOPE, "later", lease=second) as fx3:
        clock.now += 11
        third = store.acquire_lease(SCOPE, "worker-c", ttl=10)
        with pytest.raises(LeaseLostError):  # taken over between the call and its record
            fx3.record("c")
    with pytest.raises(UnknownOutcomeError) as err:
        with effect(store, SCOPE, "later", lease=third):
            pass
    assert err.value.lease_token == second.token and err.value.owner == "worker-b"
    assert states(store)[("later",)] is EffectState.INTENT


def test_a_lease_of_another_scope_is_refused(store: Store) -> None:
    other = store.acquire_lease("orders/other", "w", ttl=30)
    with pytest.raises(InvalidArgumentError, match="lease"):
        effect(store, SCOPE, "charge", lease=other)
    with pytest.raises(InvalidArgumentError, match="lease"):
        effect(store, SCOPE, "charge", lease=object())  # type: ignore[arg-type]


# -- crash points -------------------------------------------------------------------------


class Crash(BaseException):
    """A simulated process death at one point of an effect."""


POINTS = ("none", "before_intent", "after_intent", "after_call", "after_outcome")


def _attempt(store: Store, scope: str, ledger: Ledger, name: str, point: str, reconcile: bool) -> str:
    """Perform one effect, crashing at ``point``; what happened to it."""
    if point == "before_intent":
        raise Crash
    try:
        with effect(store, scope, name, reconcile=ledger.find if reconcile else None) as fx:
            if fx.done:
                return "skipped"
            if point == "after_intent":
                raise Crash
            receipt = ledger.apply(fx.key, name)
            if point == "after_call":
                raise Crash
            fx.record({"receipt": receipt})
            if point == "after_outcome":
                raise Crash
            return "applied"
    except UnknownOutcomeError:
        return "unknown"


def _crash_run(store: Store, ledger: Ledger, plan: list[str], reconcile: bool) -> None:
    """Run ``plan`` (a crash point per effect), resume, and check the ledger."""
    scope = f"runs/{uuid.uuid4().hex}"
    names = [f"e{i}" for i in range(len(plan))]
    for name, point in zip(names, plan, strict=True):  # the first run, crashing where planned
        try:
            _attempt(store, scope, ledger, name, point, reconcile)
        except Crash:
            pass
    resumed = {n: _attempt(store, scope, ledger, n, "none", reconcile) for n in names}
    counts = ledger.counts()
    for name, point in zip(names, plan, strict=True):
        assert counts.get(name, 0) <= 1, f"{name} was applied twice"
        if reconcile or point not in ("after_intent", "after_call"):
            assert counts.get(name, 0) == 1 and resumed[name] in ("applied", "skipped")
        else:  # the call may or may not have happened: reported, never guessed
            assert resumed[name] == "unknown"
            assert counts.get(name, 0) == (1 if point == "after_call" else 0)
    if reconcile:
        assert all(e.state is EffectState.DONE for e in journal_of(store, scope).list())


#: The property runs every example here; a quarter of them on the other backends, whose
#: conditional writes the tests above check one by one (it is the journal's logic it explores).
FULL_PROPERTY_BACKENDS = {"memory", "sqlite", "redis"}


def test_crash_points_never_repeat_an_effect_silently(store: Store, tmp_path: Path, backend_name: str) -> None:
    examples = settings.default.max_examples
    if backend_name not in FULL_PROPERTY_BACKENDS:
        examples = max(10, examples // 4)
    ledger = Ledger(tmp_path / "ledger.db")  # every example works in a scope and on effect names of its own

    @settings(max_examples=examples, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(plan=st.lists(st.sampled_from(POINTS), min_size=1, max_size=4), reconcile=st.booleans())
    def check(plan: list[str], reconcile: bool) -> None:
        ledger.reset()
        _crash_run(store, ledger, plan, reconcile)

    try:
        check()
    finally:
        ledger.close()


# -- kill -9 -----------------------------------------------------------------------------


def _worker(url: str, ledger: Path, user: str, scope: str, *args: str) -> list[str]:
    cmd = [
        sys.executable, "-m", "tests.effects_app", "--url", url, "--ledger", str(ledger),
        "--user", user, "--scope", scope, *args,
    ]  # fmt: skip
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)
    killed = "--kill-at" in args
    assert done.returncode == (-signal.SIGKILL if killed else 0), done.stderr
    return done.stdout.split()


@pytest.mark.parametrize("reconcile", [True, False], ids=["reconcile", "default"])
@pytest.mark.parametrize("point", ["before_intent", "after_call", "after_outcome"])
@pytest.mark.parametrize("backend_name", ["sqlite", "redis", "postgres", "s3_http"])
def test_kill_9_at_each_point(
    backend: Backend, request: pytest.FixtureRequest, tmp_path: Path, point: str, reconcile: bool
) -> None:
    url, ledger_path = store_url(backend, request), tmp_path / "ledger.db"
    user, scope = f"u-{uuid.uuid4().hex[:8]}", f"runs/{uuid.uuid4().hex[:8]}"
    flag = ["--reconcile"] if reconcile else []
    first = _worker(url, ledger_path, user, scope, "--kill-at", point, "--kill-effect", "e2", *flag)
    assert first == ["applied:e1"]  # e2 died at the point, e3 never ran
    second = _worker(url, ledger_path, user, scope, *flag)
    ledger = Ledger(ledger_path)
    counts = ledger.counts()
    ledger.close()
    assert all(counts.get(e, 0) <= 1 for e in EFFECTS), f"an effect was applied twice: {counts}"
    e2 = {"before_intent": "applied:e2", "after_outcome": "skipped:e2"}.get(point)
    if e2 is None:  # killed between the call and its record
        e2 = "reconciled:e2" if reconcile else "unknown:e2"
    assert second == ["skipped:e1", e2, "applied:e3"]
    assert counts == {"e1": 1, "e2": 1, "e3": 1}  # e2 applied once: reported as unknown, never repeated
    if not reconcile and point == "after_call":  # a later run with a reconcile settles it
        assert _worker(url, ledger_path, user, scope, "--reconcile") == ["skipped:e1", "reconciled:e2", "skipped:e3"]


def test_docstring_examples() -> None:
    result = doctest.testmod(effects_module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
