"""The S3 batch protocol (:mod:`checkpointers.backends._s3_batch`) on an in-memory fake, without moto.

* The transition table: every allowed transition passes, every other one
  raises :class:`IllegalTransition`.
* Crash sweeps: each kind of batch is crashed at every port call in turn
  (before the call, and after it with the answer lost); a new process then
  reads every name (the old state or the new one, never a mix), recovery
  runs once the lease is over, and the partition holds the old or the new
  state, clean (no manifest, no tombstone left).
* Interleaving sweeps: a read (of every name, and of each name alone) split
  at each of its calls around each call of a write: the old or the new state.
* A stateful hypothesis test (:class:`BatchMachine`): three writers (batches,
  and single records written as the S3 backend writes them: an upsert
  passing the marker on, a create without one), two
  readers and a recoverer, each a thread stopped before every port call,
  interleaved call by call, crashed at any call (before it, or after it with
  the answer lost), each keeping its process (its cache of batches seen
  complete) or restarting; the lease runs out between writes. A model
  follows what the store says committed, as it commits (a manifest deleted
  while its batch's records are there): every operation of the batch must
  have landed (or its condition no longer holds, or it is an append no-op),
  and each committed operation keeps its condition against what was visible
  (a create or an append over nothing, an If-Match over that etag: no lost
  or duplicated append). Between any two calls, every object whose batch is
  settled is what the model holds. A read must see each batch that committed
  while it ran wholly before or wholly after (it reads names one after the
  other, so it is not one snapshot), a write's result must be the model at
  one moment of the write, and after every process dies and recovery runs
  the store is clean and equal to the model.
* Sabotage: the machine run on deliberately broken variants of the protocol
  must fail (:func:`test_the_machine_catches_a_broken_protocol`), and the
  targeted tests on the variants the machine needs many examples for, or
  cannot reach (:func:`test_a_targeted_test_catches_a_broken_protocol`).

Gaps of the protocol found here are fixed, each kept as a test of its own:
a read could see a delete without the rest of its batch
(:func:`test_a_read_never_sees_a_delete_without_the_rest_of_its_batch`) or
a batch's old record beside a record written alone after it
(:func:`test_a_read_never_mixes_a_batch_with_a_later_record_written_alone`;
with the marker passed on, a read meets the batch on that record:
:func:`test_a_record_written_alone_passes_the_batch_marker_on`),
and a recovery running while a batch deletes could drop its tombstone
(:func:`test_recovery_alongside_a_live_writer_keeps_its_batch_whole`).

The normal run uses the project's hypothesis profile ("ci": 40 examples);
``--deep`` loads "deep" (2000).
"""

from __future__ import annotations

import hashlib
import itertools
import random
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from checkpointers.backends._s3_batch import (
    TRANSITIONS,
    Batch,
    Batches,
    BatchState,
    Clock,
    IllegalTransition,
    _Recovered,
    inherited,
)
from checkpointers.backends._s3_objects import (
    Obj,
    OptimisticManifest,
    RedoLog,
    as_record,
    decode_manifest,
    decode_object,
    record_body,
)
from checkpointers.backends.base import Conflict, Delete, Mode, Put, Record, content_digest
from tests.s3_fake import Action, Call, Crash, Event, FakeKeys, FakeStore

pytestmark = pytest.mark.timeout(600)

LEASE = 60.0
T0 = 10**18  # the fake wall clock's start, in ns
KEYS = FakeKeys()


class World:
    """A fake wall clock (batch ids, the lease), a monotonic clock that ticks per read, fixed ids."""

    def __init__(self) -> None:
        self.now = T0
        self._ids = itertools.count(1)
        self._ticks = itertools.count(1)
        self.clock = Clock(now_ns=lambda: self.now, monotonic=lambda: next(self._ticks) * 1e-3, sleep=lambda _: None)

    def new_id(self) -> str:
        return f"{next(self._ids):032x}"

    def expire(self) -> None:
        """Let the lease of every batch written so far run out."""
        self.now += int((LEASE + 1) * 1e9)


def batches(store: FakeStore, world: World, protocol: type[Batches] = Batches, **options: Any) -> Batches:
    """A process running ``protocol`` over ``store`` (a new one: nothing seen complete yet)."""
    options.setdefault("new_id", world.new_id)
    return protocol(store, where="fake", lease=LEASE, read_timeout=10.0, clock=world.clock, **options)


def make_put(name: str, content: str, mode: Mode = Mode.APPEND, tag: str = "", if_match: str | None = None) -> Put:
    """A put of ``content`` (its digest: the same content is an append no-op), etag ``<tag or content>-<name>``."""
    value = content.encode()
    return Put(name, value, hashlib.sha256(value).hexdigest(), f"{tag or content}-{name}", {}, mode, if_match)


def reseq(put: Put, seq: int, floor: int) -> int:
    return seq if seq > floor else floor + 1


def visible_state(b: Batches, names: list[str]) -> dict[str, Record | None]:
    return {n: (o.record if o else None) for n, o in zip(names, b.read(KEYS, names), strict=True)}


def shuffled(seed: int) -> Any:
    """A ``parallel`` that makes a batch's parallel requests one by one, in an order drawn from ``seed``."""
    rng = random.Random(seed)

    def parallel(fn: Callable[[Any], Any], items: Any) -> list[Any]:
        items = list(items)
        order = list(range(len(items)))
        if seed:
            rng.shuffle(order)
        results: dict[int, Any] = {}
        for i in order:
            results[i] = fn(items[i])
        return [results[i] for i in range(len(items))]

    return parallel


def short(state: dict[str, Record | None]) -> dict[str, str | None]:
    """A state by record etag (``w<write>-<name>``)."""
    return {n: r.etag if r else None for n, r in state.items()}


def leftovers(store: FakeStore) -> list[str]:
    """Manifests and tombstones still stored."""
    left = [k for k in store.objects if k.startswith(KEYS.manifests)]
    for key, got in store.objects.items():
        if key.startswith(KEYS.records) and decode_object(KEYS.name_of(key), got.body, got.etag).record is None:
            left.append(key)
    return sorted(left)


# -- the transition table ----------------------------------------------------------------


@pytest.mark.parametrize("old", list(BatchState), ids=lambda s: s.name)
def test_every_transition_not_in_the_table_raises(old: BatchState) -> None:
    for new in BatchState:
        batch = Batch("00000000000000000001-" + "0" * 32, old)
        if new in TRANSITIONS[old]:
            batch.to(new)
            assert batch.state is new
        else:
            with pytest.raises(IllegalTransition, match=f"{old.name} -> {new.name} is not allowed"):
                batch.to(new)
            assert batch.state is old


def test_the_table_covers_every_state_and_final_states_are_final() -> None:
    assert set(TRANSITIONS) == set(BatchState)
    final = {s for s, nexts in TRANSITIONS.items() if not nexts}
    assert final == {BatchState.COMMITTED, BatchState.ABORTED, BatchState.GONE, BatchState.DAMAGED}
    reachable = {BatchState.NEW, BatchState.SEEN}
    for _ in BatchState:
        reachable |= {n for s in reachable for n in TRANSITIONS[s]}
    assert reachable == set(BatchState)


# -- crash sweeps ---------------------------------------------------------------------------


@dataclass
class Scenario:
    """A partition set up by ``setup``, then one write; ``names`` are read to compare states."""

    names: list[str]
    setup: Callable[[Batches, FakeStore, World], None]
    write: Callable[[Batches], Any]
    refused: bool = False  #: the write is refused: the new state is the old one


def _optimistic(b: Batches) -> Any:
    return b.write(KEYS, [make_put(n, "new") for n in "abc"], [], [100, 101, 102], reseq)


def _existing(*names: str, content: str = "old") -> Callable[[Batches, FakeStore, World], None]:
    """Records written one by one (as the S3 backend writes a single put: no batch, no marker)."""

    def setup(b: Batches, store: FakeStore, world: World) -> None:
        for i, n in enumerate(names):
            store.put_if(KEYS.record(n), record_body(make_put(n, content, Mode.UPSERT), 1 + i))

    return setup


def _hidden_a(b: Batches, store: FakeStore, world: World) -> None:
    """Another process crashed inside an optimistic batch after its record "a" landed (long ago)."""
    store.crash_on("put", key_contains="/r/a", after=True)
    with pytest.raises(Crash):
        b.write(KEYS, [make_put("a", "lost"), make_put("q", "lost")], [], [1, 2], reseq)
    world.expire()


def _redo(b: Batches) -> Any:
    puts = [make_put("a", "new", Mode.UPSERT), make_put("b", "new", Mode.UPSERT)]
    return b.write(KEYS, puts, [Delete("c")], [100, 101], reseq)


def _redo_upserts(b: Batches) -> Any:
    puts = [make_put(n, "new", Mode.UPSERT) for n in "abc"]
    return b.write(KEYS, puts, [], [100, 101, 102], reseq)


def _fallback(b: Batches) -> Any:
    return b.write(KEYS, [make_put("a", "new"), make_put("b", "new")], [], [100, 101], reseq)


def _conflict(b: Batches) -> Any:
    return b.write(KEYS, [make_put("a", "new"), make_put("b", "other")], [], [100, 101], reseq)


def _fenced(b: Batches) -> Any:
    """A redo-log batch whose first operation is an etag condition (a fenced write's lease record first)."""
    puts = [make_put("a", "new", Mode.IF_MATCH, if_match="old-a"), make_put("b", "new", Mode.UPSERT)]
    return b.write(KEYS, puts, [Delete("c")], [100, 101], reseq)


def _fenced_delete(b: Batches) -> Any:
    """A redo-log batch whose only etag condition is a delete, the last operation."""
    puts = [make_put("a", "new", Mode.UPSERT), make_put("b", "new", Mode.UPSERT)]
    return b.write(KEYS, puts, [Delete("c", if_match="old-c")], [100, 101], reseq)


SCENARIOS = {
    "optimistic": Scenario(list("abc"), lambda b, s, w: None, _optimistic),
    "optimistic-append-noop": Scenario(list("abc"), _existing("b", content="new"), _optimistic),
    "optimistic-conflict": Scenario(list("ab"), _existing("b"), _conflict, refused=True),
    "optimistic-then-redo": Scenario(list("ab"), _hidden_a, _fallback),
    "redo": Scenario(list("abc"), _existing("a", "b", "c"), _redo),
    "redo-upserts": Scenario(list("abc"), _existing("a", "b", "c"), _redo_upserts),
    "redo-fenced": Scenario(list("abc"), _existing("a", "b", "c"), _fenced),
    "redo-fenced-delete": Scenario(list("abc"), _existing("a", "b", "c"), _fenced_delete),
}


def _sweep(scenario: Scenario, n: int, after: bool, read_first: bool = True) -> tuple[str, str]:
    """Crash the write at its ``n``-th call; what a new process reads, then what recovery leaves.

    Without ``read_first``, recovery runs first (so it, not a reader, settles the crashed batch).
    """
    store, world = FakeStore(), World()
    scenario.setup(batches(store, world), store, world)
    old = visible_state(batches(store, world), scenario.names)
    writer = batches(store, world)
    store.crash_at(n, after=after)
    try:
        result = scenario.write(writer)
    except Crash:
        result = None
    store.disarm()
    assert not isinstance(result, Conflict) or scenario.refused
    seen = visible_state(batches(store, world), scenario.names) if read_first else old
    world.expire()
    batches(store, world).recover(KEYS)
    final = visible_state(batches(store, world), scenario.names)
    assert leftovers(store) == [], f"crash at call {n} (after={after}): left {leftovers(store)}"

    def label(state: dict[str, Record | None]) -> str:
        if state == old:
            return "old"
        contents = {n: r.value if r else None for n, r in state.items()}
        return "new" if not scenario.refused and _is_new(scenario, contents) else f"MIXED {contents}"

    return label(seen), label(final)


def _is_new(scenario: Scenario, contents: dict[str, bytes | None]) -> bool:
    name = next(k for k, v in SCENARIOS.items() if v is scenario)
    deleted_c = {"a": b"new", "b": b"new", "c": None}
    want = {"redo": deleted_c, "redo-fenced": deleted_c, "redo-fenced-delete": deleted_c}.get(name)
    return contents == want if want is not None else all(v == b"new" for v in contents.values())


def _calls(scenario: Scenario) -> int:
    store, world = FakeStore(), World()
    scenario.setup(batches(store, world), store, world)
    before = store.calls
    scenario.write(batches(store, world))
    return store.calls - before


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_a_crash_at_any_call_leaves_the_old_or_the_new_state(name: str) -> None:
    scenario = SCENARIOS[name]
    total = _calls(scenario)
    assert total >= 4
    outcomes = {}
    for n in range(1, total + 1):
        for after in (False, True):
            _, recovered = _sweep(scenario, n, after, read_first=False)
            seen, final = _sweep(scenario, n, after)
            assert "MIXED" not in seen and "MIXED" not in final + recovered, (n, after, seen, final, recovered)
            assert not (seen == "new" and final == "old"), f"crash at call {n}: recovery undid a visible batch"
            outcomes[n, after] = final
    assert outcomes[total, True] == ("old" if scenario.refused else "new")  # the last call landed
    assert outcomes[1, False] == "old"


def _states(scenario: Scenario, names: list[str]) -> tuple[dict[str, Record | None], dict[str, Record | None]]:
    """What ``names`` hold before the write and after it (run alone)."""
    store, world = FakeStore(), World()
    scenario.setup(batches(store, world), store, world)
    before = visible_state(batches(store, world), names)
    scenario.write(batches(store, world))
    return before, visible_state(batches(store, world), names)


def _interleaved(scenario: Scenario, names: list[str], first: int, split: int) -> tuple[Any, Any]:
    """A write makes its first ``first`` calls, a read its first ``split``, the write ends, then the read.

    Returns what the read saw and what a read after both sees.
    """
    store, world = FakeStore(gate=_gate), World()
    scenario.setup(batches(store, world), store, world)
    writer, reader = Actor("writer"), Actor("reader")
    writer.start(lambda: scenario.write(batches(store, world)), 0)
    for _ in range(first):
        if not writer.done:
            writer.step()
    reader.start(lambda: batches(store, world).read(KEYS, names), 0)
    for _ in range(split):
        if not reader.done:
            reader.step()
    while not writer.done:
        writer.step()
    while not reader.done:
        reader.step()
    for actor in (writer, reader):
        if actor.error is not None:
            raise actor.error
    got = {n: (o.record if o else None) for n, o in zip(names, reader.outcome, strict=True)}
    return got, visible_state(batches(store, world), names)


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_a_read_interleaved_with_a_write_sees_all_of_it_or_nothing(name: str) -> None:
    """Every split of a read (all names, and each name alone) around every call of a write: old or new, never mixed."""
    scenario = SCENARIOS[name]
    total = _calls(scenario)
    for names in [scenario.names, *([n] for n in scenario.names)]:
        old, new = _states(scenario, names)
        seen = []
        for first in range(total + 1):
            for split in range(2 * len(names) + 4):
                got, after = _interleaved(scenario, names, first, split)
                assert got in (old, new), f"{names}: write at call {first}, read at {split}: {short(got)}"
                assert after == new
                seen.append(got)
        assert old in seen and new in seen


def test_crash_points_by_kind_and_count() -> None:
    store, world = FakeStore(), World()
    b = batches(store, world)
    store.crash_on("delete", key_contains="/tx/")  # before the commit
    with pytest.raises(Crash):
        _optimistic(b)
    assert visible_state(batches(store, world), list("abc")) == dict.fromkeys("abc")
    assert sorted(k for k in store.objects if "/r/" in k) == ["p/r/a", "p/r/b", "p/r/c"]  # landed, hidden
    store.crash_on("delete", key_contains="/tx/", after=True)  # the commit lands, the writer dies
    with pytest.raises(Crash):
        b.write(KEYS, [make_put("d", "new"), make_put("e", "new")], [], [200, 201], reseq)
    assert [r.value for r in visible_state(batches(store, world), ["d", "e"]).values()] == [b"new", b"new"]
    store.crash_at(2)
    with pytest.raises(Crash):
        b.read(KEYS, ["d", "e"])
    assert store.get(KEYS.record("d")) is not None


@pytest.fixture
def protocol() -> type[Batches]:
    """The protocol the targeted tests run (the sabotage tests pass broken variants instead)."""
    return Batches


def test_a_read_never_sees_a_delete_without_the_rest_of_its_batch(protocol: type[Batches]) -> None:
    """A multi-record read does not see a redo-log batch's delete without its put (a gap, fixed).

    The reader GETs "a" (the old record, no marker), then the whole batch
    {upsert a, delete b} lands, commits and drops b's tombstone, then the
    reader GETs "b": absent, no marker. Nothing it read names the batch, so
    it did not read again: old "a" with the batch's delete of "b". Found by
    :class:`BatchMachine`. Now a multi-record read that finds a name absent
    GETs every name again and repeats unless all are as it first read them.
    """
    store, world = FakeStore(), World()
    for i, name in enumerate("ab"):  # records without a marker (written one by one)
        store.put_if(KEYS.record(name), record_body(make_put(name, "old", Mode.UPSERT), i + 1))
    writer = batches(store, world, protocol)
    fired: list[Call] = []

    def gate(call: Call) -> Action:
        if call.kind == "get" and call.key == KEYS.record("b") and not fired:
            fired.append(call)  # between the reader's two GETs, the whole batch
            writer.write(KEYS, [make_put("a", "new", Mode.UPSERT)], [Delete("b")], [10], reseq)
        return Action.GO

    store.gate = gate
    got = visible_state(batches(store, world, protocol), ["a", "b"])
    assert fired
    a, b = got["a"], got["b"]
    assert a is not None
    assert (a.value, b is None) in ((b"new", True), (b"old", False)), f"part of the batch: {short(got)}"


def _read_across_a_batch_of_this_process(protocol: type[Batches], order: str, touched: str) -> tuple[int, Any]:
    """Read ``order`` in a process that, just before the read's GET of "l", commits {upsert l, upsert ``touched``}.

    The read meets the batch's marker on "l" and finds it GONE (this same
    process committed it after the read began). Returns how many times "l"
    was read and what the read returned.
    """
    store, world = FakeStore(), World()
    process = batches(store, world, protocol)
    process.write(KEYS, [make_put(n, "old", Mode.UPSERT) for n in "lkm"], [], [1, 2, 3], reseq)  # all marked
    gets: list[Call] = []  # the read's GETs of "l" (not the batch's own)
    writing = threading.Event()

    def gate(call: Call) -> Action:
        if call.kind == "get" and call.key == KEYS.record("l") and not writing.is_set():
            gets.append(call)
            if len(gets) == 1:
                writing.set()
                puts = [make_put("l", "new", Mode.UPSERT), make_put(touched, "new", Mode.UPSERT)]
                process.write(KEYS, puts, [], [10, 11], reseq)
                writing.clear()
        return Action.GO

    store.gate = gate
    got = visible_state(process, list(order))
    return len(gets), got


def test_a_read_that_met_a_known_batch_whole_is_not_repeated(protocol: type[Batches]) -> None:
    """Readers under a stream of one process's batches are not starved (the five-writers-under-one-lease gap).

    Every fenced batch re-puts the lease record with its marker, so a
    batch's pre-read of {lease record, its own names} met the marker of the
    batch fenced just before it, found it GONE, and repeated, again and
    again, until ``read_timeout`` (``test_leases.py``,
    ``test_concurrent_writes_of_one_holder_do_not_fail``). The batch here
    changes "l" and "m"; the read of "l" and "k" met it whole (on "l",
    carrying its marker), so it is not repeated: "l" is read once (every
    record read carries a marker: no second collect).
    """
    reads, got = _read_across_a_batch_of_this_process(protocol, "lk", touched="m")
    assert short(got) == {"l": "new-l", "k": "old-k"}
    assert reads == 1, f'"l" read {reads} times: the read was repeated'


def test_a_read_that_met_a_known_batch_half_is_repeated(protocol: type[Batches]) -> None:
    """The same batch changing "k" too, which the read GET before the batch: it is repeated, never half of it."""
    reads, got = _read_across_a_batch_of_this_process(protocol, "kl", touched="k")
    assert short(got) == {"k": "new-k", "l": "new-l"}, f"part of the batch: {short(got)}"
    assert reads >= 2


def test_a_read_never_mixes_a_batch_with_a_later_record_written_alone(protocol: type[Batches]) -> None:
    """A record written alone (no marker) over one of a batch that committed under a read: the read is repeated.

    The reader GETs "y" (old), then a batch {upsert a, upsert y} commits and
    a single upsert replaces "a" (a read, then a PUT If-Match) without the
    batch's marker, then the reader GETs "a". Without the second collect it
    returned old "y" with the "a" written after the batch. (The S3 backend's
    single writes pass the marker on, see the next test; a record created
    alone on a name a batch deleted carries none, and the same holds.)
    """
    _read_around_a_batch_and_a_record_written_alone(protocol, inherit=False)


def test_a_record_written_alone_passes_the_batch_marker_on(protocol: type[Batches]) -> None:
    """The same, the record written alone carrying the marker of the one it replaced (``inherited``).

    A read that trusts its first collect (as a listing does for records
    without a marker) meets the batch on that record, settles it (gone:
    committed) and repeats: it sees the batch, not its old state beside
    the later record.
    """
    _read_around_a_batch_and_a_record_written_alone(protocol, inherit=True)
    _read_around_a_batch_and_a_record_written_alone(_ReadWithoutSecondCollect, inherit=True)


def _read_around_a_batch_and_a_record_written_alone(protocol: type[Batches], inherit: bool) -> None:
    store, world = FakeStore(), World()
    for i, name in enumerate("ya"):
        store.put_if(KEYS.record(name), record_body(make_put(name, "old", Mode.UPSERT), i + 1))
    writer = batches(store, world, protocol)
    fired: list[Call] = []

    def gate(call: Call) -> Action:
        if call.kind == "get" and call.key == KEYS.record("a") and not fired:
            fired.append(call)
            puts = [make_put("a", "new", Mode.UPSERT), make_put("y", "new", Mode.UPSERT)]
            writer.write(KEYS, puts, [], [10, 11], reseq)
            (cur,) = writer.read(KEYS, ["a"])
            assert cur is not None
            body = record_body(make_put("a", "alone", Mode.UPSERT), 20, inherited(cur) if inherit else None)
            assert store.put_if(KEYS.record("a"), body, match=cur.s3etag)
            assert decode_object("a", store.objects[KEYS.record("a")].body, "").tx == (cur.tx if inherit else None)
        return Action.GO

    store.gate = gate
    got = visible_state(batches(store, world, protocol), ["y", "a"])
    assert fired
    assert {n: r.value if r else None for n, r in got.items()} == {"y": b"new", "a": b"alone"}


def test_recovery_alongside_a_live_writer_keeps_its_batch_whole(protocol: type[Batches]) -> None:
    """A recovery running while a redo-log batch is applied keeps that batch's tombstones (a gap, fixed).

    The recovery lists the manifests before the writer stores its own, then
    (sweeping tombstones) finds the writer's first tombstone and deletes it:
    the record was then absent without a marker, while the batch was not
    committed, and a reader saw "a" deleted and "b" not. Now the sweep lists
    the manifests after reading the tombstones and keeps those of a batch
    still listed.
    """
    store, world = FakeStore(), World()
    for i, name in enumerate("ab"):
        store.put_if(KEYS.record(name), record_body(make_put(name, "old", Mode.UPSERT), i + 1))
    recovery = batches(store, world, protocol)
    seen: dict[str, Any] = {}

    def gate(call: Call) -> Action:
        if call.kind == "put" and call.key == KEYS.record("b") and "done" not in seen:
            seen["done"] = True  # the writer landed a's tombstone; before b's, a recovery's sweep and a reader
            recovery._sweep_tombstones(KEYS)  # what recover() does after its (earlier) manifest listing
            seen["read"] = visible_state(batches(store, world, protocol), ["a", "b"])
        return Action.GO

    store.gate = gate
    batches(store, world, protocol).write(KEYS, [], [Delete("a"), Delete("b")], [], reseq)
    got = seen["read"]
    assert (got["a"] is None) == (got["b"] is None), f"a reader saw part of the batch: {short(got)}"


def test_a_live_writer_aborted_by_recovery_is_told(protocol: type[Batches]) -> None:
    """A writer slower than the lease: a recovery aborts its batch; its commit then raises, nothing is visible."""
    from checkpointers.errors import BackendUnavailableError

    store, world = FakeStore(), World()
    slow = batches(store, world, protocol)

    def gate(call: Call) -> Action:
        if call.kind == "delete" and "/tx/" in call.key and not gate.done:  # type: ignore[attr-defined]
            gate.done = True  # type: ignore[attr-defined]
            world.expire()
            assert batches(store, world, protocol).recover(KEYS).aborted == 1
        return Action.GO

    gate.done = False  # type: ignore[attr-defined]
    store.gate = gate
    with pytest.raises(BackendUnavailableError, match="aborted by a recovery"):
        _optimistic(slow)
    store.gate = None
    assert visible_state(batches(store, world, protocol), list("abc")) == dict.fromkeys("abc")
    assert leftovers(store) == []


FENCES = {
    "if-match-put-first": (
        [make_put("l", "old", Mode.IF_MATCH, if_match="old-l"), make_put("a", "new", Mode.UPSERT)], [], 0
    ),
    "if-match-delete-last": ([make_put("a", "new", Mode.UPSERT)], [Delete("l", if_match="old-l")], 1),
}


def test_a_batch_whose_etag_condition_fails_after_its_pre_read_commits_nothing(protocol: type[Batches]) -> None:
    """The fence: a record conditioned on its etag, replaced between the batch's pre-read and its apply.

    The lease race of a fenced write on S3: the holder's batch pre-reads the
    lease record "l" and logs its manifest; before its first conditional PUT
    another process takes the lease over (replaces "l"). The batch's first
    etag condition is now applied alone, before the rest: refused, the batch
    is aborted (nothing of it lands, no manifest is left) and the conflict
    names that operation. Before, the refused operation was dropped as
    "superseded" and "a" landed. Both shapes: the condition first (as the
    store puts a lease's) and last (a conditional delete).
    """
    for shape in FENCES:
        _fence_overtaken(protocol, shape)


def _fence_overtaken(protocol: type[Batches], shape: str) -> None:
    puts, deletes, index = FENCES[shape]
    store, world = FakeStore(), World()
    for i, name in enumerate("la"):
        store.put_if(KEYS.record(name), record_body(make_put(name, "old", Mode.UPSERT), i + 1))
    fired: list[Call] = []

    def gate(call: Call) -> Action:
        if call.kind == "put" and call.key.startswith(KEYS.records) and not fired:
            fired.append(call)  # the writer's first record PUT: another process takes "l" over first
            (cur,) = batches(store, world, protocol).read(KEYS, ["l"])
            assert cur is not None
            store.put_if(KEYS.record("l"), record_body(make_put("l", "taken", Mode.UPSERT), 50), match=cur.s3etag)
        return Action.GO

    store.gate = gate
    out = batches(store, world, protocol).write(KEYS, puts, deletes, [10 + i for i in range(len(puts))], reseq)
    store.gate = None
    assert fired
    assert isinstance(out, Conflict), f"{shape}: the batch committed over a changed condition: {out}"
    assert out.index == index and out.name == "l" and out.existing is not None and out.existing.value == b"taken"
    assert short(visible_state(batches(store, world, protocol), ["l", "a"])) == {"l": "taken-l", "a": "old-a"}
    assert leftovers(store) == []


# -- the stateful test -----------------------------------------------------------------------

NAMES = ("a", "b", "c", "d", "e", "f", "g")
WRITERS = ("w1", "w2", "w3")
KINDS = ("append", "append", "create", "upsert", "upsert", "if-match", "delete", "delete-if")
READERS = ("r1", "r2")
_CURRENT = threading.local()


@dataclass
class Intent:
    """One write a writer was asked to make, and what became of it."""

    no: int
    puts: list[Put]
    deletes: list[Delete]
    seqs: list[int]
    txs: set[str] = field(default_factory=set)  #: the ids of its batches (an optimistic try, then the redo log)
    committed: bool = False  #: something of it became visible

    @property
    def names(self) -> set[str]:
        return {p.name for p in self.puts} | {d.name for d in self.deletes}

    def put(self, name: str) -> Put | None:
        return next((p for p in self.puts if p.name == name), None)


class Actor:
    """A thread running one operation at a time, stopped before each of its port calls until stepped."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.done = True
        self.call: Call | None = None
        self.outcome: Any = None
        self.error: BaseException | None = None
        self.intent: Intent | None = None
        self.names: list[str] = []
        self.started = 0  #: the model's version when the operation started
        self.process: Batches | None = None  #: kept from one operation to the next, unless restarted
        self._go = threading.Semaphore(0)
        self._parked = threading.Semaphore(0)
        self._action = Action.GO

    def __repr__(self) -> str:
        return self.name

    def start(self, fn: Callable[[], Any], started: int) -> None:
        self.done, self.outcome, self.error, self.call, self.started = False, None, None, None, started
        threading.Thread(target=self._run, args=(fn,), daemon=True, name=self.name).start()
        self._wait()

    def _run(self, fn: Callable[[], Any]) -> None:
        _CURRENT.actor = self
        try:
            self.outcome = fn()
        except BaseException as exc:  # noqa: BLE001 - Crash included: recorded, checked by the machine
            self.error = exc
        finally:
            self.call = None
            self.done = True
            self._parked.release()

    def gate(self, call: Call) -> Action:
        """In the actor's thread: park before ``call`` until the machine steps it."""
        self.call = call
        self._parked.release()
        self._go.acquire()
        return self._action

    def step(self, action: Action = Action.GO) -> None:
        self._action = action
        self._go.release()
        self._wait()

    def _wait(self) -> None:
        if not self._parked.acquire(timeout=60):
            raise AssertionError(f"{self.name} did not reach its next call within 60 s")


def _gate(call: Call) -> Action:
    actor: Actor | None = getattr(_CURRENT, "actor", None)
    return actor.gate(call) if actor is not None else Action.GO


class Model:
    """What the store says is committed, updated at each commit (a manifest's DELETE), checked as it happens."""

    def __init__(self, store: FakeStore, intents: dict[str, Intent]) -> None:
        self.store = store
        self.intents = intents
        self.state: dict[str, Record | None] = dict.fromkeys(NAMES)
        self.history = [dict(self.state)]
        self.changed: list[set[str]] = [set()]  #: per version, the names its commit changed
        self.alone: set[str] = set()  #: etags of the records written alone (outside the protocol)

    @property
    def version(self) -> int:
        return len(self.history) - 1

    def seen(self, since: int, want: dict[str, Record | None]) -> bool:
        """Whether the model equalled ``want`` (on its names) at one version from ``since`` on."""
        return any(all(h[n] == r for n, r in want.items()) for h in self.history[since:])

    def atomic(self, since: int, got: dict[str, Record | None]) -> bool:
        """Whether a read that ran from version ``since`` on and returned ``got`` saw every batch whole.

        Each name must hold a value the model gave it at some version since
        ``since`` (its read time), and for every batch committed in that
        window, the names it changed were all read before it or all after it.
        (A read is not one snapshot: names are read one after the other, so
        two batches may be seen in either order.)
        """
        window = range(since, len(self.history))
        options = [[v for v in window if self.history[v][n] == r] for n, r in got.items()]
        commits = [(v, self.changed[v]) for v in window if v > since]
        names = list(got)
        for versions in itertools.product(*options):
            at = dict(zip(names, versions, strict=True))
            if all(len({at[n] >= v for n in changed if n in at}) <= 1 for v, changed in commits):
                return True
        return False

    def _obj(self, name: str) -> Obj | None:
        got = self.store.objects.get(KEYS.record(name))
        return None if got is None else decode_object(name, got.body, got.etag)

    def observe(self, event: Event) -> None:
        call = event.call
        if call.kind == "put" and call.key.startswith(KEYS.records) and event.result is not None:
            self._single(event)
        if call.kind != "delete" or not call.key.startswith(KEYS.manifests) or event.before is None:
            return
        if event.after is not None:
            return  # refused
        tx = call.key[len(KEYS.manifests) :]
        intent = self.intents[tx.split("-", 1)[1]]
        manifest = decode_manifest(tx, event.before.body)
        if isinstance(manifest, OptimisticManifest):
            changes = self._optimistic_commit(tx, manifest, intent)
        else:
            changes = self._redo_commit(tx, manifest)
        if not changes:
            return  # an abort, or a batch of no-ops: nothing becomes visible
        for name, record in changes.items():
            self._check_condition(intent, name, record)
        intent.committed = True
        self._commit(changes)

    def _single(self, event: Event) -> None:
        """A record written alone (no marker, or one inherited): visible, and so committed, as it lands."""
        assert event.after is not None
        name = KEYS.name_of(event.call.key)
        obj = decode_object(name, event.after.body, event.after.etag)
        if obj.tx is None or (obj.record is not None and obj.record.etag in self.alone):
            self._commit({name: obj.record})

    def _commit(self, changes: dict[str, Record | None]) -> None:
        self.state = {**self.state, **changes}
        self.history.append(dict(self.state))
        self.changed.append(set(changes))

    def _optimistic_commit(self, tx: str, manifest: OptimisticManifest, intent: Intent) -> dict[str, Record | None]:
        marked = {n: o for n in manifest.names if (o := self._obj(n)) is not None and o.tx == tx}
        if not marked:
            return {}
        assert not manifest.aborting, f"{tx}: its ABORTING manifest is deleted while its records are there"
        for name in manifest.names:
            put = intent.put(name)
            cur = self.state[name]
            noop = cur is not None and put is not None and content_digest(cur.digest) == content_digest(put.digest)
            assert name in marked or noop, f"{tx} commits without its record {name!r}: {self.store.objects}"
        return {n: o.record for n, o in marked.items()}

    def _redo_commit(self, tx: str, manifest: RedoLog) -> dict[str, Record | None]:
        changes: dict[str, Record | None] = {}
        for op in manifest.ops:
            obj = self._obj(op.name)
            if obj is not None and obj.tx == tx:
                changes[op.name] = obj.record
        if not changes:
            return {}  # aborted by recovery: nothing of it landed
        for op in manifest.ops:
            cur = self.store.objects.get(KEYS.record(op.name))
            holds = cur is None if op.pre is None else (cur is not None and cur.etag == op.pre)
            assert op.name in changes or not holds, f"{tx} commits without applying {op.name!r} (its condition holds)"
        return changes

    def _check_condition(self, intent: Intent, name: str, record: Record | None) -> None:
        """Each committed operation keeps its condition against what was visible (no lost or duplicated append)."""
        before = self.state[name]
        put = intent.put(name)
        if put is None:
            delete = next(d for d in intent.deletes if d.name == name)
            assert before is not None, f"write {intent.no} deletes {name!r}, which nothing visible held"
            assert delete.if_match in (None, before.etag), f"write {intent.no} deletes {name!r} over {before}"
            assert record is None
            return
        assert record is not None and record.etag == put.etag and record.value == put.value, (name, record, put)
        if put.mode in (Mode.CREATE, Mode.APPEND):
            assert before is None, f"write {intent.no} {put.mode.name}s {name!r} over the visible {before}"
        if put.mode is Mode.IF_MATCH:
            assert before is not None and before.etag == put.if_match, (name, before, put.if_match)


class BatchMachine(RuleBasedStateMachine):
    """Writers, readers and a recoverer interleaved call by call, with crashes and the lease running out."""

    protocol: type[Batches] = Batches  #: what every process runs (the sabotage tests run broken variants)
    examples = 0  #: machines built so far (one per example)

    def __init__(self) -> None:
        super().__init__()
        type(self).examples += 1
        self.world = World()
        self.store = FakeStore(gate=_gate)
        self.intents: dict[str, Intent] = {}
        self.model = Model(self.store, self.intents)
        self.store.observers.append(self.model.observe)
        self.store.observers.append(self._log_call)
        self.log: list[str] = []
        self.actors = {name: Actor(name) for name in (*WRITERS, *READERS, "recover")}
        self.writes = 0
        self.expired_at = 0
        self.counts: dict[str, int] = {}

    # -- helpers ---------------------------------------------------------------------

    def _process(self, data: st.DataObject | None = None, actor: Actor | None = None) -> Batches:
        """The actor's process (its cache of batches seen complete kept), or a new one (a restart).

        A new process makes its parallel requests in a drawn order.
        """
        if actor is not None and actor.process is not None and data is not None:
            if not data.draw(st.booleans(), label="restart"):
                return actor.process
        seed = data.draw(st.integers(0, 2**32), label="order of parallel calls") if data is not None else 0
        process = batches(
            self.store, self.world, self.protocol, new_id=self._new_id, trace=self._trace, parallel=shuffled(seed)
        )
        if actor is not None:
            actor.process = process
        return process

    def _trace(self, tx: str, old: BatchState, new: BatchState) -> None:
        actor: Actor | None = getattr(_CURRENT, "actor", None)
        who = {**dict.fromkeys(WRITERS, "writer"), **dict.fromkeys(READERS, "reader")}.get(str(actor), "recovery")
        self._count(f"{who} {old.name}->{new.name}")

    def _new_id(self) -> str:
        new = self.world.new_id()
        actor: Actor | None = getattr(_CURRENT, "actor", None)
        assert actor is not None and actor.intent is not None, "a batch id drawn outside a write"
        actor.intent.txs.add(new)
        self.intents[new] = actor.intent
        return new

    def _busy(self, names: tuple[str, ...]) -> list[Actor]:
        return [self.actors[n] for n in names if not self.actors[n].done]

    def _held(self) -> set[str]:
        """Names a new write may not use: a live writer's, or a crashed redo log's that a reader may roll forward."""
        held = {n for a in self._busy(WRITERS) for n in (a.intent.names if a.intent else ())}
        for key, got in self.store.objects.items():
            if not key.startswith(KEYS.manifests):
                continue
            tx = key[len(KEYS.manifests) :]
            manifest = decode_manifest(tx, got.body)
            if isinstance(manifest, RedoLog):
                names = {op.name for op in manifest.ops}
                if any((o := self.model._obj(n)) is not None and o.tx == tx for n in names):
                    held |= names
        return held

    def _log_call(self, event: Event) -> None:
        actor: Actor | None = getattr(_CURRENT, "actor", None)
        c = event.call
        cond = " absent" if c.absent else f" if-match {c.match}" if c.match else ""
        result = event.result if c.kind != "list" else len(event.result)  # type: ignore[arg-type]
        self.log.append(f"{c.n:4d} {actor or 'main'}: {c.kind} {c.key}{cond} -> {result}")

    def _count(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1

    # -- rules -----------------------------------------------------------------------

    #: The actions, weighted: writes and their calls most, then reads, then recovery and the lease.
    ACTIONS = ("write",) * 3 + ("step",) * 4 + ("finish",) * 2 + ("read",) * 2 + ("recover", "expire")

    @rule(data=st.data())
    def act(self, data: st.DataObject) -> None:
        action = data.draw(st.sampled_from([a for a in self.ACTIONS if self._can(a)]), label="action")
        getattr(self, f"_{action}")(data)

    def _can(self, action: str) -> bool:
        idle = {n for n, a in self.actors.items() if a.done}
        return {
            "write": bool(idle & set(WRITERS)) and len(NAMES) - len(self._held()) >= 2,
            "read": bool(idle & set(READERS)),
            "recover": "recover" in idle,
            "step": len(idle) < len(self.actors),
            "finish": len(idle) < len(self.actors),
            "expire": not self._busy(WRITERS) and self.writes > self.expired_at,
        }[action]

    def _write(self, data: st.DataObject) -> None:
        actor = data.draw(st.sampled_from([self.actors[w] for w in WRITERS if self.actors[w].done]), label="writer")
        free = sorted(set(NAMES) - self._held())
        if data.draw(st.integers(0, 4), label="one record alone") == 0:
            return self._write_alone(data, actor, data.draw(st.sampled_from(free), label="name"))
        names = data.draw(st.lists(st.sampled_from(free), min_size=2, max_size=min(3, len(free)), unique=True))
        self.writes += 1
        no = self.writes
        kinds = [data.draw(st.sampled_from(KINDS), label="kind") for _ in names]
        if data.draw(st.integers(0, 2), label="optimistic") == 0:
            kinds = [k if k in ("append", "create") else "append" for k in kinds]
        puts, deletes = self._ops(data, no, names, kinds)
        intent = Intent(no, puts, deletes, [no * 10 + i for i in range(len(puts))])
        actor.intent = intent
        process = self._process(data, actor)
        actor.start(lambda: process.write(KEYS, intent.puts, intent.deletes, intent.seqs, reseq), self.model.version)

    def _write_alone(self, data: st.DataObject, actor: Actor, name: str) -> None:
        """One record, as the S3 backend writes a batch of one (no manifest): an upsert or a create.

        The upsert reads the record (through the protocol), then PUTs
        ``If-Match`` its S3 ETag (or ``If-None-Match``) carrying its marker
        (:func:`inherited`), again when refused. The create is one PUT
        ``If-None-Match`` with no marker (nothing to inherit), a conflict
        when something is there.
        """
        self.writes += 1
        no = self.writes
        upsert = data.draw(st.booleans(), label="upsert, else create")
        mode = Mode.UPSERT if upsert else Mode.CREATE
        put = make_put(name, data.draw(st.sampled_from(["x", "y"]), label="content"), mode, tag=f"w{no}")
        actor.intent = Intent(no, [put], [], [no * 10])
        self.model.alone.add(put.etag)
        process = self._process(data, actor)
        key = KEYS.record(name)

        def write() -> list[Record] | Conflict:
            while upsert:
                (cur,) = process.read(KEYS, [name])
                body = record_body(put, no * 10, inherited(cur))
                if self.store.put_if(key, body, absent=cur is None, match=cur.s3etag if cur else None):
                    return [as_record(put, no * 10)]
            if self.store.put_if(key, record_body(put, no * 10), absent=True):
                return [as_record(put, no * 10)]
            (cur,) = process.read(KEYS, [name])
            return Conflict(0, name, cur.record if cur else None)

        actor.start(write, self.model.version)

    def _ops(self, data: st.DataObject, no: int, names: list[str], kinds: list[str]) -> tuple[list[Put], list[Delete]]:
        """Puts and deletes of ``kinds``; an etag condition matches what is visible 3 times in 4."""
        puts: list[Put] = []
        deletes: list[Delete] = []
        for name, kind in zip(names, kinds, strict=True):
            cur = self.model.state[name]
            matching = data.draw(st.sampled_from([True, True, True, False]), label="matching etag")
            etag = cur.etag if cur is not None and matching else "stale"
            content = data.draw(st.sampled_from(["x", "x", "y"]), label="content")  # the same: an append no-op
            if kind in ("delete", "delete-if"):
                deletes.append(Delete(name, etag if kind == "delete-if" else None))
                continue
            mode = {"append": Mode.APPEND, "create": Mode.CREATE, "upsert": Mode.UPSERT}.get(kind, Mode.IF_MATCH)
            if_match = etag if mode is Mode.IF_MATCH else None
            puts.append(make_put(name, content, mode, tag=f"w{no}", if_match=if_match))
        return puts, deletes

    def _read(self, data: st.DataObject) -> None:
        actor = data.draw(st.sampled_from([self.actors[r] for r in READERS if self.actors[r].done]), label="reader")
        actor.names = data.draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=4, unique=True), label="names")
        process = self._process(data, actor)
        actor.start(lambda: process.read(KEYS, actor.names), self.model.version)

    def _recover(self, data: st.DataObject) -> None:
        process = self._process(data, self.actors["recover"])
        self.actors["recover"].start(lambda: process.recover(KEYS), self.model.version)

    def _step(self, data: st.DataObject) -> None:
        """One actor makes a few calls; the last may crash it (before the call, or after it landed)."""
        actor = data.draw(st.sampled_from(self._busy((*WRITERS, *READERS, "recover"))), label="actor")
        steps = data.draw(st.integers(1, 12), label="calls")
        crash = data.draw(st.sampled_from([None, None, None, Action.CRASH_BEFORE, Action.CRASH_AFTER]), label="crash")
        for _ in range(steps - 1):
            if actor.done:
                break
            actor.step()
        if not actor.done:
            actor.step(crash or Action.GO)
        if actor.done:
            self._finished(actor)

    def _finish(self, data: st.DataObject) -> None:
        """One actor runs to the end of its operation."""
        actor = data.draw(st.sampled_from(self._busy((*WRITERS, *READERS, "recover"))), label="actor")
        while not actor.done:
            actor.step()
        self._finished(actor)

    def _expire(self, data: st.DataObject) -> None:
        """The lease of every batch written so far runs out (no writer is inside a write: they were faster)."""
        self.world.expire()
        self.expired_at = self.writes
        self._count("expire")

    # -- checks ----------------------------------------------------------------------

    def _finished(self, actor: Actor) -> None:
        if isinstance(actor.error, Crash):
            self._count("crash")
            return
        if actor.error is not None:
            raise actor.error
        if actor.name in READERS:
            got = {n: (o.record if o else None) for n, o in zip(actor.names, actor.outcome, strict=True)}
            assert self.model.atomic(actor.started, got), self._explain(f"{actor} read {short(got)}: part of a batch")
            self._count("read")
        elif actor.name in WRITERS:
            self._check_write(actor)
        else:
            self._count("recover")

    def _check_write(self, actor: Actor) -> None:
        intent, outcome = actor.intent, actor.outcome
        assert intent is not None
        if isinstance(outcome, Conflict):
            assert not intent.committed, f"write {intent.no} was refused but something of it became visible"
            assert self.model.seen(actor.started, {outcome.name: outcome.existing}), outcome
            self._count("conflict")
            return
        want: dict[str, Record | None] = {p.name: r for p, r in zip(intent.puts, outcome, strict=True)}
        want.update({d.name: None for d in intent.deletes})
        assert self.model.seen(actor.started, want), self._explain(f"write {intent.no} returned {short(want)}")
        self._count("write")

    def _explain(self, what: str) -> str:
        """``what``, with the model's versions and the last port calls (the failing example's story)."""
        versions = "\n".join(f"  v{i}: {short(h)}" for i, h in enumerate(self.model.history))
        return f"{what}\nmodel versions:\n{versions}\ncalls:\n" + "\n".join(self.log[-150:])

    @invariant()
    def settled_objects_are_the_model(self) -> None:
        """Between any two calls: every record object whose batch is settled (no manifest) is what the model holds.

        Objects of a batch whose manifest is still stored are pending
        (hidden, or to be rolled forward) and skipped.
        """
        for name in NAMES:
            obj = self.model._obj(name)
            if obj is not None and obj.tx is not None and KEYS.manifest(obj.tx) in self.store.objects:
                continue
            seen = obj.record if obj is not None else None
            want = self.model.state[name]
            assert seen == want, self._explain(f"{name!r} holds {seen}, the model {want}")

    def teardown(self) -> None:
        """Every actor dies; once the lease is over, recovery leaves the model, and nothing else."""
        for actor in self.actors.values():
            if not actor.done:
                actor.step(Action.CRASH_BEFORE)
        self.store.gate = None
        self.world.expire()
        self._process().recover(KEYS)
        left = [k for k in self.store.objects if k.startswith(KEYS.manifests)]
        assert not left, f"manifests left after recovery: {left}"
        raw = {n: (o.record if (o := self.model._obj(n)) else None) for n in NAMES}
        assert raw == self.model.state, f"after recovery the store holds {raw}, the model {self.model.state}"
        tombstones = [n for n in NAMES if (o := self.model._obj(n)) is not None and o.record is None]
        assert not tombstones, f"tombstones left after recovery: {tombstones}"
        assert visible_state(self._process(), list(NAMES)) == self.model.state
        for intent in self.intents.values():
            marked = [n for n in NAMES if (o := self.model._obj(n)) and (o.tx or "-").split("-")[1] in intent.txs]
            assert intent.committed or not marked, f"write {intent.no} never committed, yet {marked} carry its marker"
        if self.protocol is Batches:  # the sabotage runs are not counted
            STATS.append(self.counts)


STATS: list[dict[str, int]] = []

BatchMachine.TestCase.settings = settings(
    settings(),  # the loaded profile: "ci" (40 examples) or, with --deep, "deep"
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
TestBatchMachine = BatchMachine.TestCase


def test_the_stateful_test_uses_the_loaded_profile() -> None:
    assert BatchMachine.TestCase.settings.max_examples == settings().max_examples


@pytest.fixture(autouse=True, scope="module")
def _report_stats() -> Iterator[None]:
    yield
    if STATS:
        total: dict[str, int] = {}
        for counts in STATS:
            for k, v in counts.items():
                total[k] = total.get(k, 0) + v
        print(f"\n[s3 batch machine] {len(STATS)} runs: {dict(sorted(total.items()))}")



def test_batch_ids_do_not_call_uuid4(monkeypatch: pytest.MonkeyPatch) -> None:
    """LangGraph's own tests patch ``uuid.uuid4`` (test_root_graph); the protocol draws its ids without it."""
    import uuid

    def patched() -> uuid.UUID:
        raise AssertionError("uuid.uuid4 called")

    monkeypatch.setattr(uuid, "uuid4", patched)
    store = FakeStore()
    written = Batches(store, where="fake").write(KEYS, [make_put(n, "new") for n in "ab"], [], [1, 2], reseq)
    assert [r.etag for r in written] == ["new-a", "new-b"]  # type: ignore[union-attr]
    assert Batches(store, where="fake").write(KEYS, [make_put("a", "u", Mode.UPSERT)], [Delete("b")], [3], reseq)


# -- sabotage: the machine catches broken variants of the protocol -------------------------


class _CommitsOverARefusedRecord(Batches):
    """An optimistic batch commits as if every refused PUT had landed (no read of what is there)."""

    def _examine(self, keys: Any, tx: str, puts: Any, seqs: Any, etags: Any) -> Any:
        landing = super()._examine(keys, tx, puts, seqs, etags)
        return type(landing)(landing.landed, landing.records)


class _RollForwardSkipsARecord(Batches):
    """Rolling another process's LOGGED batch forward applies every operation but the last."""

    def _log(self, keys: Any, batch: Batch, ops: Any) -> None:
        self.__dict__.setdefault("own", set()).add(batch.tx)
        super()._log(keys, batch, ops)

    def _apply(self, keys: Any, batch: Batch, ops: Any, landed: Any = ()) -> None:
        mine = batch.tx in self.__dict__.get("own", set())
        super()._apply(keys, batch, ops if mine or len(ops) < 2 else ops[:-1], landed)


class _RecoveryAbortsALoggedBatch(Batches):
    """Recovery aborts (deletes the manifest of) a LOGGED batch older than the lease, even one it should roll."""

    def _recover_redo(self, keys: Any, batch: Batch, ops: Any, etag: str, old: bool) -> Any:
        if not old:
            return super()._recover_redo(keys, batch, ops, etag, old)
        self.store.delete_if(keys.manifest(batch.tx), etag)
        batch.to(BatchState.ABORTED)
        return _Recovered(batch.tx, aborted=1)


class _ReadWithoutSecondCollect(Batches):
    """A multi-record read that met an absence or an unmarked record trusts its first collect."""

    def unchanged(self, keys: Any, names: Any, objs: Any) -> bool:
        return True


class _ReadNotRepeatedAfterRollForward(Batches):
    """A multi-record read that rolled a batch forward returns what it read before, half of that batch."""

    def _settle_met(self, keys: Any, objs: Any, hidden: frozenset[str], started: float, multi: bool, scope: Any) -> Any:
        met = super()._settle_met(keys, objs, hidden, started, multi, scope)
        return type(met)(met.hide, bool(met.hide), False)


class _KnownBatchAlwaysMetWhole(Batches):
    """A multi-record read takes every batch whose names it knows as read whole, even one it read half of."""

    def _met_whole(self, tx: str, objs: Any, scope: Any) -> bool:
        return True


class _SweepDropsLiveTombstones(Batches):
    """Recovery's sweep drops every tombstone, a live batch's too."""

    def _sweep_tombstones(self, keys: Any) -> list[Any]:
        for key in self.store.list(keys.records):
            got = self.store.get(key)
            obj = None if got is None else decode_object(keys.name_of(key), got.body, got.etag, False)
            if obj is not None and obj.record is None:
                self.store.delete_if(key, obj.s3etag)
        return []


class _CommitIgnoresTheManifest(Batches):
    """An optimistic commit deletes the manifest unconditionally and never checks for an abort."""

    def _commit(self, keys: Any, batch: Batch, metag: str, names: Any, landing: Any) -> list[Record]:
        self.store.delete_if(keys.manifest(batch.tx))
        batch.to(BatchState.COMMITTED)
        return list(landing.records)


class _FenceAppliedWithTheRest(Batches):
    """A refused fence is taken for "superseded" (the protocol before the fence): the batch's other records land."""

    def _apply_fence(self, keys: Any, batch: Batch, op: Any, index: int) -> str | Conflict:
        self.store.put_if(keys.record(op.name), op.body, absent=op.pre is None, match=op.pre)
        return ""


_DEEP = pytest.mark.deep  # found past the ci profile's 40 examples (see the report in the docstring below)

#: Broken protocols the machine finds; those needing more than the ci profile's examples run with --deep.
CAUGHT_BY_THE_MACHINE = [
    pytest.param(_CommitsOverARefusedRecord, id="commit-over-a-refused-record"),
    pytest.param(_RollForwardSkipsARecord, id="roll-forward-skips-a-record", marks=_DEEP),
    pytest.param(_RecoveryAbortsALoggedBatch, id="recovery-aborts-a-logged-batch", marks=_DEEP),
    pytest.param(_ReadNotRepeatedAfterRollForward, id="read-not-repeated-after-roll-forward", marks=_DEEP),
    pytest.param(_ReadWithoutSecondCollect, id="read-without-second-collect", marks=_DEEP),
]


@pytest.mark.parametrize("broken", CAUGHT_BY_THE_MACHINE)
def test_the_machine_catches_a_broken_protocol(broken: type[Batches]) -> None:
    """The stateful test, run on a broken variant of the protocol, fails (with the loaded profile's examples).

    Derandomized (in both profiles, so the examples tried are the same on every run). Only the first is
    found within the ci profile's 40 examples (at the 4th); the others take hundreds (91 to 387 in a run
    with 300 or 2000 allowed) and run with ``--deep``. No shrinking: a failure is reported as found.
    Recovery's sweep dropping a live batch's tombstones is not found within 2000 here (it was, at the
    1163rd, in a run outside pytest): its targeted test is below.
    """
    machine = type(f"Broken{broken.__name__}", (BatchMachine,), {"protocol": broken, "examples": 0})
    budget = settings(
        BatchMachine.TestCase.settings,
        derandomize=True,
        phases=[Phase.generate],
        report_multiple_bugs=False,
        database=None,
    )
    with pytest.raises(AssertionError):
        run_state_machine_as_test(machine, settings=budget)


#: Broken protocols, each with a targeted test that finds it at once (the machine needs hundreds of examples, or
#: cannot reach it: it never lets the lease run out under a live writer, as a commit ignoring the manifest needs).
CAUGHT_BY_A_TARGETED_TEST = [
    pytest.param(_ReadWithoutSecondCollect, test_a_read_never_sees_a_delete_without_the_rest_of_its_batch,
                 id="read-without-second-collect/delete"),
    pytest.param(_ReadWithoutSecondCollect, test_a_read_never_mixes_a_batch_with_a_later_record_written_alone,
                 id="read-without-second-collect/alone"),
    pytest.param(_SweepDropsLiveTombstones, test_recovery_alongside_a_live_writer_keeps_its_batch_whole,
                 id="sweep-drops-live-tombstones"),
    pytest.param(_CommitIgnoresTheManifest, test_a_live_writer_aborted_by_recovery_is_told,
                 id="commit-ignores-the-manifest"),
    pytest.param(_FenceAppliedWithTheRest, test_a_batch_whose_etag_condition_fails_after_its_pre_read_commits_nothing,
                 id="fence-applied-with-the-rest"),
    pytest.param(_KnownBatchAlwaysMetWhole, test_a_read_that_met_a_known_batch_half_is_repeated,
                 id="known-batch-always-met-whole"),
]


@pytest.mark.parametrize(("broken", "check"), CAUGHT_BY_A_TARGETED_TEST)
def test_a_targeted_test_catches_a_broken_protocol(broken: type[Batches], check: Callable[[Any], None]) -> None:
    check(Batches)  # passes on the protocol
    with pytest.raises((AssertionError, pytest.fail.Exception)):
        check(broken)
