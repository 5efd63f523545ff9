"""S3 retention: each partition's lifetime object (generation and expiry), over the batch protocol's port.

A partition with a ttl has one small object ``<p>/e``
(:class:`~checkpointers.backends._s3_objects.Lifetime`): its **generation**
and its **expiry**. Every record carries the generation it was written in;
only records of the current one are the partition's (others read as absent,
:func:`~checkpointers.backends._s3_batch.visible`). No object: generation 0,
no expiry (a store that never used a ttl pays one GET per read and per write
for the check, nothing else).

* **Reads** GET the lifetime object in parallel with their own requests and
  return nothing of an expired partition; with ``refresh_on_read`` a read
  past half the ttl pushes the expiry back (a conditional PUT).
* **Writes** (:meth:`Lifetimes.begin`) GET it first; over an expired
  partition they move it to a new generation (``If-Match`` the object read)
  before writing, so what it held reads as absent at once and never comes
  back; after the write committed (:meth:`Lifetimes.finish`) the expiry is
  moved to ``now + ttl`` (or "none"), ``If-Match``. If the generation moved
  or the partition expired during the write, the write's records are not
  the partition's: :class:`BackendUnavailableError`, nothing of it visible.
* **Sweeps** (:meth:`Lifetimes.claim`) move an expired partition to a new
  generation, still expired, ``If-Match`` the object they read as expired: a
  write that refreshed it meanwhile makes the claim fail and the partition
  stays. The caller then deletes everything older than the claim and the
  lifetime object last (``If-Match`` the claim).

Assumption (as for batches): a write finishes within ``lease`` seconds and
clocks agree to well under the ttl; a write slower than the ttl may see its
records read as absent (it is then told so).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..errors import BackendUnavailableError
from ._s3_batch import ObjectStore
from ._s3_objects import Lifetime, decode_lifetime, lifetime_body
from .base import Retention

__all__ = ["Begun", "Lifetimes"]

_ATTEMPTS = 16


@dataclass(frozen=True)
class Begun:
    """A partition's lifetime object as a write found (or made) it: its S3 ETag (None: absent), its content."""

    etag: str | None
    life: Lifetime
    moved: bool = False  #: the write moved an expired partition to this new generation


class Lifetimes:
    """The lifetime objects of one backend's partitions; ``retention()`` is the backend's current retention."""

    def __init__(self, store: ObjectStore, where: str, retention: Callable[[], Retention]) -> None:
        self.store = store
        self.where = where
        self.retention = retention

    def read(self, key: str) -> Begun:
        """The lifetime object at ``key`` (absent: generation 0, no expiry); CorruptItemError if damaged."""
        got = self.store.get(key)
        if got is None:
            return Begun(None, Lifetime())
        return Begun(got.etag, decode_lifetime(key.rsplit("/", 2)[-2] + "/e", got.body))

    def expired(self, life: Lifetime) -> bool:
        """Whether a partition with this lifetime is gone (its expiry passed)."""
        return self.retention().expired(life.expires_at)

    def refresh(self, key: str, found: Begun) -> None:
        """After a read: with ``refresh_on_read`` and under half the ttl left, push the expiry back (best effort)."""
        r = self.retention()
        if found.etag is not None and r.refresh_due(found.life.expires_at):
            self.store.put_if(key, lifetime_body(Lifetime(found.life.gen, r.deadline())), match=found.etag)

    def begin(self, key: str) -> Begun:
        """Before a write: the lifetime to write in; an expired partition is moved to a new generation first."""
        for _ in range(_ATTEMPTS):
            found = self.read(key)
            r = self.retention()
            now = r.now()
            if not r.expired(found.life.expires_at, now):
                return found
            new = Lifetime(max(found.life.gen + 1, int(now * 1e6)), r.deadline(now))
            etag = self.store.put_if(key, lifetime_body(new), absent=found.etag is None, match=found.etag)
            if etag is not None:
                return Begun(etag, new, moved=True)
        raise self._busy()

    def finish(self, key: str, begun: Begun) -> None:
        """After a committed write: the expiry moved to ``now + ttl`` (or none), in the generation written.

        :class:`BackendUnavailableError` if the partition expired or moved to
        another generation during the write (its records are not visible).
        """
        r = self.retention()
        now = r.now()
        want = r.deadline(now)
        found = begun
        for _ in range(_ATTEMPTS):
            if found.life.gen != begun.life.gen or r.expired(found.life.expires_at, now):
                raise BackendUnavailableError(
                    f"the partition expired (ttl) while this write ran on {self.where}: nothing of it is "
                    f"visible; retry it (the retry starts the partition afresh)"
                )
            have = found.life.expires_at
            if have == want or (want is not None and have is not None and have >= want):
                return
            body = lifetime_body(Lifetime(found.life.gen, want))
            if self.store.put_if(key, body, absent=found.etag is None, match=found.etag) is not None:
                return
            found = self.read(key)
        raise self._busy()

    def claim(self, key: str, found: Begun) -> Begun | None:
        """A sweep's claim on an expired partition: a new generation, still expired; None if it changed since."""
        if found.etag is None or not self.expired(found.life):
            return None
        new = Lifetime(max(found.life.gen + 1, int(self.retention().now() * 1e6)), found.life.expires_at)
        etag = self.store.put_if(key, lifetime_body(new), match=found.etag)
        return None if etag is None else Begun(etag, new)

    def _busy(self) -> BackendUnavailableError:
        return BackendUnavailableError(
            f"the lifetime object of a partition on {self.where} kept changing under this write "
            f"({_ATTEMPTS} attempts); retry it"
        )
