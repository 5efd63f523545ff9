"""Redis: the newest record by tag in seq order does a bounded amount of work at any history.

A listing by tag in seq order with ``limit=1`` (the Agent Framework storage's
``get_latest``: newest checkpoint of a workflow) must read the same few index
members and records whatever the number of records. A layout that indexes
tags in name order only (14cd4a9, reverted in 1bd9205) turns it into a read
of every record of the tag and a sort, and no test noticed.

The work is counted inside the server, exactly: the real listing script runs
wrapped in a chunk that shadows ``redis`` with a counting ``redis.call``
(commands, members/fields and bytes the script read) and stores the counts
under a key of the partition's slot. The script's text, arguments and reply
are unchanged (the listing still returns what it returns unwrapped), so the
backend and the storage above it run as they always do. No shared server
statistic is read, so other clients of the server cannot disturb the counts.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest

import checkpointers.backends.redis as redis_module
from checkpointers._flows import make_put
from checkpointers._names import Partition
from checkpointers.backends._redis_transport import Script
from checkpointers.backends.base import ListQuery
from checkpointers.backends.redis import RedisBackend

#: Stored under the listing's first key (``P:{pk}:r``) plus this suffix: same slot.
WORK_SUFFIX = ":work"


def counting(script: Script) -> Script:
    """``script`` run inside a chunk that counts what its ``redis.call`` reads.

    After the script's own body returns, the counts ``"<commands> <members>
    <bytes>"`` go to ``KEYS[1] .. ":work"`` and the body's reply is returned
    as it is. ``members`` counts the elements of table replies plus string
    replies; ``bytes`` the lengths of the strings among them.
    """
    return Script(
        "local real_redis = redis\n"
        "local work = {0, 0, 0}\n"
        "local function counted(...)\n"
        "  local reply = real_redis.call(...)\n"
        "  work[1] = work[1] + 1\n"
        "  if type(reply) == 'table' then\n"
        "    work[2] = work[2] + #reply\n"
        "    for _, v in ipairs(reply) do\n"
        "      if type(v) == 'string' then work[3] = work[3] + #v end\n"
        "    end\n"
        "  elseif type(reply) == 'string' then\n"
        "    work[2] = work[2] + 1\n"
        "    work[3] = work[3] + #reply\n"
        "  end\n"
        "  return reply\n"
        "end\n"
        "local redis = setmetatable({call = counted}, {__index = real_redis})\n"
        "local function body()\n"
        f"{script.source}\n"
        "end\n"
        "local reply = body()\n"
        f"real_redis.call('SET', KEYS[1] .. '{WORK_SUFFIX}', table.concat(work, ' '))\n"
        "return reply\n"
    )


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every listing of every Redis backend runs the counting wrapper of the real script."""
    monkeypatch.setattr(redis_module, "LIST_SCRIPT", counting(redis_module.LIST_SCRIPT))
    yield


def work_of(backend: RedisBackend, p: Partition) -> tuple[int, int, int]:
    """(commands, members, bytes) the last listing of ``p`` read in the server."""
    raw = backend._link.sync_client().get(backend._keys(p)[0] + WORK_SUFFIX)
    assert raw is not None, "the counting listing script did not run"
    commands, members, size = (int(x) for x in raw.split())
    return commands, members, size


def fill(backend: RedisBackend, p: Partition, n: int) -> None:
    """``n`` records under ``c/``, all tagged with one workflow (and a unique id, like the storage's)."""
    for start in range(0, n, 250):
        puts = [
            make_put(f"c/_{i:06d}", b"x" * 600, tags={"workflow": "w", "id": f"{i:06d}", "iteration": str(i)})
            for i in range(start, min(n, start + 250))
        ]
        assert backend.write(p, puts).conflict is None


SIZES = (100, 2000)


def test_newest_by_tag_in_seq_order_reads_a_bounded_part_of_the_history(
    redis_backend: RedisBackend, counted: None
) -> None:
    b = redis_backend
    work = {}
    for n in SIZES:
        p = Partition("bounded", "af", f"latest-{n}-{uuid.uuid4().hex[:6]}")
        fill(b, p, n)
        for values in (True, False):
            q = ListQuery(prefix="c/", order="seq", tags={"workflow": "w"}, descending=True, limit=1, values=values)
            trips = b.round_trips
            got = b.list(p, q)
            work[n, values] = work_of(b, p)
            assert [r.name for r in got] == [f"c/_{n - 1:06d}"]
            assert got[0].value == (b"x" * 600 if values else b"")
            assert b.round_trips - trips <= 2  # one, plus a NOSCRIPT reload on the first use
    for values in (True, False):
        (c_small, m_small, b_small), (c_big, m_big, b_big) = work[SIZES[0], values], work[SIZES[1], values]
        assert (c_small, m_small) == (c_big, m_big), work
        # one index member and one record's metadata (+ value): longer seq and
        # iteration digits are the only difference
        assert m_big <= 4 and b_big <= b_small + 16, work


def test_the_counting_wrapper_sees_a_listing_that_grows(redis_backend: RedisBackend, counted: None) -> None:
    """The counts can fail: a listing without limit reads every record of the tag."""
    b = redis_backend
    members = {}
    for n in (10, 40):
        p = Partition("bounded", "af", f"all-{n}-{uuid.uuid4().hex[:6]}")
        fill(b, p, n)
        assert len(b.list(p, ListQuery(prefix="c/", order="seq", tags={"workflow": "w"}))) == n
        members[n] = work_of(b, p)[1]
    assert members[40] >= members[10] + 30, members


def test_agent_framework_get_latest_is_bounded_on_redis(redis_backend: RedisBackend, counted: None) -> None:
    """The storage's get_latest: one round trip, the same work in the server at 100 and 2,000 checkpoints."""
    from agent_framework import WorkflowCheckpoint

    from adapters.agent_framework import IsolatedCheckpointStorage

    b = redis_backend
    work = {}

    async def grow_and_read(n: int) -> None:
        storage = IsolatedCheckpointStorage(b, user=f"u{n}-{uuid.uuid4().hex[:6]}")
        previous = None
        for i in range(n):
            cp = WorkflowCheckpoint(
                workflow_name="wf",
                graph_signature_hash="sig",
                previous_checkpoint_id=previous,
                state={"counter": i},
                iteration_count=i,
            )
            await storage.save(cp)
            previous = cp.checkpoint_id
        await storage.get_latest(workflow_name="wf")  # a first use may reload the script
        trips = b.round_trips
        latest = await storage.get_latest(workflow_name="wf")
        assert b.round_trips - trips == 1
        assert latest is not None and latest.checkpoint_id == previous
        commands, members, _ = work_of(b, storage.partition)
        work[n] = (commands, members)

    for n in SIZES:
        asyncio.run(grow_and_read(n))
    assert work[SIZES[0]] == work[SIZES[1]], work
    assert work[SIZES[1]][1] <= 4, work
