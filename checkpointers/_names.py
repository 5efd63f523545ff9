"""Names, limits and the isolation key encoding, written once for every backend.

Two layers of names exist:

* **User-facing names** (scopes, item keys, tags) are validated here before any
  I/O and raise :class:`~checkpointers.errors.InvalidNameError`.
* **Backend names** are what a backend stores. Every component that came from
  a caller (user id, thread id, namespace, scope, key) goes through
  :func:`encode_component`, which is injective and never produces the
  delimiter ``/``, so a joined backend name can be split back unambiguously and
  no user's prefix is a prefix of another user's (``alice/`` vs ``alice2/``).

The encoded alphabet is ``[A-Za-z0-9_%-]`` plus the leading marker: no glob or
regex metacharacter (``* ? [ ] { } .``), no ``/``, no NUL, no whitespace. That
makes encoded names safe inside Redis ``SCAN MATCH`` patterns, Redis Cluster
hash tags and S3 prefixes.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import quote, unquote

from .errors import InvalidNameError, ItemTooLargeError, TooManyTagsError

__all__ = [
    "ANONYMOUS_USER",
    "DEFAULT_MAX_ITEM_BYTES",
    "MAX_KEY_LENGTH",
    "MAX_SCOPE_LENGTH",
    "MAX_TAGS",
    "MAX_TAG_KEY_LENGTH",
    "MAX_TAG_VALUE_LENGTH",
    "MAX_USER_LENGTH",
    "Partition",
    "check_size",
    "check_tags",
    "decode_component",
    "encode_component",
    "encode_prefixable",
    "validate_key",
    "validate_scope",
    "validate_user",
]

DEFAULT_MAX_ITEM_BYTES = 1_048_576  # 1 MiB
MAX_TAGS = 16
MAX_TAG_KEY_LENGTH = 64
MAX_TAG_VALUE_LENGTH = 256
MAX_SCOPE_LENGTH = 128
MAX_KEY_LENGTH = 256
_MAX_ENCODED_KEY = 640
MAX_USER_LENGTH = 1024

#: The user space of callers that name no user. Isolated like any other user.
ANONYMOUS_USER = ""

# Components longer than this (after percent-encoding) are stored by digest so
# that backend keys stay within every backend's key length (S3: 1,024 bytes).
_MAX_ENCODED = 160
_SCOPE_SEGMENT = re.compile(r"^[A-Za-z0-9_.:@=+,-]+$")
#: What ``quote(..., safe="")`` leaves unchanged once ``.`` and ``~`` are encoded too (ASCII ranges only).
_PLAIN = re.compile(r"[A-Za-z0-9_-]*").fullmatch


@functools.lru_cache(maxsize=65536)
def encode_component(value: str) -> str:
    """Encode one caller-supplied component for use inside a backend name.

    Injective on all Python strings (lone surrogates included), never empty,
    and free of ``/`` and of glob/regex metacharacters::

        >>> encode_component("alice")
        '_alice'
        >>> encode_component("a/b*")
        '_a%2Fb%2A'
        >>> encode_component("")
        '_'
        >>> encode_component("..")
        '_%2E%2E'

    Short values are percent-encoded behind the marker ``_`` (reversible with
    :func:`decode_component`); long ones become ``h`` + their SHA-256, a
    different marker, so the two forms never collide.
    """
    quoted = _quote(value)
    if len(quoted) <= _MAX_ENCODED:
        return "_" + quoted
    return "h" + hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()


def encode_prefixable(value: str) -> str:
    """Like :func:`encode_component` but never hashed, so prefixes stay prefixes.

    ``encode_prefixable(p)`` is a prefix of ``encode_prefixable(k)`` whenever
    ``p`` is a prefix of ``k`` (percent-encoding works byte by byte). Used for
    item keys, which callers list by prefix; their length is capped instead.
    """
    return "_" + _quote(value)


def _quote(value: str) -> str:
    if _PLAIN(value):  # ids, uuids, task names: percent-encoding keeps them as they are
        return value
    raw = value.encode("utf-8", "surrogatepass")
    return quote(raw, safe="").replace(".", "%2E").replace("~", "%7E")


def decode_component(encoded: str) -> str | None:
    """Invert :func:`encode_component`; ``None`` for the hashed (long) form."""
    if encoded.startswith("_"):
        return unquote(encoded[1:], encoding="utf-8", errors="surrogatepass")
    return None


@dataclass(frozen=True)
class Partition:
    """The unit of atomicity and isolation: one (user, space, name).

    ``space`` says which face owns the partition (``"items"``, ``"langgraph"``,
    ``"agent_framework"``) and ``name`` is the caller's scope, thread id or
    workflow name. Every write batch touches exactly one partition, so a
    backend can make it atomic (one SQLite transaction, one Redis Cluster hash
    slot, one S3 manifest).

    ``key`` is the injective, delimited backend prefix, ``user_key`` the prefix
    shared by all partitions of the user in this space.
    """

    user: str
    space: str
    name: str

    # cached_property writes the instance __dict__ directly, so it works on a
    # frozen dataclass; eq/hash only look at the fields.
    @functools.cached_property
    def user_key(self) -> str:
        """``<user>/<space>/``: the prefix of every partition of this user+space."""
        return f"{encode_component(self.user)}/{encode_component(self.space)}/"

    @functools.cached_property
    def key(self) -> str:
        """``<user>/<space>/<name>``: unique per partition, never a prefix of another."""
        return self.user_key + encode_component(self.name)

    @functools.cached_property
    def fields(self) -> bytes:
        """User, space and name, each as a 4-byte big-endian length then its UTF-8: injective.

        What a seal binds a record's place to (:mod:`checkpointers._integrity`);
        kept here so each partition encodes it once.
        """
        return b"".join(_length_prefixed(v) for v in (self.user, self.space, self.name))


def _length_prefixed(value: str) -> bytes:
    raw = value.encode("utf-8", "surrogatepass")
    return len(raw).to_bytes(4, "big") + raw


def validate_user(user: object) -> str:
    """Check a user id: any string up to 1,024 characters (``""`` is anonymous)."""
    if not isinstance(user, str):
        raise InvalidNameError("user id", user, "must be a string")
    if len(user) > MAX_USER_LENGTH:
        raise InvalidNameError(
            "user id", user, f"is {len(user)} characters, over {MAX_USER_LENGTH}"
        )
    return user


def validate_scope(scope: object) -> str:
    """Check a scope name: 1-128 characters, ``/``-separated non-empty segments.

    Segments use letters, digits and ``_ . : @ = + , -``; ``.`` and ``..`` are
    refused as segments so a scope never looks like a relative path.
    """
    if not isinstance(scope, str):
        raise InvalidNameError("scope", scope, "must be a string")
    if not 1 <= len(scope) <= MAX_SCOPE_LENGTH:
        raise InvalidNameError(
            "scope", scope, f"must be 1-{MAX_SCOPE_LENGTH} characters, got {len(scope)}"
        )
    for segment in scope.split("/"):
        if not segment:
            raise InvalidNameError(
                "scope", scope, "has an empty segment (leading, trailing or double '/')"
            )
        if segment in (".", ".."):
            raise InvalidNameError("scope", scope, f"has a {segment!r} segment")
        if not _SCOPE_SEGMENT.match(segment):
            raise InvalidNameError(
                "scope",
                scope,
                "may only use letters, digits, '/' and _ . : @ = + , -",
            )
    return scope


def validate_key(key: object) -> str:
    """Check an item key: 1-256 characters, no NUL or other control characters.

    Non-ASCII characters take up to 12 bytes once encoded; a key whose encoded
    form is over 640 bytes is refused too (S3 keys are capped at 1,024 bytes).
    """
    if not isinstance(key, str):
        raise InvalidNameError("key", key, "must be a string")
    if not 1 <= len(key) <= MAX_KEY_LENGTH:
        raise InvalidNameError(
            "key", key, f"must be 1-{MAX_KEY_LENGTH} characters, got {len(key)}"
        )
    if any(ord(c) < 32 or ord(c) == 127 for c in key):
        raise InvalidNameError("key", key, "must not contain control characters or NUL")
    if len(encode_prefixable(key)) > _MAX_ENCODED_KEY:
        raise InvalidNameError(
            "key", key, f"is over {_MAX_ENCODED_KEY} bytes once percent-encoded; shorten it"
        )
    return key


def check_tags(key: str, tags: Mapping[str, str] | None) -> dict[str, str]:
    """Validate tags: at most 16; keys 1-64 and values 0-256 characters, strings, no NUL."""
    if not tags:
        return {}
    if not isinstance(tags, Mapping):
        raise InvalidNameError("tags", tags, "must be a mapping of str to str")
    if len(tags) > MAX_TAGS:
        raise TooManyTagsError(key, len(tags), MAX_TAGS)
    out: dict[str, str] = {}
    for k, v in tags.items():
        if not isinstance(k, str) or not 1 <= len(k) <= MAX_TAG_KEY_LENGTH or "\x00" in k:
            raise InvalidNameError(
                "tag key", k, f"must be a string of 1-{MAX_TAG_KEY_LENGTH} characters without NUL"
            )
        if not isinstance(v, str) or len(v) > MAX_TAG_VALUE_LENGTH or "\x00" in v:
            raise InvalidNameError(
                "tag value",
                v,
                f"for tag {k!r} must be a string of at most {MAX_TAG_VALUE_LENGTH} characters without NUL",
            )
        out[k] = v
    return out


def check_size(key: str, size: int, limit: int) -> None:
    """Raise :class:`ItemTooLargeError` when ``size`` is over ``limit``."""
    if size > limit:
        raise ItemTooLargeError(key, size, limit)
