"""S3-specific tests: raw-bucket isolation, crash between staged parts and the
visible record, injected throttling and 5xx, request counts, conditional-write
refusal, error translation.

The shared contract, isolation and LangGraph bodies already run on S3 (both
moto forms) through the ``backend`` fixture; this file covers what only S3 has.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import pytest
from botocore.awsrequest import AWSResponse

from checkpointers._flows import make_put, new_etag
from checkpointers._names import Partition
from checkpointers.backends.base import Delete, ListQuery, Mode, Put
from checkpointers.backends._s3_objects import _MAGIC, _TX_MAGIC, Op, record_body, redo_manifest, tombstone
from checkpointers.backends.s3 import ConditionalWritesUnsupportedError, S3Backend, _invert, translate_errors
from checkpointers.errors import BackendUnavailableError, CorruptItemError
from tests.plugins.s3_plugin import BUCKET, REGION

pytestmark = pytest.mark.timeout(120)


class _Raw:
    """The ``raw`` of a canned botocore response."""

    def __init__(self, body: bytes) -> None:
        self._body = body

    def stream(self, **_: Any) -> Iterator[bytes]:
        yield self._body


def _error_response(status: int, code: str, message: str = "injected") -> AWSResponse:
    body = f"<Error><Code>{code}</Code><Message>{message}</Message></Error>".encode()
    return AWSResponse("http://injected", status, {"Content-Type": "application/xml"}, _Raw(body))


class Faults:
    """A botocore ``before-send`` hook answering chosen requests with an error.

    ``when(request)`` picks the requests; ``times`` bounds how many get the
    fault (None = all). ``hits`` counts injected faults.
    """

    def __init__(
        self, backend: S3Backend, status: int, code: str, when: Callable[[Any], bool], times: int | None = None
    ) -> None:
        self.status, self.code, self.when, self.times = status, code, when, times
        self.hits = 0
        self.client = backend.client
        self.client.meta.events.register_first("before-send.s3", self)

    def __call__(self, request: Any, **_: Any) -> AWSResponse | None:
        if not self.when(request) or (self.times is not None and self.hits >= self.times):
            return None
        self.hits += 1
        return _error_response(self.status, self.code)

    def remove(self) -> None:
        self.client.meta.events.unregister("before-send.s3", self)


def _puts_to(marker: str) -> Callable[[Any], bool]:
    """Requests that PUT an object whose key contains ``marker`` (already URL-quoted)."""
    return lambda r: r.method == "PUT" and marker in r.url


@pytest.fixture(params=["inprocess", "http"])
def s3(request: pytest.FixtureRequest) -> Iterator[S3Backend]:
    """A backend with its own client (own hooks, 3 attempts), fresh prefix, on both moto forms.

    Injected faults differ between the two: in-process, moto still applies
    the request and the fault replaces its response (a response lost after
    the write landed); over HTTP the request never reaches the server.
    """
    client = request.getfixturevalue(f"s3_{request.param}_client")
    endpoint = client.meta.endpoint_url
    backend = S3Backend(
        BUCKET,
        f"t-{uuid.uuid4().hex}",
        region_name=REGION,
        max_attempts=3,
        max_workers=8,
        endpoint_url=None if "amazonaws.com" in endpoint else endpoint,
    )
    yield backend
    backend.close()


def _raw_keys(backend: S3Backend) -> list[str]:
    pages = backend.client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=backend.root)
    return [o["Key"][len(backend.root) :] for page in pages for o in page.get("Contents", [])]


# -- isolation on the raw bucket ------------------------------------------------

ODD_IDS = ["t", "a/b", "..", "%2F", "../x", "é-ü-日本", "x" * 1000, ""]


def test_users_never_share_a_prefix(s3: S3Backend) -> None:
    users = ["alice", "alice2", "al/ice", "..", "%2F", "ü" * 1000]
    for user in users:
        for tid in ODD_IDS:
            p = Partition(user, "langgraph", tid)
            s3.write(p, [make_put("c/x", f"{user}|{tid}".encode()), make_put("w/y", b"w")])
    keys = _raw_keys(s3)
    assert len(keys) >= len(users) * len(ODD_IDS) * 2
    prefixes = {u: Partition(u, "langgraph", "").user_key for u in users}
    for key in keys:
        owners = [u for u, pre in prefixes.items() if key.startswith(pre)]
        assert len(owners) == 1, f"object {key!r} lies under the prefix of {owners}"
    for user in users:
        assert sorted(s3.partitions(user, "langgraph")) == sorted(ODD_IDS)
        for tid in ODD_IDS:
            got = s3.list(Partition(user, "langgraph", tid), ListQuery())
            assert [r.value for r in got if r.name == "c/x"] == [f"{user}|{tid}".encode()]
            assert len(got) == 2


# -- crash between the staged parts and the visible record --------------------


class Crash(BaseException):
    """Stands for kill -9: raised from the hook, nothing after it runs."""


def test_crash_before_visible_put_keeps_previous_checkpoint(s3: S3Backend) -> None:
    from langgraph.checkpoint.base import empty_checkpoint

    from checkpointers._saver_flows import _INLINE_MAX
    from checkpointers.savers import Checkpointer

    saver = Checkpointer(s3)
    cfg = {"configurable": {"thread_id": "t1", "checkpoint_ns": ""}}
    cp1 = empty_checkpoint()
    cp1["channel_values"] = {"x": "o" * (_INLINE_MAX + 1)}  # over the inline limit: a blob
    cp1["channel_versions"] = {"x": "1"}
    cfg1 = saver.put(cfg, cp1, {"step": 1}, {"x": "1"})
    cp2 = empty_checkpoint()
    cp2["channel_values"] = {"x": "t" * (_INLINE_MAX + 1)}
    cp2["channel_versions"] = {"x": "2"}

    blob_marker = quote("/r/" + _invert("b/"), safe="/~")
    ckpt_marker = quote("/r/" + _invert("c/"), safe="/~")
    blob_puts: list[str] = []

    def crash(request: Any, **_: Any) -> None:
        if request.method == "PUT" and blob_marker in request.url:
            blob_puts.append(request.url)
        if request.method == "PUT" and ckpt_marker in request.url:
            raise Crash

    s3.client.meta.events.register_first("before-send.s3", crash)
    try:
        with pytest.raises(Crash):
            saver.put(cfg1, cp2, {"step": 2}, {"x": "2"})
    finally:
        s3.client.meta.events.unregister("before-send.s3", crash)
    assert blob_puts, "the staged blob was not written before the crash"

    latest = saver.get_tuple(cfg)
    assert latest is not None and latest.checkpoint["id"] == cp1["id"]
    assert latest.checkpoint["channel_values"] == {"x": "o" * (_INLINE_MAX + 1)}
    assert [t.checkpoint["id"] for t in saver.list(cfg)] == [cp1["id"]]
    blobs = [k for k in _raw_keys(s3) if "/r/" + _invert("b/") in k]
    assert len(blobs) == 2, "the orphan blob of the crashed put should be there"

    saver.prune(["t1"])  # the documented cleanup: blobs no checkpoint references go
    blobs = [k for k in _raw_keys(s3) if "/r/" + _invert("b/") in k]
    assert len(blobs) == 1
    again = saver.get_tuple(cfg)
    assert again is not None and again.checkpoint["channel_values"] == {"x": "o" * (_INLINE_MAX + 1)}


def test_crash_mid_batch_is_rolled_forward_or_aborted(s3: S3Backend) -> None:
    p = Partition("u", "items", "s")
    s3.write(p, [make_put(n, b"old") for n in ("a", "b", "c")])
    record_puts = "/r/"

    # Crash after the manifest and the first record: readers roll it forward.
    seen: list[str] = []

    def crash_second(request: Any, **_: Any) -> None:
        if request.method == "PUT" and record_puts in request.url:
            seen.append(request.url)
            if len(seen) == 2:
                raise Crash

    s3._io.shutdown()  # apply sequentially so "the second record PUT" is well defined
    s3._io = _Inline()  # type: ignore[assignment]
    _crash_during(s3, crash_second, lambda: s3.write(p, [make_put(n, b"new") for n in ("a", "b", "c")]))
    fresh = S3Backend(BUCKET, s3.root, client=s3.client)  # a new process: empty caches
    assert [r.value for r in fresh.list(p, ListQuery())] == [b"new"] * 3
    assert not [k for k in _raw_keys(s3) if "/tx/" in k], "the manifest was not cleaned up"

    # Crash after the manifest, before any record: nothing is visible; recover aborts it.
    def crash_first(request: Any, **_: Any) -> None:
        if request.method == "PUT" and record_puts in request.url:
            raise Crash

    _crash_during(s3, crash_first, lambda: s3.write(p, [make_put(n, b"newer") for n in ("a", "b", "c")]))
    assert [r.value for r in fresh.list(p, ListQuery())] == [b"new"] * 3
    assert len([k for k in _raw_keys(s3) if "/tx/" in k]) == 1
    fresh.lease = 0.0
    assert fresh.recover(p) == (0, 1)
    assert not [k for k in _raw_keys(s3) if "/tx/" in k]
    assert [r.value for r in fresh.list(p, ListQuery())] == [b"new"] * 3
    fresh.close()


def _crash_during(s3: S3Backend, hook: Callable[..., None], action: Callable[[], Any]) -> None:
    """Run ``action`` with ``hook`` on every request; it must end in ``Crash``."""
    s3.client.meta.events.register_first("before-send.s3", hook)
    try:
        with pytest.raises(Crash):
            action()
    finally:
        s3.client.meta.events.unregister("before-send.s3", hook)


class _Inline:
    """A stand-in executor running tasks in order on the calling thread."""

    def submit(self, fn: Callable[..., Any], *args: Any) -> Any:
        from concurrent.futures import Future

        future: Future[Any] = Future()
        try:
            future.set_result(fn(*args))
        except Exception as exc:  # Crash (a BaseException) propagates at once
            future.set_exception(exc)
        return future

    def shutdown(self, wait: bool = True) -> None:
        pass


# -- throttling and 5xx --------------------------------------------------------


@pytest.mark.parametrize(("status", "code"), [(503, "SlowDown"), (500, "InternalError")])
def test_transient_errors_are_retried(s3: S3Backend, status: int, code: str) -> None:
    p = Partition("u", "items", "s")
    faults = Faults(s3, status, code, _puts_to("/r/"), times=2)
    try:
        rec = s3.write(p, [make_put("k", b"v", mode=Mode.CREATE)]).records[0]
    finally:
        faults.remove()
    assert faults.hits == 2
    assert s3.get(p, ["k"]) == [rec]


@pytest.mark.parametrize(("status", "code"), [(503, "SlowDown"), (500, "InternalError")])
def test_past_the_retry_bound_nothing_is_half_visible(
    s3: S3Backend, status: int, code: str, request: pytest.FixtureRequest
) -> None:
    # Over HTTP the failed requests never arrive: the old state stays. In
    # process, moto applies them and only the responses are lost: the batch's
    # manifest and records landed, so the reader rolls it forward to the new
    # state. Either way all three records agree.
    landed = "inprocess" in request.node.callspec.id
    p = Partition("u", "items", "s")
    s3.write(p, [make_put(n, b"old") for n in ("a", "b", "c")])
    faults = Faults(s3, status, code, _puts_to("/r/"))  # every record PUT fails
    try:
        with pytest.raises(BackendUnavailableError) as info:
            s3.write(p, [make_put(n, b"new") for n in ("a", "b", "c")])
    finally:
        faults.remove()
    assert faults.hits >= 3, "the failing request was not retried"
    assert code in str(info.value) and info.value.__cause__ is not None
    assert [r.value for r in s3.list(p, ListQuery())] == [b"new" if landed else b"old"] * 3
    single = Faults(s3, status, code, _puts_to("/r/"))
    try:
        with pytest.raises(BackendUnavailableError):
            s3.write(p, [make_put("d", b"x", mode=Mode.CREATE)])
    finally:
        single.remove()
    got = s3.get(p, ["d"])[0]
    assert (got is not None and got.value == b"x") if landed else got is None


def test_conditional_delete_whose_response_was_lost_is_ours(s3: S3Backend) -> None:
    """One 500 on the DELETE: botocore retries it. In process the first attempt
    landed (its response was lost), so the retry finds nothing: still our delete,
    not another writer's; over HTTP the retry itself deletes."""
    p = Partition("u", "items", "s")
    rec = s3.write(p, [make_put("k", b"v")]).records[0]
    faults = Faults(s3, 500, "InternalError", lambda r: r.method == "DELETE" and "/r/" in r.url, times=1)
    try:
        result = s3.write(p, [], [Delete("k", if_match=rec.etag)])
    finally:
        faults.remove()
    assert faults.hits == 1 and result.conflict is None
    assert s3.get(p, ["k"]) == [None]


# -- request counts --------------------------------------------------------------


def _latest_lookup_cost(backend: S3Backend, p: Partition) -> dict[str, int]:
    backend.reset_counters()
    got = backend.list(p, ListQuery(prefix="c/ns/", order="name", descending=True, limit=1))
    assert len(got) == 1
    return dict(backend.requests)


def test_latest_lookup_cost_does_not_grow(s3: S3Backend) -> None:
    p = Partition("u", "langgraph", "t")
    history = [make_put(f"c/ns/{i:06d}", b"x", mode=Mode.APPEND, staged=True) for i in range(1000)]
    s3.write(p, history[:10])
    at_10 = _latest_lookup_cost(s3, p)
    s3.write(p, history[10:])
    s3.write(p, [make_put("c/other/zzz", b"x")])  # a neighbouring prefix must not leak in
    at_1000 = _latest_lookup_cost(s3, p)
    assert at_10 == at_1000 == {"ListObjectsV2": 1, "GetObject": 2}  # + the lifetime object, in parallel
    latest = s3.list(p, ListQuery(prefix="c/ns/", order="name", descending=True, limit=1))
    assert latest[0].name == "c/ns/000999"
    s3.reset_counters()
    s3.write(p, [make_put("b/blob", b"v", mode=Mode.APPEND, staged=True), make_put("c/ns/001000", b"x", mode=Mode.APPEND)])
    assert dict(s3.requests) == {"GetObject": 1, "PutObject": 2}, "a put: its lifetime, new blobs + 1 PUT, no LIST"


def test_retention_costs_one_get_per_read_and_write_and_none_with_lifetimes_off(s3: S3Backend) -> None:
    """The lifetime object: one GET per read (in parallel) and per write; with a ttl one PUT after a write too.

    ``lifetimes=False`` (a bucket no writer uses a ttl on) pays none of it, and refuses a ttl.
    """
    p = Partition("u", "langgraph", "t")
    put = make_put("c/ns/000001", b"x", mode=Mode.UPSERT)
    _, plain = _cost(s3, lambda: s3.write(p, [put]))
    assert plain == {"GetObject": 2, "PutObject": 1}  # an upsert reads what it replaces (its marker)
    s3.set_retention(ttl=3600)
    s3.write(p, [put])  # the first write with a ttl also sweeps (a scan: once a minute per instance)
    _, timed = _cost(s3, lambda: s3.write(p, [put]))
    assert timed == {"GetObject": 2, "PutObject": 2}  # + the new expiry, If-Match
    assert _latest_lookup_cost(s3, p) == {"ListObjectsV2": 1, "GetObject": 2}
    off = S3Backend(BUCKET, s3.root + "off", client=s3.client, lifetimes=False)
    try:
        _, write_cost = _cost(off, lambda: off.write(p, [put]))
        assert write_cost == {"GetObject": 1, "PutObject": 1}
        assert _latest_lookup_cost(off, p) == {"ListObjectsV2": 1, "GetObject": 1}
        with pytest.raises(ValueError, match="lifetimes=False"):
            off.set_retention(ttl=10)
        with pytest.raises(ValueError, match="lifetimes=False"):
            S3Backend(BUCKET, s3.root, client=s3.client, lifetimes=False, ttl=10)
    finally:
        off.close()


class _Clock:
    def __init__(self) -> None:
        self.now = 1.9e9

    def __call__(self) -> float:
        return self.now


def test_an_expired_partition_rewritten_never_shows_its_old_records_even_unpurged(
    s3: S3Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write to an expired partition moves it to a new generation first: its old records read as absent at once.

    The purge that follows is skipped here (a crash after the move): the old
    objects are still stored, yet no read returns them, and a later sweep of
    the partition (once expired again) removes them.
    """
    clock = _Clock()
    s3.set_retention(ttl=100, clock=clock)
    p = Partition("u", "langgraph", "t")
    s3.write(p, [make_put("c/1", b"old"), make_put("c/2", b"old")])
    clock.now += 101
    monkeypatch.setattr(s3, "_purge", lambda keys, since: None)
    s3.write(p, [make_put("c/3", b"new")])
    assert len([k for k in _raw_keys(s3) if "/r/" in k]) == 3, "the old records are still stored"
    assert s3.get(p, ["c/1", "c/2", "c/3"])[:2] == [None, None]
    assert [r.name for r in s3.list(p, ListQuery(prefix="c/"))] == ["c/3"]
    fresh = S3Backend(BUCKET, s3.root, client=s3.client)  # another process: no generation cached
    assert [r.name for r in fresh.list(p, ListQuery(prefix="c/", descending=True, limit=1))] == ["c/3"]
    fresh.close()
    monkeypatch.undo()
    clock.now += 101
    assert s3.sweep() == 1
    assert [k for k in _raw_keys(s3) if "/r/" in k or k.endswith("/e")] == []


def test_a_write_outliving_its_partitions_expiry_is_told_and_not_visible(s3: S3Backend) -> None:
    """The partition expires while a write runs: the write raises, and a rewrite does not bring its records back."""
    clock = _Clock()
    s3.set_retention(ttl=100, clock=clock)
    p = Partition("u", "langgraph", "t")
    s3.write(p, [make_put("c/1", b"old")])
    clock.now += 99
    slow = s3._write

    def late(*args: Any) -> Any:
        out = slow(*args)
        clock.now += 2  # the partition expires before the write's expiry update
        return out

    s3._write = late  # type: ignore[method-assign]
    with pytest.raises(BackendUnavailableError, match="expired"):
        s3.write(p, [make_put("c/2", b"late")])
    s3._write = slow  # type: ignore[method-assign]
    assert s3.get(p, ["c/1", "c/2"]) == [None, None]
    s3.write(p, [make_put("c/3", b"new")])
    assert [r.name for r in s3.list(p, ListQuery(prefix="c/"))] == ["c/3"]


def _cost(backend: S3Backend, action: Callable[[], Any]) -> tuple[Any, dict[str, int]]:
    backend.reset_counters()
    result = action()
    return result, dict(backend.requests)


def _fetched_keys(backend: S3Backend) -> list[str]:
    """Start recording the object keys of the backend's GetObject requests (unquoted, root stripped)."""
    keys: list[str] = []

    def hook(request: Any, **_: Any) -> None:
        path = unquote(urlsplit(request.url).path)
        keys.append(path.split(backend.root, 1)[1])

    backend.client.meta.events.register_first("before-send.s3.GetObject", hook)
    return keys


def test_latest_with_children_costs_one_list(s3: S3Backend) -> None:
    # The LangGraph saver's "latest checkpoint and its writes": one LIST, one
    # GET per returned record, none of another record (older checkpoints,
    # other checkpoints' writes: the depth filter works on listed names).
    p = Partition("u", "langgraph", "t")
    puts = [
        make_put(name, name.encode(), mode=Mode.APPEND, staged=True)
        for i in range(200)
        for name in (f"c/x/{i:05d}", f"c/x/{i:05d}/t/0", f"c/x/{i:05d}/u/-1")
    ]
    s3.write(p, puts)
    latest = ListQuery(prefix="c/x/", depth=0, descending=True, limit=1, children=True)
    fetched = _fetched_keys(s3)
    got, cost = _cost(s3, lambda: s3.list(p, latest))
    want = ["c/x/00199", "c/x/00199/t/0", "c/x/00199/u/-1"]
    assert [r.name for r in got] == want and [r.value for r in got] == [n.encode() for n in want]
    assert cost == {"ListObjectsV2": 1, "GetObject": 4}
    lifetime = s3._layout(p.key).lifetime[len(s3.root) :]
    assert sorted(fetched) == sorted([lifetime, *(s3._layout(p.key).record(n)[len(s3.root) :] for n in want)])

    # The second newest, its subtree cut by `stop`: still complete (the
    # subtree is listed on its own), and values=False applies to children.
    # That LIST comes after the parent's GET, so it cannot date the children
    # (records without a marker): they are collected twice (3 GETs more).
    fetched.clear()
    got = s3.list(p, replace(latest, stop="c/x/00198/t/1", values=False))
    assert [r.name for r in got] == ["c/x/00198", "c/x/00198/t/0", "c/x/00198/u/-1"]
    assert all(r.value == b"" for r in got)
    assert len(fetched) == 7, fetched

    # Up to 7 writes records: still one LIST (the first page holds 8 keys);
    # 50 cost one more page, and never a GET of an older checkpoint's records.
    newest = ["c/x/00200", *(f"c/x/00200/t/{i}" for i in range(7))]
    s3.write(p, [make_put(n, b"w", mode=Mode.APPEND, staged=True) for n in newest])
    got, cost = _cost(s3, lambda: s3.list(p, latest))
    assert [r.name for r in got] == sorted(newest)
    assert cost == {"ListObjectsV2": 1, "GetObject": 9}
    more = ["c/x/00201", *(f"c/x/00201/t/{i}" for i in range(50))]
    s3.write(p, [make_put(n, b"w", mode=Mode.APPEND, staged=True) for n in more])
    got, cost = _cost(s3, lambda: s3.list(p, latest))
    assert [r.name for r in got] == sorted(more)
    assert cost == {"ListObjectsV2": 2, "GetObject": 52}


def test_append_batch_costs_no_reads(s3: S3Backend) -> None:
    # put_writes: several APPENDs on new names are written without a pre-read;
    # the manifest's DELETE commits them. Same cost at 10 and 1,000 records.
    p = Partition("u", "langgraph", "t")
    s3.write(p, [make_put(f"w/{i:04d}", b"x", mode=Mode.APPEND) for i in range(10)])
    writes = [make_put(f"w/new/{i}", f"v{i}".encode(), mode=Mode.APPEND) for i in range(2)]
    result, at_10 = _cost(s3, lambda: s3.write(p, writes))
    assert at_10 == {"GetObject": 1, "PutObject": 3, "DeleteObject": 1}
    assert s3.get(p, [w.name for w in writes]) == list(result.records)
    s3.write(p, [make_put(f"w/{i:04d}", b"x", mode=Mode.APPEND) for i in range(10, 1000)])
    more = [make_put(f"w/more/{i}", b"y", mode=Mode.APPEND) for i in range(2)]
    _, at_1000 = _cost(s3, lambda: s3.write(p, more))
    assert at_1000 == at_10
    assert not [k for k in _raw_keys(s3) if "/tx/" in k]

    # An identical re-put is a no-op returning the stored records; a different
    # value is a conflict that leaves nothing of the batch behind.
    again = s3.write(p, [make_put(w.name, w.value, mode=Mode.APPEND) for w in writes])
    assert again.conflict is None and list(again.records) == list(result.records)
    fresh = make_put("w/new/fresh", b"f", mode=Mode.APPEND)
    clash = s3.write(p, [fresh, make_put(writes[1].name, b"other", mode=Mode.APPEND)])
    assert clash.conflict is not None and clash.conflict.index == 1
    assert clash.conflict.existing == result.records[1]
    assert s3.get(p, [fresh.name, writes[1].name]) == [None, result.records[1]]
    assert not [k for k in _raw_keys(s3) if "/tx/" in k or _invert("w/new/fresh") in k]


def test_crash_mid_append_batch_stays_invisible(s3: S3Backend) -> None:
    p = Partition("u", "langgraph", "t")
    seen: list[str] = []

    def crash_second(request: Any, **_: Any) -> None:
        if request.method == "PUT" and "/r/" in request.url:
            seen.append(request.url)
            if len(seen) == 2:
                raise Crash

    s3._io.shutdown()
    s3._io = _Inline()  # type: ignore[assignment]
    names = ["w/a", "w/b", "w/c"]
    _crash_during(s3, crash_second, lambda: s3.write(p, [make_put(n, b"v", mode=Mode.APPEND) for n in names]))
    assert len([k for k in _raw_keys(s3) if "/r/" in k]) == 1, "the first record should have landed"
    fresh = S3Backend(BUCKET, s3.root, client=s3.client)  # a new process: empty caches
    assert fresh.get(p, names) == [None, None, None]
    assert fresh.list(p, ListQuery()) == []
    assert fresh.recover(p) == (0, 0), "a batch younger than the lease is left alone"
    fresh.lease = 0.0
    assert fresh.recover(p) == (0, 1)
    assert not [k for k in _raw_keys(fresh) if "/r/" in k or "/tx/" in k]
    rec = fresh.write(p, [make_put(n, b"w", mode=Mode.APPEND) for n in names]).records
    assert fresh.get(p, names) == list(rec)
    fresh.close()


def _newest(backend: S3Backend, p: Partition, workflow: str, **options: Any) -> list[Any]:
    q = ListQuery(prefix="c/", order="seq", descending=True, tags={"workflow": workflow}, **options)
    return backend.list(p, q)


def _saves(lo: int, hi: int, mode: Mode = Mode.APPEND) -> list[Any]:
    return [make_put(f"c/{i:05d}", f"{i}".encode(), tags={"workflow": "w" if i % 2 else "v"}, mode=mode) for i in range(lo, hi)]


def test_tag_indexed_latest_cost_does_not_grow(s3: S3Backend) -> None:
    # The Agent Framework's get_latest: newest record with workflow=w, by seq.
    p = Partition("u", "agent_framework", "checkpoints")
    for put in _saves(0, 10):
        s3.write(p, [put])
    got, at_10 = _cost(s3, lambda: _newest(s3, p, "w", limit=1))
    assert [r.name for r in got] == ["c/00009"] and at_10 == {"ListObjectsV2": 1, "GetObject": 2}
    s3.write(p, _saves(10, 1000))
    got, at_1000 = _cost(s3, lambda: _newest(s3, p, "w", limit=1))
    assert [r.name for r in got] == ["c/00999"] and at_1000 == at_10
    _, save_cost = _cost(s3, lambda: s3.write(p, _saves(1001, 1002)))
    assert save_cost == {"GetObject": 1, "PutObject": 2}, "a save: its lifetime, its record + one index entry"


def test_tag_index_skips_rewritten_and_deleted_records(s3: S3Backend) -> None:
    p = Partition("u", "agent_framework", "checkpoints")
    for put in _saves(0, 12):
        s3.write(p, [put])
    unindexed = S3Backend(BUCKET, s3.root, client=s3.client, indexed_tags=())
    s3.write(p, [make_put("c/00001", b"rewritten", tags={"workflow": "w"})])  # moves to the newest seq
    s3.write(p, [], [Delete("c/00011")])
    assert [r.name for r in _newest(s3, p, "w", limit=2)] == ["c/00001", "c/00009"]
    s3.write(p, [make_put("c/00003", b"moved", tags={"workflow": "v"})])  # leaves workflow w
    s3.write(p, [make_put("c/00005", b"batched", tags={"workflow": "w"}), make_put("x/1", b"", tags={"workflow": "w"})])
    for q in (
        {"limit": 3},
        {"limit": 5, "stop": _newest(s3, p, "w", limit=3)[-1].seq},
        {"start": _newest(s3, p, "w", limit=4)[-1].seq},
        {"values": False},
    ):
        assert _newest(s3, p, "w", **q) == _newest(unindexed, p, "w", **q), q
    oldest_first = ListQuery(prefix="c/", order="seq", tags={"workflow": "w"})
    names = [r.name for r in s3.list(p, oldest_first)]
    assert s3.list(p, oldest_first) == unindexed.list(p, oldest_first)
    assert names == ["c/00007", "c/00009", "c/00001", "c/00005"]
    entries = [k for k in _raw_keys(s3) if "/t/" in k]
    s3.lease = 0.0  # every stale entry is now old enough to go
    assert [r.name for r in s3.list(p, oldest_first)] == names
    assert len([k for k in _raw_keys(s3) if "/t/" in k]) == len(entries) - 4  # 00001, 00003, 00005, 00011
    unindexed.close()


# -- conditional writes ------------------------------------------------------------


def test_endpoint_without_conditional_writes_is_named(s3: S3Backend) -> None:
    p = Partition("u", "items", "s")

    def refuse(request: Any, **_: Any) -> AWSResponse | None:
        if "If-None-Match" in request.headers or "If-Match" in request.headers:
            return _error_response(501, "NotImplemented", "A header you provided implies functionality that is not implemented")
        return None

    s3.client.meta.events.register_first("before-send.s3", refuse)
    try:
        with pytest.raises(ConditionalWritesUnsupportedError) as info:
            s3.write(p, [make_put("k", b"v", mode=Mode.CREATE)])
        message = str(info.value)
        assert s3.client.meta.endpoint_url in message and "If-None-Match" in message
        assert "conditional_writes=False" in message
        weak = S3Backend(BUCKET, s3.root, client=s3.client, conditional_writes=False)
        rec = weak.write(p, [make_put("k2", b"v", mode=Mode.CREATE)]).records[0]
        assert weak.write(p, [make_put("k2", b"w", mode=Mode.CREATE)]).conflict is not None
        assert weak.get(p, ["k2"]) == [rec]
    finally:
        s3.client.meta.events.unregister("before-send.s3", refuse)


# -- error translation --------------------------------------------------------------


def _driver_errors() -> list[BaseException]:
    from boto3.exceptions import S3UploadFailedError
    from botocore import exceptions as e

    url = "http://127.0.0.1:1"
    return [
        e.ClientError({"Error": {"Code": "SlowDown", "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": 503}}, "PutObject"),
        e.ClientError({"Error": {"Code": "InternalError", "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": 500}}, "GetObject"),
        e.ClientError({"Error": {"Code": "NoSuchBucket", "Message": "m"}}, "ListObjectsV2"),
        e.ClientError({"Error": {"Code": "AccessDenied", "Message": "m"}}, "GetObject"),
        e.EndpointConnectionError(endpoint_url=url),
        e.ConnectionClosedError(endpoint_url=url),
        e.ReadTimeoutError(endpoint_url=url),
        e.ConnectTimeoutError(endpoint_url=url),
        e.SSLError(endpoint_url=url, error="bad"),
        e.ProxyConnectionError(proxy_url=url, error="bad"),
        e.ResponseStreamingError(error="reset"),
        e.IncompleteReadError(actual_bytes=1, expected_bytes=2),
        e.NoCredentialsError(),
        e.PartialCredentialsError(provider="env", cred_var="AWS_SECRET_ACCESS_KEY"),
        e.ParamValidationError(report="bad"),
        S3UploadFailedError("upload failed"),
    ]


@pytest.mark.parametrize("error", _driver_errors(), ids=lambda x: type(x).__name__)
def test_every_driver_error_is_translated(error: BaseException) -> None:
    with pytest.raises(BackendUnavailableError) as info:
        with translate_errors("http://endpoint bucket 'b'"):
            raise error
    assert info.value.__cause__ is error
    assert "http://endpoint" in str(info.value)


# -- misc ----------------------------------------------------------------------------


def test_from_url() -> None:
    b = S3Backend.from_url("s3://bkt/some/prefix?endpoint_url=http://127.0.0.1:9&region=eu-west-1&conditional_writes=false")
    try:
        assert (b.bucket, b.root, b.conditional_writes) == ("bkt", "some/prefix/", False)
        assert b.client.meta.endpoint_url == "http://127.0.0.1:9"
        assert b.client.meta.region_name == "eu-west-1"
    finally:
        b.close()


async def test_async_calls_do_not_block_the_loop(s3: S3Backend) -> None:
    p = Partition("u", "items", "s")
    ticks = 0
    gate = asyncio.Event()

    def slow(request: Any, **_: Any) -> None:
        import time

        time.sleep(0.3)

    async def ticker() -> None:
        nonlocal ticks
        while not gate.is_set():
            ticks += 1
            await asyncio.sleep(0.01)

    s3.client.meta.events.register_first("before-send.s3", slow)
    try:
        task = asyncio.create_task(ticker())
        await s3.awrite(p, [make_put("k", b"v")])
        gate.set()
        await task
    finally:
        s3.client.meta.events.unregister("before-send.s3", slow)
    assert ticks >= 10, f"the loop ran only {ticks} ticks during a 0.3 s request"


# -- append compares content digests ------------------------------------------------


def _sealed(name: str, value: bytes, digest: str, *, staged: bool = False) -> Put:
    return Put(name, value, digest, new_etag(), {}, Mode.APPEND, staged=staged)


@pytest.mark.parametrize("path", ["single", "staged", "optimistic", "classic"])
def test_append_compares_only_the_content_digest(s3: S3Backend, path: str) -> None:
    """A seal after the '.' may differ (rotated key): same content is a no-op; other content a conflict.

    ``single``: one conditional PUT; ``staged``: a staged put (S3 compares its
    digest too, though base.Put allows not to); ``optimistic``:
    several appends (the manifest commits); ``classic``: an append batched
    with an upsert (the redo log, evaluated by ``base.evaluate``).
    """
    p = Partition("u", "items", "s")
    staged = path == "staged"

    def batch(put: Put) -> Any:
        if path == "optimistic":
            return s3.write(p, [put, _sealed(f"o/{uuid.uuid4().hex}", b"o", "abc.x")])
        if path == "classic":
            return s3.write(p, [put, make_put(f"o/{uuid.uuid4().hex}", b"o")])
        return s3.write(p, [put])

    stored = s3.write(p, [_sealed("k", b"v", "abc.x", staged=staged)]).records[0]
    same = batch(_sealed("k", b"v", "abc.y", staged=staged))
    assert same.conflict is None and same.records[0] == stored
    assert s3.get(p, ["k"]) == [stored]
    other = batch(_sealed("k", b"v", "abd.x", staged=staged))
    assert other.conflict is not None and other.conflict.index == 0 and other.conflict.existing == stored
    bare = batch(_sealed("k", b"v", "abc", staged=staged))  # a record written before seals: same content
    assert bare.conflict is None and bare.records[0] == stored
    assert s3.get(p, ["k"]) == [stored]


# -- damaged stored bytes: CorruptItemError on every read path -----------------------
#
# Objects are damaged straight in the bucket (boto3), then every read the
# backend has is tried, sync and async. The damaged record is a child
# ("c/x/1/w"), so that children listings reach it only as a child, and the
# highest name, so that partitions() decodes it first.

DAMAGED = "c/x/1/w"
_TX = f"{1:020d}-{'ab' * 16}"  # a well-formed (and long expired) batch id


def _frame(header: bytes, value: bytes = b"", n: int | None = None) -> bytes:
    return _MAGIC + (len(header) if n is None else n).to_bytes(4, "big") + header + value


def _changed(h: dict[str, Any], value: bytes, **changes: Any) -> bytes:
    """The record with header fields changed (``...`` removes one)."""
    new = {k: v for k, v in {**h, **changes}.items() if v is not ...}
    return _frame(json.dumps(new).encode(), value)


Damage = Callable[[dict[str, Any], bytes], bytes]  # (header, value) -> the damaged object
_DAMAGE: dict[str, Damage] = {
    "empty": lambda h, v: b"",
    "not-a-record": lambda h, v: b"PK\x03\x04 something else",
    "truncated-length": lambda h, v: _MAGIC + b"\x00\x00",
    "truncated-header": lambda h, v: _frame(json.dumps(h).encode())[:20],
    "length-past-end": lambda h, v: _frame(json.dumps(h).encode(), b"", n=len(json.dumps(h)) + 10),
    "length-short": lambda h, v: _frame(json.dumps(h).encode(), v, n=len(json.dumps(h)) - 1),
    "not-json": lambda h, v: _frame(b"{not json", v),
    "not-utf8": lambda h, v: _frame(b'{"e": "\xff\xfe", "d": "x"}', v),
    "deeply-nested": lambda h, v: _frame(b"[" * 100_000 + b"]" * 100_000, v),
    "list": lambda h, v: _frame(json.dumps([h]).encode(), v),
    "string": lambda h, v: _frame(b'"hello"', v),
    "missing-etag": lambda h, v: _changed(h, v, e=...),
    "missing-digest": lambda h, v: _changed(h, v, d=...),
    "missing-seq": lambda h, v: _changed(h, v, s=...),
    "missing-tags": lambda h, v: _changed(h, v, t=...),
    "seq-str": lambda h, v: _changed(h, v, s="notanint"),
    "seq-bool": lambda h, v: _changed(h, v, s=True),
    "seq-float": lambda h, v: _changed(h, v, s=1.5),
    "seq-nan": lambda h, v: _changed(h, v, s=float("nan")),
    "seq-negative": lambda h, v: _changed(h, v, s=-1),
    "seq-huge": lambda h, v: _changed(h, v, s=10**30),
    "etag-int": lambda h, v: _changed(h, v, e=5),
    "etag-list": lambda h, v: _changed(h, v, e=["x"]),
    "digest-null": lambda h, v: _changed(h, v, d=None),
    "digest-non-ascii": lambda h, v: _changed(h, v, d="é" * 64),
    "tags-list": lambda h, v: _changed(h, v, t=["workflow", "w"]),
    "tags-str": lambda h, v: _changed(h, v, t="workflow=w"),
    "tag-value-int": lambda h, v: _changed(h, v, t={**h["t"], "workflow": 1}),
    "tag-value-null": lambda h, v: _changed(h, v, t={**h["t"], "kind": None}),
    "marker-int": lambda h, v: _changed(h, v, x=5),
    "marker-path": lambda h, v: _changed(h, v, x="../../../_v/_items/_s/tx/1"),
    "optimistic-flag": lambda h, v: _changed(h, v, o="yes"),
    "tombstone-z": lambda h, v: _frame(b'{"z": 2}'),
    "tombstone-extra": lambda h, v: _frame(json.dumps({"z": 1, "x": _TX, "e": "x"}).encode()),
    "tombstone-marker": lambda h, v: _frame(b'{"z": 1, "x": {"a": 1}}'),
}


def _records(backend: S3Backend, p: Partition) -> None:
    tags = {"workflow": "w", "kind": "k"}
    for name in ("a/y", "c/x/1", DAMAGED):
        backend.write(p, [make_put(name, name.encode(), tags=tags)])


def _objects(backend: S3Backend) -> dict[str, bytes]:
    return {k: backend.client.get_object(Bucket=BUCKET, Key=backend.root + k)["Body"].read() for k in _raw_keys(backend)}


def _damage_record(backend: S3Backend, p: Partition, name: str, damage: Damage) -> bytes:
    key = backend._layout(p.key).record(name)
    good = backend.client.get_object(Bucket=BUCKET, Key=key)["Body"].read()
    n = int.from_bytes(good[4:8], "big")
    bad = damage(json.loads(good[8 : 8 + n]), good[8 + n :])
    backend.client.put_object(Bucket=BUCKET, Key=key, Body=bad)
    return bad


Paths = dict[str, tuple[str, tuple[Any, ...]]]  # label -> (method, args)


def _read_paths(p: Partition) -> Paths:
    """Every read the backend has: label -> (method, args)."""
    return {
        "get": ("get", (p, [DAMAGED])),
        "get-many": ("get", (p, ["a/y", DAMAGED, "c/x/1"])),
        "list": ("list", (p, ListQuery())),
        "list-prefix-desc-limit": ("list", (p, ListQuery(prefix="c/x/1/", descending=True, limit=1))),
        "list-values-false": ("list", (p, ListQuery(prefix="c/", values=False))),
        "list-seq": ("list", (p, ListQuery(order="seq", descending=True))),
        "list-range": ("list", (p, ListQuery(start="c/x/1/", stop="c/x/1/x"))),
        "list-children": ("list", (p, ListQuery(prefix="c/x/", depth=0, children=True))),
        "list-children-latest": ("list", (p, ListQuery(prefix="c/x/", depth=0, descending=True, limit=1, children=True))),
        "list-children-keys": ("list", (p, ListQuery(prefix="c/x/", depth=0, children=True, values=False))),
        "list-tag": ("list", (p, ListQuery(tags={"kind": "k"}))),
        "list-indexed-tag": ("list", (p, ListQuery(order="seq", tags={"workflow": "w"}))),
        "list-indexed-tag-latest": ("list", (p, ListQuery(order="seq", descending=True, limit=1, tags={"workflow": "w"}))),
        "list-indexed-tag-keys": ("list", (p, ListQuery(prefix="c/", order="seq", tags={"workflow": "w"}, values=False))),
        "partitions": ("partitions", (p.user, p.space)),
        "recover": ("recover", (p,)),
    }


def _call(backend: S3Backend, face: str, method: str, args: tuple[Any, ...]) -> Any:
    if face == "sync":
        return getattr(backend, method)(*args)
    return asyncio.run(getattr(backend, "a" + method)(*args))


def _assert_corrupt(backend: S3Backend, paths: Paths, key: str) -> None:
    """Every path, sync and async, raises CorruptItemError naming ``key`` (and nothing else escapes)."""
    for label, (method, args) in paths.items():
        for face in ("sync", "async"):
            try:
                got = _call(backend, face, method, args)
            except CorruptItemError as exc:
                assert exc.key == key, f"{label} {face}: names {exc.key!r}, not {key!r}: {exc}"
                assert repr(key) in str(exc)
            except Exception as exc:  # noqa: BLE001 - the point: nothing else may escape
                pytest.fail(f"{label} {face}: {type(exc).__name__}: {exc}")
            else:
                pytest.fail(f"{label} {face}: returned {got!r} instead of raising CorruptItemError")


@pytest.mark.parametrize("damage", list(_DAMAGE))
def test_a_damaged_record_is_corrupt_on_every_read_path(s3_backend: S3Backend, damage: str) -> None:
    s3 = s3_backend
    p = Partition("u", "items", "s")
    _records(s3, p)
    good = s3.get(p, ["a/y", "c/x/1"])
    bad = _damage_record(s3, p, DAMAGED, _DAMAGE[damage])
    before = _objects(s3)
    _assert_corrupt(s3, _read_paths(p), DAMAGED)
    fresh = S3Backend(BUCKET, s3.root, client=s3.client, lease=0.0)  # a new process, every lease expired
    try:
        _assert_corrupt(fresh, {k: v for k, v in _read_paths(p).items() if k in ("get", "list", "recover")}, DAMAGED)
    finally:
        fresh.close()
    assert _objects(s3) == before, "a read or recover changed the stored objects"
    assert before[s3._layout(p.key).record(DAMAGED)[len(s3.root) :]] == bad
    # The damage stays contained: the other records read as before.
    assert s3.get(p, ["a/y", "c/x/1"]) == good
    assert s3.list(p, ListQuery(prefix="a/")) == good[:1]
    assert s3.list(p, ListQuery(prefix="c/x/", depth=0)) == good[1:]


def test_corrupt_reads_over_http(s3_http_backend: S3Backend) -> None:
    s3 = s3_http_backend
    p = Partition("u", "items", "s")
    _records(s3, p)
    for damage in ("length-past-end", "seq-str", "tags-list", "not-utf8"):
        _damage_record(s3, p, DAMAGED, _DAMAGE[damage])
        _assert_corrupt(s3, _read_paths(p), DAMAGED)
        s3.write(p, [make_put(DAMAGED, b"v", tags={"workflow": "w", "kind": "k"})])
        assert [r.name for r in s3.list(p, ListQuery())] == ["a/y", "c/x/1", DAMAGED]


def test_stray_keys_are_corrupt_not_another_record(s3_backend: S3Backend) -> None:
    """Keys that are not a record's / an index entry's / a manifest's are never read as another record."""
    s3 = s3_backend
    p = Partition("u", "items", "s")
    _records(s3, p)
    body = s3.client.get_object(Bucket=BUCKET, Key=s3._layout(p.key).record("c/x/1"))["Body"].read()
    paths = _read_paths(p)
    listings = {  # the name listings that reach the stray keys
        k: v for k, v in paths.items() if k.startswith("list") and not any(w in k for w in ("indexed", "prefix", "range"))
    }
    # Without the checks the first was read as "c/x/1" a second time (its last character
    # taken for the "~"), the others raised ValueError.
    for tail in (_invert("c/x/1") + "q", _invert(DAMAGED) + "~x", _invert(DAMAGED) + "é~"):
        key = s3._layout(p.key).records + tail
        s3.client.put_object(Bucket=BUCKET, Key=key, Body=body)
        _assert_corrupt(s3, {**listings, "recover": paths["recover"]}, f"r/{tail}")
        assert s3.get(p, ["c/x/1"])[0] is not None  # reads by name never meet it
        s3.client.delete_object(Bucket=BUCKET, Key=key)
    base = s3._layout(p.key).tag("workflow", "w")[len(s3.root) :]
    indexed = {k: v for k, v in paths.items() if "indexed" in k and "latest" not in k}  # latest: stops before
    for stray, reads in (
        (base + "notaseq/c/x/1", {**indexed, "recover": paths["recover"]}),
        (base + "0" * 20 + "/c/é", {**indexed, "recover": paths["recover"]}),
        (base.rsplit("/", 2)[0] + "/xyz/" + "0" * 20 + "/a/y", {"recover": paths["recover"]}),  # no tag's hash
    ):
        s3.client.put_object(Bucket=BUCKET, Key=s3.root + stray, Body=b"")
        _assert_corrupt(s3, reads, "t/" + stray.split("/t/", 1)[1])
        s3.client.delete_object(Bucket=BUCKET, Key=s3.root + stray)
    s3.client.put_object(Bucket=BUCKET, Key=f"{s3.root}{p.key}/tx/not-a-batch", Body=b"x")
    _assert_corrupt(s3, {"recover": paths["recover"]}, "tx/not-a-batch")
    assert [r.name for r in s3.list(p, ListQuery())] == ["a/y", "c/x/1", DAMAGED]


def test_a_damaged_partition_name_is_corrupt(s3_backend: S3Backend) -> None:
    s3 = s3_backend
    long_name, other = "n" * 400, "m" * 400  # hashed partition keys: the raw name is kept in <p>/p
    p, q = Partition("u", "items", long_name), Partition("u", "items", other)
    s3.write(p, [make_put("k", b"v")])
    s3.write(q, [make_put("k", b"v")])
    assert s3.partitions("u", "items") == sorted([long_name, other])
    pkey = f"{s3.root}{p.key}/p"
    label = p.key.rsplit("/", 1)[1] + "/p"
    for bad in (b"\xff\xfe", other.encode(), b""):  # not UTF-8; another partition's name; empty
        s3.client.put_object(Bucket=BUCKET, Key=pkey, Body=bad)
        _assert_corrupt(s3, {"partitions": ("partitions", ("u", "items"))}, label)
    s3.client.put_object(Bucket=BUCKET, Key=pkey, Body=long_name.encode())
    assert s3.partitions("u", "items") == sorted([long_name, other])
    # A prefix that is no partition's encoding (upper/lower-case escape) holding a record.
    stray = Partition("u", "items", "a/b").key.replace("%2F", "%2f")
    record = s3.client.get_object(Bucket=BUCKET, Key=s3._layout(q.key).record("k"))["Body"].read()
    s3.client.put_object(Bucket=BUCKET, Key=f"{s3.root}{stray}/r/{_invert('k')}~", Body=record)
    _assert_corrupt(s3, {"partitions": ("partitions", ("u", "items"))}, stray.rsplit("/", 1)[1])


# -- damaged batch objects: manifests and markers ------------------------------------


def _pending_classic(s3: S3Backend, p: Partition, tx: str) -> tuple[bytes, list[Put]]:
    """A classic batch over a, b (puts) and c (delete) that crashed after its first record landed."""
    s3.write(p, [make_put(n, b"old") for n in ("a", "b", "c")])
    keys = s3._layout(p.key)
    current = {n: s3._bucket.get(keys.record(n)) for n in ("a", "b", "c")}
    etags = {n: got.etag for n, got in current.items() if got is not None}
    puts = [make_put(n, b"new") for n in ("a", "b")]
    ops = [Op(put.name, etags[put.name], record_body(put, 10**15 + i, tx), False) for i, put in enumerate(puts)]
    ops.append(Op("c", etags["c"], tombstone(tx), True))
    manifest = redo_manifest(ops)
    s3.client.put_object(Bucket=BUCKET, Key=keys.manifest(tx), Body=manifest)
    s3.client.put_object(Bucket=BUCKET, Key=keys.record("a"), Body=ops[0].body)
    return manifest, puts


def _manifest_damage(manifest: bytes, tx: str) -> dict[str, bytes]:
    n = int.from_bytes(manifest[4:8], "big")
    header, bodies = json.loads(manifest[8 : 8 + n]), manifest[8 + n :]

    def framed(h: Any, rest: bytes = bodies) -> bytes:
        raw = json.dumps(h).encode()
        return _TX_MAGIC + len(raw).to_bytes(4, "big") + raw + rest

    shifted = [dict(op) for op in header]
    shifted[0]["l"] += 1
    shifted[1]["l"] -= 1
    other_tx = _pending_body_of(header, bodies, 0).replace(tx.encode(), f"{2:020d}-{'cd' * 16}".encode())
    return {
        "empty": b"",
        "garbage": b"garbage",
        "magic-only": _TX_MAGIC,
        "truncated": manifest[: len(manifest) // 2],
        "length-past-end": _TX_MAGIC + (len(manifest)).to_bytes(4, "big") + manifest[8:],
        "not-json": _TX_MAGIC + (5).to_bytes(4, "big") + b"{[}]x" + bodies,
        "not-utf8": framed(None)[:8] + b"\xff\xfe\xfd\xfc" + bodies,
        "dict-not-list": framed({"n": "a"}),
        "empty-list": framed([]),
        "op-missing-name": framed([{k: v for k, v in op.items() if k != "n"} for op in header]),
        "op-bad-name": framed([{**header[0], "n": "../x"}, *header[1:]]),
        "op-name-twice": framed([header[0], {**header[1], "n": header[0]["n"]}, header[2]]),
        "op-length-str": framed([{**header[0], "l": "12"}, *header[1:]]),
        "op-length-negative": framed([{**header[0], "l": -1}, *header[1:]]),
        "op-length-past-end": framed([*header[:2], {**header[2], "l": header[2]["l"] + 1000}]),
        "op-lengths-shifted": framed(shifted),  # op 0 would get op 1's first byte
        "op-etag-int": framed([{**header[0], "p": 7}, *header[1:]]),
        "op-delete-not-bool": framed([{**header[0], "d": "no"}, *header[1:]]),
        "op-delete-flag-wrong": framed([{**header[0], "d": True}, *header[1:]]),
        "body-damaged": framed(header, b"X" + bodies[1:]),
        "body-of-another-batch": framed(header, other_tx + bodies[header[0]["l"] :]),
        "trailing-bytes": manifest + b"more",
        "optimistic-not-json": _TX_MAGIC + b"{nope",
        "optimistic-names-not-list": _TX_MAGIC + b'{"o":1,"n":"a"}',
    }


def _pending_body_of(header: list[dict[str, Any]], bodies: bytes, i: int) -> bytes:
    pos = sum(op["l"] for op in header[:i])
    return bodies[pos : pos + header[i]["l"]]


def test_a_pending_batch_is_rolled_forward_when_its_manifest_is_intact(s3_backend: S3Backend) -> None:
    """The control for the test below: the same constructed batch, undamaged, rolls forward."""
    s3 = s3_backend
    p = Partition("u", "items", "s")
    _pending_classic(s3, p, _TX)
    fresh = S3Backend(BUCKET, s3.root, client=s3.client)
    try:
        assert [(r.name, r.value) for r in fresh.list(p, ListQuery())] == [("a", b"new"), ("b", b"new")]
        assert not [k for k in _raw_keys(s3) if "/tx/" in k]
    finally:
        fresh.close()


_MANIFEST_DAMAGE = [
    "empty", "garbage", "magic-only", "truncated", "length-past-end", "not-json", "not-utf8", "dict-not-list",
    "empty-list", "op-missing-name", "op-bad-name", "op-name-twice", "op-length-str", "op-length-negative",
    "op-length-past-end", "op-lengths-shifted", "op-etag-int", "op-delete-not-bool", "op-delete-flag-wrong",
    "body-damaged", "body-of-another-batch", "trailing-bytes", "optimistic-not-json", "optimistic-names-not-list",
]  # the keys of _manifest_damage()


@pytest.mark.parametrize("damage", _MANIFEST_DAMAGE)
def test_a_damaged_manifest_is_corrupt_and_nothing_is_rolled_or_deleted(s3_backend: S3Backend, damage: str) -> None:
    s3 = s3_backend
    p = Partition("u", "items", "s")
    manifest, _ = _pending_classic(s3, p, _TX)
    damaged = _manifest_damage(manifest, _TX)
    assert sorted(damaged) == sorted(_MANIFEST_DAMAGE)
    s3.client.put_object(Bucket=BUCKET, Key=s3._layout(p.key).manifest(_TX), Body=damaged[damage])
    before = _objects(s3)
    fresh = S3Backend(BUCKET, s3.root, client=s3.client, lease=0.0)  # a new process, the batch long expired
    try:
        # "a" carries the batch's marker: every read that meets it names it.
        paths = {
            "get": ("get", (p, ["a"])),
            "get-many": ("get", (p, ["a", "b", "c"])),
            "list": ("list", (p, ListQuery())),
            "list-keys": ("list", (p, ListQuery(values=False))),
            "list-latest": ("list", (p, ListQuery(descending=True, limit=3))),
            "list-seq": ("list", (p, ListQuery(order="seq"))),
        }
        for backend in (s3, fresh):
            _assert_corrupt(backend, paths, "a")
            _assert_corrupt(backend, {"recover": ("recover", (p,))}, f"tx/{_TX}")
            # A read that does not meet the marker is not concerned.
            assert [r.value for r in backend.get(p, ["b"])] == [b"old"]
        assert _objects(s3) == before, "a damaged manifest made a reader or recover write or delete"
        # The write paths over "a" refuse too, rather than overwrite it or the batch.
        with pytest.raises(CorruptItemError):
            fresh.write(p, [make_put("a", b"x", mode=Mode.CREATE)])
        assert _objects(s3) == before
    finally:
        fresh.close()


def test_a_damaged_optimistic_manifest_is_corrupt_and_nothing_is_deleted(s3_backend: S3Backend) -> None:
    s3 = s3_backend
    p = Partition("u", "langgraph", "t")
    s3.write(p, [make_put("w/old", b"o", mode=Mode.APPEND)])
    puts = [make_put(f"w/{i}", b"v", mode=Mode.APPEND) for i in range(2)]
    pending = record_body(puts[0], 10**15, _TX, optimistic=True)
    s3.client.put_object(Bucket=BUCKET, Key=s3._layout(p.key).record(puts[0].name), Body=pending)
    good = _TX_MAGIC + json.dumps({"o": 1, "n": [put.name for put in puts]}).encode()
    for bad in (
        b"",
        _TX_MAGIC + b"{",
        _TX_MAGIC + b'{"o":1}',
        _TX_MAGIC + b'{"o":1,"n":[1,2]}',
        _TX_MAGIC + b'{"o":1,"n":["w/0","w/0"]}',
        _TX_MAGIC + b'{"o":2,"n":["w/0"]}',
        _TX_MAGIC + b'{"o":1,"n":["w/0"],"a":"yes"}',
        _TX_MAGIC + b'["o","n"]',
        _TX_MAGIC + b'{"o":1,"n":["../../x"]}',
    ):
        s3.client.put_object(Bucket=BUCKET, Key=s3._layout(p.key).manifest(_TX), Body=bad)
        before = _objects(s3)
        fresh = S3Backend(BUCKET, s3.root, client=s3.client, lease=0.0)
        try:
            _assert_corrupt(fresh, {"get": ("get", (p, ["w/0"])), "list": ("list", (p, ListQuery()))}, "w/0")
            _assert_corrupt(fresh, {"recover": ("recover", (p,))}, f"tx/{_TX}")
        finally:
            fresh.close()
        assert _objects(s3) == before, bad
    # Control: the intact manifest of this expired batch is aborted by a reader, its record deleted.
    s3.client.put_object(Bucket=BUCKET, Key=s3._layout(p.key).manifest(_TX), Body=good)
    assert s3.get(p, ["w/0", "w/old"])[0] is None
    assert s3.recover(p) == (0, 0)
    assert [k for k in _raw_keys(s3) if "/tx/" in k or _invert("w/0") in k] == []


def test_recover_reports_damage_and_still_recovers_the_rest(s3_backend: S3Backend) -> None:
    s3 = s3_backend
    p = Partition("u", "items", "s")
    _pending_classic(s3, p, _TX)  # intact: recover rolls it forward
    s3.write(p, [make_put("z", b"z")])
    _damage_record(s3, p, "z", _DAMAGE["seq-str"])
    with pytest.raises(CorruptItemError) as info:
        s3.recover(p)
    assert info.value.key == "z" and "rolled 1 batch(es) forward" in str(info.value)
    assert [(r.name, r.value) for r in s3.list(p, ListQuery(stop="z"))] == [("a", b"new"), ("b", b"new")]
    assert not [k for k in _raw_keys(s3) if "/tx/" in k]


@pytest.mark.parametrize(
    "write",
    ["create", "append", "if-match", "delete-if-match", "append-batch", "append-batch-second", "mixed-batch"],
)
def test_a_write_that_must_read_a_damaged_record_refuses_and_leaves_it(s3_backend: S3Backend, write: str) -> None:
    s3 = s3_backend
    p = Partition("u", "items", "s")
    _records(s3, p)
    _damage_record(s3, p, DAMAGED, _DAMAGE["seq-str"])
    before = _objects(s3)
    batch = {
        "create": ([make_put(DAMAGED, b"x", mode=Mode.CREATE)], []),
        "append": ([make_put(DAMAGED, b"x", mode=Mode.APPEND)], []),
        "if-match": ([make_put(DAMAGED, b"x", mode=Mode.IF_MATCH, if_match="e")], []),
        "delete-if-match": ([], [Delete(DAMAGED, if_match="e")]),
        "append-batch": ([make_put(DAMAGED, b"x", mode=Mode.APPEND), make_put("n/1", b"x", mode=Mode.APPEND)], []),
        "append-batch-second": ([make_put("n/1", b"x", mode=Mode.APPEND), make_put(DAMAGED, b"x", mode=Mode.APPEND)], []),
        "mixed-batch": ([make_put("n/1", b"x"), make_put(DAMAGED, b"x", mode=Mode.APPEND)], []),
    }[write]
    for face in ("sync", "async"):
        with pytest.raises(CorruptItemError) as info:
            _call(s3, face, "write", (p, *batch))
        assert info.value.key == DAMAGED
        assert _objects(s3) == before, "the refused write left something behind or changed the record"


# -- a listing that a batch's delete lands under --------------------------------------


class _ThenOnce:
    """The port of a backend, running ``then`` once right after its first record GET."""

    def __init__(self, inner: Any, records: str, then: Callable[[str], None]) -> None:
        self.inner, self.records, self.then, self.fired = inner, records, then, ""

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def get(self, key: str) -> Any:
        got = self.inner.get(key)
        if key.startswith(self.records) and not self.fired:
            self.fired = key
            self.then(key)
        return got


def _list_around(
    writer: S3Backend, p: Partition, then: Callable[[str], None], query: ListQuery | None = None
) -> tuple[dict[str, bytes], str, int]:
    """A listing of ``p`` by a second process whose first record GET is followed by ``then(its record name)``.

    The reader GETs one by one ("the first" is well defined). Returns what
    it listed (name -> value), the name ``then`` got, and its LIST requests.
    """
    reader = S3Backend(BUCKET, writer.root, client=writer.client)
    reader._io.shutdown()
    reader._io = _Inline()  # type: ignore[assignment]
    keys = reader._layout(p.key)
    port = _ThenOnce(reader._batches.store, keys.records, lambda key: then(keys.name_of(key)))
    reader._batches.store = port
    try:
        got = {r.name: r.value for r in reader.list(p, query or ListQuery())}
        lists = reader.requests["ListObjectsV2"]
    finally:
        reader.close()
    assert port.fired
    return got, keys.name_of(port.fired), lists


def _olds(backend: S3Backend, p: Partition, names: Iterable[str]) -> None:
    for name in names:
        backend.write(p, [make_put(name, b"old")])


def test_a_listing_never_sees_a_delete_without_the_rest_of_its_batch(s3_backend: S3Backend) -> None:
    """A batch {upsert one, delete the other} commits (tombstone dropped) between a listing's two GETs.

    The listing read the first record old, then found the other absent:
    without a second collect it returned the old record alone, with the
    batch's delete but not its upsert. It is repeated and sees the batch.
    """
    p = Partition("u", "langgraph", "listing")
    _olds(s3_backend, p, "ab")

    def batch(first: str) -> None:
        s3_backend.write(p, [make_put(first, b"new")], [Delete("b" if first == "a" else "a")])

    got, first, _ = _list_around(s3_backend, p, batch)
    assert got == {first: b"new"}


def test_a_listing_never_mixes_a_batch_with_a_later_record_written_alone(s3_backend: S3Backend) -> None:
    """Between a listing's two GETs a batch {upsert both} commits, then a single upsert replaces the second.

    The listing reads the first record old, then the second as the single
    upsert wrote it. That record carries the marker of the batch record it
    replaced (``_s3_batch.inherited``), so the listing settles the batch
    (gone: committed) and is repeated: it returns the batch's state, not its
    old state beside a write made after it. Without the inherited marker
    only a second collect of every listing would tell (+38% requests per
    LangGraph run: listings mostly meet records written alone).
    """
    p = Partition("u", "langgraph", "listing-alone")
    _olds(s3_backend, p, "ab")

    def batch(first: str) -> None:
        s3_backend.write(p, [make_put("a", b"new"), make_put("b", b"new")])
        s3_backend.write(p, [make_put("b" if first == "a" else "a", b"alone")])

    got, first, _ = _list_around(s3_backend, p, batch)
    assert got[first] == b"new", f"the batch's old state beside a later write: {got}"


def test_a_listing_never_mixes_a_batch_with_a_record_created_alone_where_it_deleted(s3_backend: S3Backend) -> None:
    """Between a listing's two GETs a batch {upsert one, delete the other} commits, then the other is created alone.

    The created record replaces nothing (the batch's tombstone is dropped),
    so it has no marker to inherit: the listing returned the first record's
    old state beside a record created after the batch (a gap, fixed). A
    second collect on meeting a record without a marker, as multi-record
    gets do, would cost +38% requests per LangGraph run (whose records
    mostly have none). Now the listing compares the created record's S3
    ETag with the one its LIST gave: another one, the record was written
    during the listing, which is repeated.
    """
    p = Partition("u", "langgraph", "listing-recreated")
    _olds(s3_backend, p, "ab")

    def batch(first: str) -> None:
        other = "b" if first == "a" else "a"
        s3_backend.write(p, [make_put(first, b"new")], [Delete(other)])
        s3_backend.write(p, [make_put(other, b"created", mode=Mode.CREATE)])

    got, first, _ = _list_around(s3_backend, p, batch)
    assert got[first] == b"new", f"the batch's old state beside a later create: {got}"


def test_a_streaming_listing_collects_twice_a_record_listed_after_its_first_get(s3_backend: S3Backend) -> None:
    """The same on a later LIST page: the record created alone is listed as it is, after the listing's first GET.

    A name listing descending with a limit lists a page, GETs its records,
    then lists the next page. "b" and its 11 children fill the first page
    (12 keys: 4 x limit + 4 at depth 0); "b" is read old, then a batch
    {upsert b, delete a} commits and "a" is created alone; the second page
    lists "a" with the S3 ETag its GET gets, which dates nothing: "a" is
    collected a second time with "b", whose new S3 ETag repeats the listing.
    """
    p = Partition("u", "langgraph", "listing-later-page")
    _olds(s3_backend, p, ["a", "b", *(f"b/{i:02d}" for i in range(11))])

    def batch(first: str) -> None:
        assert first == "b"
        s3_backend.write(p, [make_put("b", b"new")], [Delete("a")])
        s3_backend.write(p, [make_put("a", b"created", mode=Mode.CREATE)])

    query = ListQuery(order="name", descending=True, limit=2, depth=0)
    got, _, lists = _list_around(s3_backend, p, batch, query)
    assert lists >= 2, "the listing took one page"
    assert got == {"b": b"new", "a": b"created"}, f"the batch's old state beside a later create: {got}"


def test_an_index_listing_never_mixes_a_batch_with_a_record_created_alone_where_it_deleted(
    s3_backend: S3Backend,
) -> None:
    """The same through the tag index: its LIST names index entries, so no S3 ETag dates the records.

    The created record has another seq than the entry listed for the old
    one, so it was skipped (as the entries of records rewritten long ago
    are), and the listing returned the first record's old state with the
    batch's delete of the other (a gap, fixed). A record's entries are
    written before it: one the query selects whose own entry the LIST did
    not name was written after that LIST, and the listing is repeated.
    """
    p = Partition("u", "langgraph", "index-recreated")
    for name in "ab":
        s3_backend.write(p, [make_put(name, b"old", tags={"workflow": "w"})])

    def batch(first: str) -> None:
        other = "b" if first == "a" else "a"
        s3_backend.write(p, [make_put(first, b"new", tags={"workflow": "w"})], [Delete(other)])
        s3_backend.write(p, [make_put(other, b"created", tags={"workflow": "w"}, mode=Mode.CREATE)])

    got, first, _ = _list_around(s3_backend, p, batch, ListQuery(order="seq", tags={"workflow": "w"}))
    assert got.get(first) == b"new", f"the batch's old state beside its delete: {got}"


def test_requests_do_not_call_uuid4(s3: S3Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    """LangGraph's own tests patch ``uuid.uuid4`` (test_root_graph): botocore's invocation ids are drawn without it.

    botocore draws one per request with ``uuid.uuid4`` unless the request
    has one; the backend gives each request its own first.
    """
    import uuid

    def patched() -> uuid.UUID:
        raise AssertionError("uuid.uuid4 called")

    p = Partition("u", "langgraph", "no-uuid4")
    monkeypatch.setattr(uuid, "uuid4", patched)
    s3.write(p, [make_put("a", b"1", mode=Mode.APPEND), make_put("b", b"2", mode=Mode.APPEND)])
    s3.write(p, [make_put("a", b"3")], [Delete("b")])
    assert [r.value for r in s3.list(p, ListQuery())] == [b"3"]
