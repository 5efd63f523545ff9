"""Hypothesis strategies that draw the ids a naive key scheme gets wrong.

Every strategy mixes plain characters with hostile *atoms*: separators
(``/ : | %``), glob and regex metacharacters (``* ? [ ] { } ^ $ . +``),
percent-encodings (``%2F``, ``%25``), ``..``, NUL, unicode normalization twins
(``é`` NFC vs NFD, ``Å`` vs the Ångström sign, the ``ﬁ`` ligature), and the
edges: the empty string and 1,000-character strings. :func:`distinct_pairs`
draws two *different* ids that are likely to be confused: one a prefix of the
other, normalization twins, ``/`` vs ``%2F``.

Requires ``hypothesis`` (a test dependency; ``pip install hypothesis``)::

    from hypothesis import given
    from checkpointers.conformance.strategies import user_ids, distinct_pairs

    @given(distinct_pairs(user_ids()))
    def test_my_keys(pair): ...
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable

from hypothesis import strategies as st

from ..names import MAX_KEY_LENGTH, MAX_SCOPE_LENGTH, MAX_USER_LENGTH

__all__ = [
    "HOSTILE_ATOMS",
    "any_text",
    "backend_names",
    "distinct_pairs",
    "hostile_text",
    "item_keys",
    "namespaces",
    "scope_names",
    "thread_ids",
    "user_ids",
]

#: Fragments that break naive key schemes; strategies glue them together.
HOSTILE_ATOMS = [
    "/", ":", "|", "%", "\\", "*", "?", "[", "]", "{", "}", "^", "$", ".", "+",
    "%2F", "%2f", "%25", "%00", "..", "../", "\x00", " ", "_", "-", "~", "#",
    "alice", "alice2", "a", "\u00e9", "e\u0301", "\u00c5", "\u212b", "\ufb01", "fi",
    "\U0001f600",
]
_PLAIN = st.text(alphabet="aA0", min_size=1, max_size=2)
_LONG = ["x" * 1000, "x" * 999, "\u00e9" * 1000, "/" * 1000, "*" * 1000]


def hostile_text(*, min_size: int = 0, max_atoms: int = 6, nul: bool = True) -> st.SearchStrategy[str]:
    """Short strings glued from hostile atoms and plain characters."""
    atoms = HOSTILE_ATOMS if nul else [a for a in HOSTILE_ATOMS if "\x00" not in a]
    parts = st.lists(st.sampled_from(atoms) | _PLAIN, max_size=max_atoms)
    return parts.map("".join).filter(lambda s: len(s) >= min_size)


def any_text() -> st.SearchStrategy[str]:
    """Hostile text, arbitrary unicode (lone surrogates included) and long strings."""
    return st.one_of(hostile_text(), st.text(), st.sampled_from(_LONG))


def user_ids() -> st.SearchStrategy[str]:
    """User ids: hostile, empty (the anonymous user) or 1,000 characters."""
    return st.one_of(hostile_text(), hostile_text(), st.sampled_from(_LONG))


def valid_user(user: str) -> bool:
    """Whether ``user`` is within the user-id limit (twins of long ids can exceed it)."""
    return len(user) <= MAX_USER_LENGTH


def user_pairs() -> st.SearchStrategy[tuple[str, str]]:
    """Two different, often confusable user ids, both valid (the empty one included)."""
    return distinct_pairs(user_ids(), keep=valid_user)


def thread_ids() -> st.SearchStrategy[str]:
    """LangGraph thread ids / workflow names: hostile, never empty, sometimes long."""
    return st.one_of(hostile_text(min_size=1), st.sampled_from(_LONG))


def namespaces() -> st.SearchStrategy[str]:
    """``checkpoint_ns`` values: root, subgraph paths with ``:`` and ``|``, hostile."""
    child = st.tuples(hostile_text(min_size=1, max_atoms=3), st.sampled_from(["1", "a*b", "%2F"]))
    path = st.lists(child, min_size=1, max_size=3).map(lambda cs: "|".join(f"{n}:{i}" for n, i in cs))
    return st.one_of(st.just(""), path, hostile_text(min_size=1))


def scope_names() -> st.SearchStrategy[str]:
    """Valid scope names (1-128 characters) using every allowed punctuation mark."""
    segment = st.text(alphabet="aZ09_.:@=+,-", min_size=1, max_size=12).filter(
        lambda s: s not in (".", "..")
    )
    return st.lists(segment, min_size=1, max_size=4).map("/".join).filter(
        lambda s: len(s) <= MAX_SCOPE_LENGTH
    )


def item_keys() -> st.SearchStrategy[str]:
    """Valid item keys: hostile but free of control characters, up to 256 characters."""
    ok = hostile_text(min_size=1, nul=False).filter(
        lambda s: not any(ord(c) < 32 or ord(c) == 127 for c in s)
    )
    return st.one_of(ok, st.just("k" * MAX_KEY_LENGTH))


def backend_names() -> st.SearchStrategy[str]:
    """Record names as a backend receives them: ``[A-Za-z0-9_%/-]``, often prefixes."""
    return st.text(alphabet="aZ0_%/-", min_size=1, max_size=10)


#: Ways to turn an id into a different one that a naive scheme confuses with it.
_TWINS: list[Callable[[str], str]] = [
    lambda a: a + "2", lambda a: a + "/", lambda a: a + "/x", lambda a: a + "*",
    lambda a: a + "\x00", lambda a: "_" + a, lambda a: a[:-1] + "*", lambda a: "?" + a[1:],
    lambda a: a[:1] + "[" + a[1:2] + "]" + a[2:], lambda a: a[:-1], lambda a: a[1:],
    lambda a: a.replace("/", "%2F"), lambda a: a.replace("%2F", "/"), lambda a: a.upper(),
    lambda a: unicodedata.normalize("NFD", a), lambda a: unicodedata.normalize("NFC", a),
    lambda a: unicodedata.normalize("NFKC", a),
]


def distinct_pairs(
    strategy: st.SearchStrategy[str], keep: Callable[[str], bool] = bool
) -> st.SearchStrategy[tuple[str, str]]:
    """Two different values, often confusable (prefixes, twins, ``/`` vs ``%2F``).

    ``keep`` filters the confusable twin (default: non-empty); pass
    ``lambda s: True`` to allow the empty string.
    """

    @st.composite
    def pairs(draw: st.DrawFn) -> tuple[str, str]:
        a = draw(strategy.filter(keep))
        if draw(st.integers(0, 2)):  # mostly a confusable twin of a
            b = draw(st.sampled_from(_TWINS))(a)
            if b != a and keep(b):
                return (a, b) if draw(st.booleans()) else (b, a)
        b = draw(strategy.filter(lambda b: b != a and keep(b)))
        return (a, b) if draw(st.booleans()) else (b, a)

    return pairs()
