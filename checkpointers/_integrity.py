"""Record integrity: every record is bound to its identity, optionally with a secret.

A record's stored ``digest`` is ``<sha256 hex of the value>.<seal>``. The seal
covers what the writer knows at write time: the user, the space, the
partition name, the record name, the tags and the value's SHA-256. Two levels:

* **Without configuration** the seal is ``u`` + a SHA-256 of those fields
  (128 bits). A record copied from one user's, thread's or key's place to
  another's, a record spliced from two, or a damaged tag, name or value then
  fails its check: :class:`~checkpointers.errors.CorruptItemError`. Whoever can
  write the storage can recompute it: it catches accidents and careless
  copies, not a forger.
* **With a secret** (``integrity_key=`` on the store, the checkpointer or the
  Agent Framework storage, or the ``CHECKPOINTERS_INTEGRITY_KEY`` environment
  variable) the seal is ``k`` + a key id + HMAC-SHA256 (128 bits) of the same
  fields. Someone who can write the storage but does not hold the key cannot
  forge or move a record. Pass a list to rotate keys: the first signs, every
  one verifies (the environment variable takes a comma-separated list).

What a key does **not** protect against: a writer who deletes records, or
puts back an *older* record of the same name (a replay of a genuine record
at its own place passes its check), or someone who holds the key. Nor does
it hide data: values are stored in clear.

Records written before seals existed (a bare 64-hex digest) are read as
before when no key is configured. With a key, unkeyed and unsealed records
are refused unless ``accept_unsealed=True`` (for the time it takes to move an
old store over): anyone could have written them.

Append mode compares only the content part (before the ``.``, see
:func:`~checkpointers.backends.base.content_digest`), so re-appending the same
value after a key rotation, or over a record written before seals, is still a
no-op.

>>> from checkpointers._names import Partition
>>> seal = Integrity(keys=[])
>>> p = Partition("alice", "items", "runs")
>>> put = seal.put(p, "i/_k", b"v", etag="e1", tags={"kind": "plan"})
>>> _ = seal.check(p, _as_record(put), "k")          # passes
>>> seal.check(Partition("bob", "items", "runs"), _as_record(put), "k")  # doctest: +NORMALIZE_WHITESPACE
Traceback (most recent call last):
...
checkpointers.errors.CorruptItemError: stored item 'k' is corrupt: its seal does not match its place
(user, space, partition, name), its tags or its value: the record was copied, moved or damaged
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Mapping, Sequence

from ._names import Partition
from .backends.base import Mode, Put, Record, tags_json
from .errors import CorruptItemError, InvalidArgumentError

__all__ = ["ENV_VAR", "Integrity", "IntegrityKeys"]

#: Environment variable holding the integrity key(s), comma-separated (the first signs).
ENV_VAR = "CHECKPOINTERS_INTEGRITY_KEY"
#: Shortest key accepted, in bytes.
MIN_KEY_BYTES = 16
_DOMAIN = b"checkpointers/seal/1\x00"
_SEAL_HEX = 32  # 128 bits
_UNKEYED_LEN = 1 + _SEAL_HEX  # "u" + the seal
_sha256 = hashlib.sha256

#: What ``integrity_key=`` accepts: one key, several (the first signs), or none.
IntegrityKeys = str | bytes | Sequence[str | bytes] | None


def _field(value: str) -> bytes:
    raw = value.encode("utf-8", "surrogatepass")
    return len(raw).to_bytes(4, "big") + raw


#: The tags field of a record without tags (most records: blobs, writes).
_NO_TAGS = _field("{}")


def _key_id(key: bytes) -> str:
    return hashlib.sha256(b"checkpointers/key-id\x00" + key).hexdigest()[:8]


def _as_record(put: Put, seq: int = 1) -> Record:
    """A put as the record a backend would return for it (doctests, tests)."""
    return Record(put.name, put.value, dict(put.tags), put.etag, put.digest, seq)


class Integrity:
    """Seals records on write and checks them on read (see the module docstring).

    Args:
        keys: the secret(s) for HMAC seals; ``None`` reads ``CHECKPOINTERS_INTEGRITY_KEY``
            (unset or empty: unkeyed seals). ``[]`` forces unkeyed seals.
        accept_unsealed: also accept records without a seal you can trust
            (written before seals existed, or unkeyed when a key is set).
            Defaults to ``True`` without a key, ``False`` with one.
    """

    def __init__(self, keys: IntegrityKeys = None, *, accept_unsealed: bool | None = None) -> None:
        if keys is None:
            env = os.environ.get(ENV_VAR, "")
            keys = [k for k in (part.strip() for part in env.split(",")) if k]
        elif isinstance(keys, (str, bytes)):
            keys = [keys]
        self._keys: list[tuple[str, bytes]] = []
        for key in keys:
            raw = key.encode("utf-8") if isinstance(key, str) else bytes(key)
            if len(raw) < MIN_KEY_BYTES:
                raise InvalidArgumentError(
                    "integrity_key", f"a key must be at least {MIN_KEY_BYTES} bytes, got {len(raw)}"
                )
            self._keys.append((_key_id(raw), raw))
        self._by_id = dict(self._keys)
        self._signer = self._keys[0] if self._keys else None
        self.keyed = bool(self._keys)
        self.accept_unsealed = (not self.keyed) if accept_unsealed is None else accept_unsealed

    def __repr__(self) -> str:
        mode = f"hmac, {len(self._keys)} key(s)" if self.keyed else "unkeyed"
        return f"Integrity({mode}, accept_unsealed={self.accept_unsealed})"

    # -- sealing ----------------------------------------------------------------

    @staticmethod
    def _message(p: Partition, name: str, tags: Mapping[str, str], sha: str) -> bytes:
        """What a seal covers: the domain, the place (user, space, partition), name, tags, value digest.

        Every field but the digest is length-prefixed (:func:`_field`), so the
        encoding is injective; the partition's part is encoded once per
        partition (:attr:`Partition.fields`).
        """
        raw = name.encode("utf-8", "surrogatepass")
        if tags:  # _field(tags_json(tags)), inline: every record written and read passes here
            tj = tags_json(tags).encode("utf-8", "surrogatepass")
            tj = len(tj).to_bytes(4, "big") + tj
        else:
            tj = _NO_TAGS
        return b"".join((_DOMAIN, p.fields, len(raw).to_bytes(4, "big"), raw, tj, sha.encode()))

    def seal(self, p: Partition, name: str, tags: Mapping[str, str], sha: str) -> str:
        """The stored digest of a record: ``<sha>.<seal>``."""
        msg = self._message(p, name, tags, sha)
        if self._signer is not None:
            kid, key = self._signer
            return f"{sha}.k{kid}{hmac.digest(key, msg, 'sha256').hex()[:_SEAL_HEX]}"
        return f"{sha}.u{_sha256(msg).hexdigest()[:_SEAL_HEX]}"

    def put(
        self,
        p: Partition,
        name: str,
        value: bytes,
        *,
        etag: str,
        tags: Mapping[str, str] | None = None,
        mode: Mode = Mode.UPSERT,
        if_match: str | None = None,
        staged: bool = False,
        sha: str | None = None,
    ) -> Put:
        """A :class:`Put` of ``value`` at ``name`` in ``p``, sealed to that place (:meth:`seal`)."""
        tags = tags or {}
        sha = sha or _sha256(value).hexdigest()
        sealed = self.seal(p, name, tags, sha)
        return Put(name, value, sealed, etag, tags, mode, if_match, staged)

    # -- checking ---------------------------------------------------------------

    def check(self, p: Partition, record: Record, label: str | None = None) -> Record:
        """Return ``record`` if its value and seal hold for place ``p``, else raise CorruptItemError."""
        value, stored = record.value, record.digest
        if not isinstance(value, (bytes, bytearray)) or not isinstance(stored, str):
            raise CorruptItemError(label or record.name, "its digest or value has the wrong type")
        sha, dot, tag = stored.partition(".")
        if _sha256(value).hexdigest() != sha:
            raise CorruptItemError(label or record.name, "content does not match its sha256 digest")
        if dot and tag[:1] == "u" and len(tag) == _UNKEYED_LEN and (self.accept_unsealed or not self.keyed):
            # The common case, inline: an unkeyed seal this store accepts.
            good = _sha256(self._message(p, record.name, record.tags, sha)).hexdigest()[:_SEAL_HEX]
            if hmac.compare_digest(good, tag[1:]):
                return record
        return self._check_seal(p, record, label or record.name, sha, dot, tag)

    def check_place(self, p: Partition, record: Record, label: str | None = None) -> Record:
        """Check only the seal (place, name, tags, stored digest), not the value.

        For listings read without values (``ListQuery(values=False)``): a
        record copied from another place or with forged tags is refused even
        though its value was not read. The value is checked when it is read.
        """
        stored = record.digest
        if not isinstance(stored, str):
            raise CorruptItemError(label or record.name, "its digest has the wrong type")
        sha, dot, tag = stored.partition(".")
        return self._check_seal(p, record, label or record.name, sha, dot, tag)

    def _check_seal(self, p: Partition, record: Record, label: str, sha: str, dot: str, tag: str) -> Record:
        """The seal part of :meth:`check_place` (``sha``, ``dot``, ``tag``: the stored digest's parts)."""
        if not dot:
            if self.accept_unsealed:
                return record  # written before seals existed
            raise CorruptItemError(
                label,
                "it carries no seal (written before 0.2, or by a writer without the integrity key); "
                "pass accept_unsealed=True to read such records while you move the store over",
            )
        msg = self._message(p, record.name, record.tags, sha)
        if tag[:1] == "u" and len(tag) == _UNKEYED_LEN:
            if self.keyed and not self.accept_unsealed:
                raise CorruptItemError(
                    label, "it has an unkeyed seal but this store requires HMAC seals (integrity_key is set)"
                )
            good = _sha256(msg).hexdigest()[:_SEAL_HEX]
        elif tag[:1] == "k" and len(tag) == 9 + _SEAL_HEX:
            key = self._by_id.get(tag[1:9])
            if key is None:
                raise CorruptItemError(
                    label,
                    "it is sealed with an integrity key this store does not hold; pass that key in "
                    f"integrity_key= (or {ENV_VAR})",
                )
            good = hmac.digest(key, msg, "sha256").hex()[:_SEAL_HEX]
        else:
            raise CorruptItemError(label, "its seal is malformed")
        if not hmac.compare_digest(good, tag[-_SEAL_HEX:]):
            raise CorruptItemError(
                label,
                "its seal does not match its place (user, space, partition, name), its tags or its "
                "value: the record was copied, moved or damaged",
            )
        return record
