"""What a lease costs on the item API: time and backend calls per write, and per renewal.

For each backend (memory, SQLite on a file, Redis on ``--redis``), N
``set_item`` calls of one scope in three settings, then N renewals:

* ``allow``: ``Store(unleased="allow")``: the plain write, no lease involved;
* ``refuse``: the default ``unleased="refuse"``, to refuse writes to a scope
  someone holds: the write carries the lease record's condition itself (its
  last version seen free, or a vacant one created in the same batch) where the
  backend declares ``inline_conditions`` (memory, SQLite, Redis), else it
  first reads the lease record;
* ``lease``: under a lease: each write carries the lease record's condition
  (the record re-put unchanged, ``IF_MATCH``) in the same backend write;
* ``renew``: ``lease.renew()`` (one conditional write of the lease record).

Counts are backend calls per operation (a counting wrapper); times are
wall-clock means per operation, the best of 5 rounds of ``n/5`` (this
machine: 2 cores, shared), so compare rows, not machines.

    .venv/bin/python -m benchmarks.lease_cost [-n 500] [--redis redis://127.0.0.1:6379/0]
"""

from __future__ import annotations

import argparse
import uuid
from collections.abc import Callable

from benchmarks.effects_cost import Counting, backends, best_round, print_rows
from checkpointers import Store
from checkpointers.backends import Backend

VALUE = {"receipt": "r-0001", "amount": 100, "currency": "EUR"}
SETTINGS = ("allow", "refuse", "lease", "renew")


def measure(backend: Backend, setting: str, n: int) -> tuple[float, dict[str, float]]:
    """Mean seconds and backend calls per operation for one setting."""
    counting = Counting(backend)
    unleased = "allow" if setting == "allow" else "refuse"
    store = Store(counting, unleased=unleased).for_user(f"bench-{uuid.uuid4().hex}")  # type: ignore[arg-type]
    scope = f"runs/{uuid.uuid4().hex[:8]}"
    lease = store.acquire_lease(scope, "bench", ttl=600) if setting in ("lease", "renew") else None
    one: Callable[[int], object]
    if setting == "renew":
        assert lease is not None
        one = lambda i: lease.renew()  # noqa: E731 - one line per setting
    else:
        one = lambda i: store.set_item(scope, f"k{i}", VALUE, lease=lease)  # noqa: E731
    return best_round(counting, one, n)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=500, help="operations per setting")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0", help="Redis URL ('' to skip)")
    args = parser.parse_args()
    with backends(args.redis or None) as found:
        print_rows(found, SETTINGS, lambda b, s: measure(b, s, args.n), "us/op")


if __name__ == "__main__":
    main()
