"""The saver's default serializer: LangGraph's msgpack format, decoding an allowlist only.

``JsonPlusSerializer`` rebuilds objects named in the bytes it reads: a msgpack
extension holding ``["os", "system", "touch /tmp/x"]`` makes it import ``os``
and call ``os.system`` (langgraph-checkpoint 4.3 still does by default, with
a warning; GHSA-g48c-2wqr-h844 is this class of bug). A checkpoint store is
written by more than one party (other services, backups, anyone with write
access to the bucket or the database), so stored bytes must never name code
to run.

:class:`SafeSerializer` writes exactly what ``JsonPlusSerializer`` writes and
reads it back, but decoding rebuilds only

* LangGraph's own safe types (``SAFE_MSGPACK_TYPES``: messages, ``Send``,
  ``Interrupt``, datetimes, UUIDs, ...);
* the ``(module, name)`` pairs given in ``allowed_msgpack_modules``;
* unless ``strict=True``, **data classes of modules the process has already
  imported**: pydantic models, dataclasses, enums and named tuples, looked up
  in ``sys.modules`` without importing anything (no module ``__getattr__``
  either). This is what lets a graph whose state holds the application's own
  models resume in a fresh process: LangGraph passes the state schema's types
  to the saver only under ``LANGGRAPH_STRICT_MSGPACK``. Functions, modules and
  other classes (``os.system``, ``subprocess.Popen``, ``builtins.eval``) are
  never data classes; a data class's constructor still runs (its validators or
  ``__post_init__``), so pass ``strict=True`` when stored bytes may come from
  someone who should not run those either.

A pydantic model its (imported) module does not hold by name, such as one
defined inside a function, comes back as its fields, as LangGraph returns a
class it cannot find; a pydantic state schema validates them again.

Any other type is **never imported or called**: the load fails with
:class:`~checkpointers.errors.DisallowedTypeError` (a ``CorruptItemError``)
naming the type and the argument that allows it.

Why an error and not LangGraph's strict-mode convention of returning the raw
constructor arguments: a checkpoint whose state silently turns from
``MyState(...)`` into a dict resumes a graph with the wrong types, far from
the cause; the error names the type at the load that met it. Only
``null``/``bytes``/``bytearray``/``msgpack`` frames are read: never pickle,
never the legacy ``json`` frames (this library never wrote them).

>>> import ormsgpack
>>> from langgraph.checkpoint.serde.jsonplus import EXT_CONSTRUCTOR_SINGLE_ARG
>>> evil = ormsgpack.packb(ormsgpack.Ext(EXT_CONSTRUCTOR_SINGLE_ARG, ormsgpack.packb(["os", "system", "true"])))
>>> SafeSerializer().loads_typed(("msgpack", evil))  # doctest: +NORMALIZE_WHITESPACE
Traceback (most recent call last):
...
checkpointers.errors.DisallowedTypeError: stored item '<value>' names type os.system, which is not in the decoding
allowlist; it was not imported. If it is a type of yours, pass allowed_msgpack_modules=[('os', 'system')] to the
checkpointer
"""

from __future__ import annotations

import dataclasses
import enum
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any

import ormsgpack
from langgraph.checkpoint.serde import _msgpack as _lg_msgpack
from langgraph.checkpoint.serde import jsonplus as _jsonplus
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from .errors import CorruptItemError, DisallowedTypeError, InvalidArgumentError

__all__ = ["AllowedTypes", "SafeSerializer"]

#: ``(module, name)`` pairs, or classes, that decoding may rebuild besides LangGraph's safe types.
AllowedTypes = Iterable[tuple[str, str] | type]

_TYPE_EXTS = frozenset(
    getattr(_jsonplus, n)
    for n in (
        "EXT_CONSTRUCTOR_SINGLE_ARG",
        "EXT_CONSTRUCTOR_POS_ARGS",
        "EXT_CONSTRUCTOR_KW_ARGS",
        "EXT_PYDANTIC_V1",
        "EXT_PYDANTIC_V2",
    )
    if hasattr(_jsonplus, n)
)
_METHOD_EXT = getattr(_jsonplus, "EXT_METHOD_SINGLE_ARG", None)
#: Extensions that hold plain msgpack data (checked with our hook, then rebuilt by LangGraph's).
_DATA_EXTS = frozenset(
    getattr(_jsonplus, n) for n in ("EXT_DELTA_SNAPSHOT", "EXT_NUMPY_ARRAY") if hasattr(_jsonplus, n)
)
_READ_FRAMES = ("null", "bytes", "bytearray", "msgpack")
#: The ``option`` of every decoding: LangGraph's (maps with non-string keys).
UNPACK_OPTION = ormsgpack.OPT_NON_STR_KEYS
_PYDANTIC_EXTS = frozenset(
    getattr(_jsonplus, n) for n in ("EXT_PYDANTIC_V1", "EXT_PYDANTIC_V2") if hasattr(_jsonplus, n)
)


def _normalize(allowed: AllowedTypes | None) -> frozenset[tuple[str, str]]:
    out: set[tuple[str, str]] = set()
    for entry in allowed or ():
        if isinstance(entry, type):
            out.add((entry.__module__, entry.__qualname__))
        elif (
            isinstance(entry, (tuple, list))
            and len(entry) == 2
            and all(isinstance(part, str) and part for part in entry)
        ):
            out.add((entry[0], entry[1]))
        else:
            raise InvalidArgumentError(
                "allowed_msgpack_modules",
                f"each entry must be a class or a (module, name) pair of strings, got {entry!r}",
            )
    return frozenset(out)


def _lookup(module: str, qualname: str) -> object | None:
    """The object ``module:qualname`` names if the module is already imported; never imports."""
    obj: object | None = sys.modules.get(module)
    for part in qualname.split("."):
        if obj is None:
            return None
        try:
            obj = vars(obj).get(part)  # no __getattr__: a lazy module attribute could import
        except TypeError:
            return None
    return obj


def _is_data_class(module: str, qualname: str) -> bool:
    """A pydantic model, dataclass, enum or named tuple of an already-imported module."""
    cls = _lookup(module, qualname)
    if not isinstance(cls, type):
        return False
    if dataclasses.is_dataclass(cls) or issubclass(cls, enum.Enum):
        return True
    if issubclass(cls, tuple) and isinstance(getattr(cls, "_fields", None), tuple):
        return True
    for base in ("pydantic.main", "pydantic.v1.main", "pydantic.v1"):
        model = vars(sys.modules[base]).get("BaseModel") if base in sys.modules else None
        if isinstance(model, type) and issubclass(cls, model):
            return True
    return False


def _rebuilder(allowed: set[tuple[str, ...]]) -> Callable[[int, bytes], Any]:
    """LangGraph's strict ext hook over ``allowed`` (a set we may add to later)."""
    make = getattr(_jsonplus, "_create_msgpack_ext_hook", None)
    if make is not None:
        return make(allowed)  # type: ignore[no-any-return]
    serde = JsonPlusSerializer(pickle_fallback=False, allowed_msgpack_modules=tuple(allowed) or None)
    return serde._unpack_ext_hook


class SafeSerializer(JsonPlusSerializer):
    """``JsonPlusSerializer`` (no pickle) whose decoding never imports a type outside an allowlist.

    Args:
        allowed_msgpack_modules: extra types decoding may rebuild, as classes
            or ``(module, name)`` pairs (``("my_app.models", "MyState")``).
        strict: rebuild only LangGraph's safe types and ``allowed_msgpack_modules``,
            not the data classes of already-imported modules.
    """

    def __init__(self, allowed_msgpack_modules: AllowedTypes | None = None, *, strict: bool = False) -> None:
        allowed = _normalize(allowed_msgpack_modules)
        self.allowed_types = allowed
        self.strict = strict
        # LangGraph's own strict hook does the rebuilding once a type passed our
        # check; data classes found later are added to its (our) set.
        self._rebuild_allowed: set[tuple[str, ...]] = {("checkpointers._serde", "<none>"), *allowed}
        rebuild = _rebuilder(self._rebuild_allowed)
        self._blocked = threading.local()
        super().__init__(pickle_fallback=False, __unpack_ext_hook__=self._hook_for(allowed, rebuild))

    def _hook_for(
        self, allowed: frozenset[tuple[str, str]], rebuild: Callable[[int, bytes], Any]
    ) -> Callable[[int, bytes], Any]:
        safe_types = _lg_msgpack.SAFE_MSGPACK_TYPES
        safe_methods = _lg_msgpack.SAFE_MSGPACK_METHODS
        blocked = self._blocked
        rebuild_allowed = self._rebuild_allowed
        strict = self.strict

        def hook(code: int, data: bytes) -> Any:
            if code in _TYPE_EXTS or code == _METHOD_EXT:
                # Read the type name (and check nested values) before anything is imported.
                tup = ormsgpack.unpackb(data, ext_hook=hook, option=ormsgpack.OPT_NON_STR_KEYS)
                module, name = str(tup[0]), str(tup[1])
                if code == _METHOD_EXT:
                    ok = (module, name, str(tup[3])) in safe_methods
                else:
                    ok = (module, name) in safe_types or (module, name) in rebuild_allowed
                    if not ok and not strict and _is_data_class(module, name):
                        rebuild_allowed.add((module, name))
                        ok = True
                if not ok and code in _PYDANTIC_EXTS and module in sys.modules and _lookup(module, name) is None:
                    # A model its module does not hold by that name (one defined inside a
                    # function): return its fields, as LangGraph does for a class it cannot
                    # find (nothing is imported or called; a pydantic state validates them).
                    return tup[2]
                if not ok:
                    blocked.type = (module, name)
                    raise ValueError("type not in the allowlist")
            elif code in _DATA_EXTS:
                # Nested values are rebuilt by LangGraph's hook, which would turn a
                # blocked type into its raw arguments: check them with ours first.
                ormsgpack.unpackb(data, ext_hook=hook, option=ormsgpack.OPT_NON_STR_KEYS)
            else:
                blocked.unknown = code
                raise ValueError("unknown msgpack extension")
            return rebuild(code, data)

        return hook

    def with_msgpack_allowlist(self, extra_allowlist: Iterable[tuple[str, ...] | type]) -> SafeSerializer:
        """A copy that also allows ``extra_allowlist`` (LangGraph calls this for graph state types)."""
        extra = [e for e in extra_allowlist if isinstance(e, type) or len(e) == 2]
        merged = self.allowed_types | _normalize(extra)
        return self if merged == self.allowed_types else SafeSerializer(merged, strict=self.strict)

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        """Decode one frame; a type outside the allowlist raises :class:`DisallowedTypeError`."""
        kind = data[0]
        if kind not in _READ_FRAMES:
            raise CorruptItemError("<value>", f"serialization type {kind!r} is never decoded by this saver")
        if kind == "msgpack":
            return self.loads_msgpack(data[1])
        blocked = self._blocked
        blocked.type = blocked.unknown = None
        try:
            return super().loads_typed(data)
        except Exception:
            self._raise_blocked()
            raise

    def loads_msgpack(self, data: bytes) -> Any:
        """``loads_typed(("msgpack", data))`` without its dispatch (nearly every stored value)."""
        blocked = self._blocked
        blocked.type = blocked.unknown = None
        try:  # what JsonPlusSerializer.loads_typed does for a msgpack frame
            return ormsgpack.unpackb(data, ext_hook=self._unpack_ext_hook, option=UNPACK_OPTION)
        except Exception:
            self._raise_blocked()
            raise

    def msgpack_hook(self) -> Callable[[int, bytes], Any]:
        """The extension hook of :meth:`loads_msgpack`, for a caller that decodes and retries failures itself.

        ``ormsgpack.unpackb(data, ext_hook=serde.msgpack_hook(), option=UNPACK_OPTION)``
        decodes exactly as :meth:`loads_msgpack` does on success, in one C
        call (no frame of ours, no keyword dict of a ``functools.partial``).
        It neither resets nor reads the record of what the hook blocked, so a
        failure raises an undescriptive error: call :meth:`loads_msgpack` on
        the same bytes then (it resets first, and raises the error that
        names the blocked type).
        """
        return self._unpack_ext_hook

    def _raise_blocked(self) -> None:
        """In a failed decode: raise the error naming the blocked type or unknown extension, if the hook met one."""
        blocked = self._blocked
        found, unknown = blocked.type, blocked.unknown
        blocked.type = blocked.unknown = None
        if found is not None:
            raise DisallowedTypeError("<value>", *found) from None
        if unknown is not None:
            raise CorruptItemError("<value>", f"msgpack extension type {unknown} is unknown") from None
