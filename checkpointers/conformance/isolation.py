"""Isolation checks: no user can reach another user's state through any method.

The hostile ids are chosen so that a naive encoding collides: prefixes of each
other, glob and regex metacharacters, separators, percent-encodings, ``..``,
NUL, unicode normalization twins, the empty string and very long strings.
"""

from __future__ import annotations

import uuid

from ..backends.base import Backend, ListQuery
from ..errors import ConcurrencyError
from ..flows import make_put
from ..names import Partition
from .contract import Api, _raises

__all__ = ["HOSTILE_IDS", "ISOLATION_CHECKS", "BACKEND_ISOLATION_CHECKS"]

#: Ids that break naive key schemes, in groups that must stay apart.
HOSTILE_IDS = [
    "alice",
    "alice2",
    "alice/",
    "alice/x",
    "a*",
    "a?ice",
    "[a]lice",
    "a%2Flice",
    "a/lice",
    "..",
    "../alice",
    "",
    "\x00",
    "alice\x00",
    "caf\u00e9",  # NFC
    "cafe\u0301",  # NFD twin
    "{alice}",
    "alice:1",
    "_alice",
    "x" * 1000,
    "x" * 999,
]


async def check_users_never_meet_through_items(api: Api) -> None:
    """Every hostile user writes the same scope and keys; each sees only its own."""
    tag = uuid.uuid4().hex[:8]
    users = [f"{u}" for u in HOSTILE_IDS]
    views = {u: api.for_user(u + tag) if u else api.for_user(tag) for u in users}
    # Distinct users by construction: suffix the tag so runs never share state.
    for i, view in enumerate(views.values()):
        await view.set("shared/scope", "k", {"owner": i})
        await view.step("shared/scope", "1", {"owner": i})
    for i, (u, view) in enumerate(views.items()):
        items = await view.list("shared/scope")
        assert sorted(it.key for it in items) == ["k", "steps/1"], (u, items)
        assert all(it.value == {"owner": i} for it in items), f"user {u!r} sees {items}"
        assert (await view.get("shared/scope", "k")).value == {"owner": i}


async def check_other_user_cannot_change(api: Api) -> None:
    """B's get/list/delete/if_match writes never reach A's items."""
    run = uuid.uuid4().hex[:8]
    a, b = api.for_user(run + "alice"), api.for_user(run + "alice2")
    item = await a.set("s", "k", "mine")
    await a.step("s", "1", "done")
    before = await a.snapshot("s")
    assert await b.get("s", "k") is None and await b.list("s") == []
    assert await b.delete("s", "k") is False
    await _raises(ConcurrencyError, b.set("s", "k", "theirs", if_match=item.etag), "guessed etag")
    await b.step("s", "1", "different")  # B's own step: no mismatch with A's
    await b.set("s", "k", "theirs")
    assert await a.snapshot("s") == before, "user B changed user A's scope"


ISOLATION_CHECKS = [check_users_never_meet_through_items, check_other_user_cannot_change]


async def check_backend_partitions_disjoint(backend: Backend) -> None:
    """Partitions of hostile users, spaces and names never share records or listings."""
    run = uuid.uuid4().hex[:8]
    parts = []
    for u in HOSTILE_IDS:
        for name in ("t", "t/1", "", "*"):
            parts.append(Partition(run + u, "lg", name))
    for i, p in enumerate(parts):
        await backend.awrite(p, [make_put("r", str(i).encode())])
    for i, p in enumerate(parts):
        got = await backend.alist(p, ListQuery())
        assert [(r.name, r.value) for r in got] == [("r", str(i).encode())], (p, got)
    for u in HOSTILE_IDS:
        names = await backend.apartitions(run + u, "lg")
        assert sorted(names) == sorted(["t", "t/1", "", "*"]), (u, names)


BACKEND_ISOLATION_CHECKS = [check_backend_partitions_disjoint]
