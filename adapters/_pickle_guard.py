"""Restricted decoding of the Agent Framework's pickled checkpoint leaves.

Stored bytes never import a module and never call anything outside the
allowlist: :func:`restricted_decode` runs each pickled leaf on symbols first
(see the comment below), then hands the JSON to the framework's own
``decode_checkpoint_value``. Used by :mod:`adapters.agent_framework` at load
and at save.
"""

from __future__ import annotations

import _compat_pickle
import base64
import binascii
import collections
import datetime
import decimal
import enum
import io
import pickletools
import sys
import types
import uuid
import weakref
from collections.abc import Iterator
from typing import Any, NoReturn

# The framework's own checkpoint types (WorkflowMessage, its events, Message / Content) are
# imported here, by code, so that a process that has not built a workflow yet can load a
# checkpoint holding them: loading never imports a module named in stored data.
import agent_framework._workflows._runner_context  # noqa: F401
from agent_framework._workflows import _checkpoint_encoding as _encoding
from agent_framework._workflows._checkpoint_encoding import (
    _BLOCKED_FRAMEWORK_GLOBAL_KEYS,
    _BUILTIN_ALLOWED_TYPE_KEYS,
    _GETATTR_GLOBAL_KEYS,
    _OPENAI_MODULE_PREFIX,
    _PICKLE_MARKER,
    _REGISTERED_CHECKPOINT_TYPE_KEYS,
    _TYPE_MARKER,
    decode_checkpoint_value,
)

#: The framework's own module prefixes (a tuple from 1.20; one string before).
_FRAMEWORK_MODULE_PREFIXES: tuple[str, ...] = tuple(
    # _FRAMEWORK_MODULE_PREFIX exists only before 1.20: the installed (newer) framework does not define it
    getattr(_encoding, "_FRAMEWORK_MODULE_PREFIXES", None) or (_encoding._FRAMEWORK_MODULE_PREFIX,)  # type: ignore[attr-defined]
)



__all__ = ["restricted_decode"]

# -- restricted decoding: stored bytes never import a module, never call outside the allowlist ---
#
# ``decode_checkpoint_value(..., allowed_types=...)`` unpickles each ``{"__pickled__": <base64>,
# "__type__": <key>}`` leaf with the framework's ``_RestrictedUnpickler``, and its ``find_class``
# imports the named module before it checks the result: any module under ``agent_framework.``,
# ``agent_framework_orchestrations.`` or ``openai.types.``, from anywhere on ``sys.path``, and the
# module of any allowed type; a module ``__getattr__`` (the framework's lazy namespaces) then
# imports further packages. REDUCE may call any allowed class with any arguments (running its
# ``__init__``), BUILD on a class object sets class attributes process-wide, a ``__setstate__``
# sets any attribute (``__class__`` included), and a few bytes can make decoding allocate
# gigabytes, hash for hours or overflow the C stack.
#
# So before that call every pickled leaf is run here on symbols (nothing is imported, built or
# called): each global must be an allowed class of a module that is already imported, read from
# the module's ``__dict__``; each call, BUILD and container update must be one the pickler writes
# for such a class; what decoding would allocate, hash, walk and nest is bounded. Anything else
# raises :class:`_UnsafeCheckpointData` before the framework sees the bytes.

# The bounds below hold per checkpoint (all its pickled leaves together).
#: Set members / dict keys whose hash cannot be known here (frozen dataclasses, NamedTuples, ...),
#: so that equal hashes cannot make decoding quadratic in Python-level ``__eq__`` calls (256 such
#: keys with one hash cost some 30 ms to insert).
_MAX_OPAQUE_KEYS = 256
#: Distinct keys with one hash value (unequal ints share a hash only from 2**61 up).
_MAX_EQUAL_HASHES = 64
#: Objects decoding may visit hashing keys or walking arguments: this many per pickle byte (data
#: that shares nothing needs about one), at least the floor.
_WORK_PER_BYTE = 4
_WORK_FLOOR = 20_000
#: Deeper than the pickler could have written (hashing a tuple nested ~10**5 deep overflows the C stack).
_MAX_NESTING = max(2 * sys.getrecursionlimit(), 2000)
_SATURATE = 1 << 62
_HEAPTYPE = 1 << 9

#: Dunder keys a BUILD state may carry, by the ``__setstate__`` that reads them.
_PYDANTIC_STATE_KEYS = frozenset({"__dict__", "__pydantic_extra__", "__pydantic_fields_set__", "__pydantic_private__"})
_EXCEPTION_STATE_KEYS = frozenset({"__notes__"})
_NO_KEYS: frozenset[str] = frozenset()
#: ``__hash__`` implementations randomized per process: no collisions can be precomputed.
_RANDOM_HASHES = tuple(
    klass.__dict__["__hash__"]
    for klass in (str, bytes, datetime.date, datetime.datetime, datetime.time, datetime.timedelta, datetime.timezone)
)
#: Exact value types rebuilt here from literal arguments, to know their hash.
_EVALUATED_TYPES = frozenset({int, float, complex, bool, range, decimal.Decimal})
#: A slot: setting it runs no code.
_SLOT = type(uuid.UUID.__dict__["int"])
_TYPE_MRO = type.__dict__["__mro__"].__get__
_TYPE_DICT = type.__dict__["__dict__"].__get__


class _UnsafeCheckpointData(Exception):
    """A pickled leaf does what decoding must not do; the message says what, and how to allow a type."""


def _refuse(what: str) -> NoReturn:
    raise _UnsafeCheckpointData(what)


class _Identity:
    """Stand-in for an object hashed by identity: equal to nothing else."""

    __slots__ = ()


_OPAQUE = object()  # hashable, but its hash cannot be known here
_UNHASHABLE = object()


class _Sym:
    """What one slot of the pickle machine would hold, without building it.

    ``kind``: lit (``value``: the literal), class (``value``: the resolved class), special
    (``value``: "getattr" or "reconstructor"), tuple/list/dict/set/frozenset (``items``: item
    symbols, a dict's as key, value, key, ...), bytearray, inst (an object of class ``cls``;
    ``items``: its arguments and state), other. ``stand`` hashes and compares as the real value
    would (or is _OPAQUE / _UNHASHABLE), ``work`` bounds the objects hashing it visits, ``depth``
    is its nesting.
    """

    __slots__ = ("built", "cls", "depth", "items", "kind", "member", "sealed", "stand", "used", "value", "work")

    def __init__(self, kind: str, value: Any, items: list[_Sym] | None, stand: Any, work: int, depth: int) -> None:
        self.kind = kind
        self.value = value
        self.items = items
        self.cls: Any = None
        self.stand = stand
        self.work = work
        self.depth = depth
        self.used = self.sealed = self.built = self.member = False


def _lit(value: Any) -> _Sym:
    work = 1 + (value.bit_length() >> 6) if type(value) is int else 1
    return _Sym("lit", value, None, value, work, 0)


_NONE, _TRUE, _FALSE = _lit(None), _lit(True), _lit(False)


def _key_of(cls: Any) -> str:
    return f"{getattr(cls, '__module__', '?')}:{getattr(cls, '__qualname__', '?')}"


def _how_to_allow(key: str) -> str:
    return (
        f"To allow a type of your own, add {key!r} to allowed_checkpoint_types (or register it with "
        f"agent_framework.register_checkpoint_type) and import its module before loading: stored "
        f"data never makes this storage import a module."
    )


def _static_attr(owner: Any, name: str) -> Any:
    """``owner.name`` from ``__dict__``s only (a class: along its MRO), running no code; KeyError if absent."""
    if isinstance(owner, type):
        for klass in _TYPE_MRO(owner):
            namespace = _TYPE_DICT(klass)
            if name in namespace:
                return namespace[name]
        raise KeyError(name)
    return object.__getattribute__(owner, "__dict__")[name]


def _defined(cls: type, name: str) -> Any:
    try:
        return _static_attr(cls, name)
    except KeyError:
        return None


def _is_data_descriptor(value: Any) -> bool:
    """Whether setting an attribute that ``value`` holds runs code (a property, ...), read statically."""
    return _defined(type(value), "__set__") is not None or _defined(type(value), "__delete__") is not None


def _overrides(cls: type, name: str) -> bool:
    """Whether a class of ``cls``'s MRO other than ``object`` defines ``name``."""
    for klass in _TYPE_MRO(cls):
        if name in _TYPE_DICT(klass):
            return klass is not object
    return False


def _prefix_allowed(module: str) -> bool:
    return module.startswith((*_FRAMEWORK_MODULE_PREFIXES, _OPENAI_MODULE_PREFIX))


def _is_allowed_class(cls: type, allowed: frozenset[str]) -> bool:
    """The framework's ``_is_allowed_type`` (a class reached by attribute traversal)."""
    key = _key_of(cls)
    return key in _BUILTIN_ALLOWED_TYPE_KEYS or key in allowed or _prefix_allowed(str(cls.__module__))


def _resolve_global(module: str, name: str, proto: int, allowed: frozenset[str]) -> _Sym:
    """What ``find_class(module, name)`` would push, found without importing or calling anything."""
    key = f"{module}:{name}"
    if key in _BLOCKED_FRAMEWORK_GLOBAL_KEYS:
        _refuse(f"the stored data names the framework's own decoder {key!r}")
    if key in _GETATTR_GLOBAL_KEYS:
        return _Sym("special", "getattr", None, _UNHASHABLE, 1, 0)
    if key == "copyreg:_reconstructor":
        return _Sym("special", "reconstructor", None, _UNHASHABLE, 1, 0)
    if not (key in _BUILTIN_ALLOWED_TYPE_KEYS or key in allowed or (_prefix_allowed(module) and "." not in name)):
        _refuse(f"the stored data names {key!r}, which is not an allowed type. " + _how_to_allow(key))
    if proto < 3 and ((module, name) in _compat_pickle.NAME_MAPPING or module in _compat_pickle.IMPORT_MAPPING):
        _refuse(f"the stored data names {key!r}, a Python 2 name that unpickling would map to another")
    loaded = sys.modules.get(module)
    if not isinstance(loaded, types.ModuleType):
        _refuse(
            f"the stored data names {key!r}, but module {module!r} is not imported, and loading a "
            f"checkpoint never imports a module. " + _how_to_allow(key)
        )
    if type(loaded).__getattribute__ is not types.ModuleType.__getattribute__:
        _refuse(f"the stored data names {key!r} in module {module!r}, whose attribute lookup runs code")
    parts = name.split(".")
    if (len(parts) > 1 and proto < 4) or "<locals>" in parts or "" in parts:
        _refuse(f"the stored data names {key!r}, which is not a class name")
    target: Any = loaded
    try:
        for part in parts:
            target = _static_attr(target, part)
            if not isinstance(target, type):
                break
    except KeyError:
        _refuse(
            f"the stored data names {key!r}, which module {module!r} does not define (a module "
            f"__getattr__ is never consulted: it may import)"
        )
    if not isinstance(target, type):
        _refuse(f"the stored data names {key!r}, which is not a class")
    return _Sym("class", target, None, target, 1, 0)


class _ClassInfo:
    """What the checks need to know about one class, read from its MRO's ``__dict__``s."""

    __slots__ = ("builtin", "descriptors", "enum", "hashing", "key", "lookup_runs_code", "reduce_call", "setstate")

    def __init__(self, cls: type, pydantic_setstate: Any) -> None:
        self.key = _key_of(cls)
        self.builtin = self.key in _BUILTIN_ALLOWED_TYPE_KEYS
        self.enum = issubclass(cls, enum.Enum)
        hash_impl = _defined(cls, "__hash__")
        if hash_impl is None:
            self.hashing = "unhashable"
        elif hash_impl is object.__hash__:
            self.hashing = "identity"
        elif self.enum:
            self.hashing = "enum"  # finitely many members
        elif any(hash_impl is random for random in _RANDOM_HASHES):
            self.hashing = "random"
        elif cls in _EVALUATED_TYPES:
            self.hashing = "evaluated"
        else:
            self.hashing = "opaque"
        setstate = _defined(cls, "__setstate__")
        self.setstate = "pydantic" if setstate is not None and setstate is pydantic_setstate else setstate is not None
        self.lookup_runs_code = _overrides(cls, "__getattribute__") or (
            setstate is None and _overrides(cls, "__getattr__")
        )
        # A class's own __reduce__ is what makes the pickler write a call of the class.
        self.reduce_call = self.builtin or _overrides(cls, "__reduce_ex__") or _overrides(cls, "__reduce__")
        seen: set[str] = set()
        descriptors = set()
        for klass in _TYPE_MRO(cls):
            for name, value in _TYPE_DICT(klass).items():
                if name not in seen:
                    seen.add(name)
                    if _is_data_descriptor(value) and not isinstance(value, _SLOT):
                        descriptors.add(name)
        self.descriptors = frozenset(descriptors)


#: Read once per class (classes are not expected to gain properties or hooks while the process runs).
_CLASS_INFO: weakref.WeakKeyDictionary[type, _ClassInfo] = weakref.WeakKeyDictionary()


class _Limits:
    """What the pickles of one checkpoint may make decoding do, together; and the globals they resolved."""

    __slots__ = ("budget", "globals", "hashes", "opaque_keys", "work")

    def __init__(self, pickle_bytes: int) -> None:
        self.work = 0
        self.budget = max(_WORK_FLOOR, _WORK_PER_BYTE * pickle_bytes)
        self.opaque_keys = 0
        self.hashes: dict[int, list[Any]] = {}
        self.globals: dict[tuple[str, str, int], _Sym] = {}


class _PickleCheck:
    """Runs one pickle on symbols (the semantics of ``pickle._Unpickler``), refusing what decoding must not do."""

    def __init__(self, data: bytes, allowed: frozenset[str], limits: _Limits) -> None:
        self.data = data
        self.allowed = allowed
        self.limits = limits
        self.proto = 0
        self.stack: list[_Sym] = []
        self.metastack: list[list[_Sym]] = []
        self.memo: dict[int, _Sym] = {}

    def run(self) -> None:
        handlers = _HANDLERS
        memo = self.memo
        try:
            for code, arg, pos in _opcodes(self.data):
                # The three opcodes that make up most of a pickled object, inline (op_memoize, op_literal, op_none).
                if code == _MEMOIZE:
                    if not self.stack:
                        _refuse("the pickle memoizes an empty stack")
                    memo[len(memo)] = self.stack[-1]
                    continue
                if code == _SHORT_BINUNICODE:
                    self.stack.append(_Sym("lit", arg, None, arg, 1, 0))
                    continue
                if code == _NONE_CODE:
                    self.stack.append(_NONE)
                    continue
                handler = handlers.get(code)
                if handler is None:
                    _refuse(f"the pickle uses opcode {_CODE2OP[code].name}, which checkpoint decoding refuses")
                if handler(self, arg, pos):
                    return
        except _UnsafeCheckpointData:
            raise
        except Exception as exc:  # noqa: BLE001 - pickletools found it malformed, or a check met a shape it cannot read
            _refuse(f"the pickle is malformed ({type(exc).__name__}: {exc})")
        _refuse("the pickle ends without STOP")

    @staticmethod
    def info(klass: type) -> _ClassInfo:
        try:
            return _CLASS_INFO[klass]
        except (KeyError, TypeError):
            pass
        pydantic = sys.modules.get("pydantic.main")
        model = getattr(pydantic, "BaseModel", None) if pydantic is not None else None
        found = _ClassInfo(klass, _defined(model, "__setstate__") if isinstance(model, type) else None)
        try:
            _CLASS_INFO[klass] = found
        except TypeError:  # not weak-referenceable
            pass
        return found

    # -- the stack --

    def pop(self) -> _Sym:
        if not self.stack:
            _refuse("the pickle pops from an empty stack")
        return self.stack.pop()

    def top(self) -> _Sym:
        if not self.stack:
            _refuse("the pickle reads an empty stack")
        return self.stack[-1]

    def pop_mark(self) -> list[_Sym]:
        if not self.metastack:
            _refuse("the pickle pops a mark it never pushed")
        items = self.stack
        self.stack = self.metastack.pop()
        return items

    def push(self, sym: _Sym) -> None:
        if sym.depth > _MAX_NESTING:
            _refuse(f"the pickle nests deeper than {_MAX_NESTING} levels")
        self.stack.append(sym)

    @staticmethod
    def as_value(sym: _Sym) -> _Sym:
        """``sym`` used as a value (item, argument, state): never a special callable."""
        if sym.kind == "special":
            _refuse("the pickle uses getattr or copyreg._reconstructor as a value, not as a call")
        sym.used = True
        return sym

    # -- hashing and walking --

    def charge(self, work: int) -> None:
        limits = self.limits
        limits.work += work
        if limits.work > limits.budget:
            _refuse("the pickle would make decoding hash or walk far more objects than its size (shared or deep data)")

    def hashed(self, sym: _Sym) -> None:
        """``sym`` becomes a set member or dict key: charge its hashing, bound equal hashes."""
        if sym.kind == "lit" and type(sym.value) in (str, bytes):
            self.limits.work += 1  # randomized hash, computed once per object
            return
        self.as_value(sym)
        self.charge(sym.work)
        stand = sym.stand
        if stand is _UNHASHABLE:
            return  # unpickling raises TypeError
        if stand is _OPAQUE:
            self.limits.opaque_keys += 1
            if self.limits.opaque_keys > _MAX_OPAQUE_KEYS:
                _refuse(
                    f"the checkpoint has more than {_MAX_OPAQUE_KEYS} set members or dict keys whose "
                    f"hash cannot be checked here (instances of {_key_of(sym.cls)}, ...)"
                )
            return
        try:
            bucket = self.limits.hashes.setdefault(hash(stand), [])
            for other in bucket:
                self.charge(sym.work)
                if other is stand or other == stand:
                    return
        except _UnsafeCheckpointData:
            raise
        except Exception as exc:  # noqa: BLE001 - unpickling would fail the same way
            _refuse(f"the pickle holds a key that cannot be hashed or compared ({type(exc).__name__})")
        bucket.append(stand)
        if len(bucket) > _MAX_EQUAL_HASHES:
            _refuse(f"the pickle holds more than {_MAX_EQUAL_HASHES} distinct keys with one hash value")

    def expansion(self, key: str, args: list[_Sym]) -> None:
        """Arguments handed to a class's own code: bound what walking them (a repr, a log line) visits."""
        remaining = self.limits.budget - self.limits.work
        visited = 0
        pending = list(args)
        while pending:
            sym = pending.pop()
            visited += 1
            if visited > remaining:
                _refuse(
                    f"the pickle passes {key} arguments that expand to more objects than its size "
                    f"allows (shared or cyclic structures)"
                )
            if sym.items:
                pending.extend(sym.items)
        self.charge(visited)

    def keys_of(self, sym: _Sym, *, pairs: bool) -> None:
        """A set or dict is built from ``sym``: its items (``pairs``: their first items) are hashed."""
        if sym.kind == "lit" and type(sym.value) in (str, bytes):
            return
        if sym.kind == "dict":
            for key in (sym.items or [])[0::2]:
                self.hashed(key)
            return
        if sym.kind not in ("list", "tuple", "set", "frozenset"):
            _refuse(f"the pickle builds a set or dict from a {sym.kind} whose items cannot be checked")
        for item in sym.items or []:
            if not pairs:
                self.hashed(item)
            elif item.kind in ("tuple", "list") and item.items is not None and len(item.items) == 2:
                self.hashed(item.items[0])
            else:
                _refuse("the pickle builds a dict from items that are not pairs")

    # -- calls: only what the pickler writes for allowed classes --

    def arguments(self, cls: type, args: list[_Sym], what: str) -> None:
        for arg in args:
            self.as_value(arg)
            if arg.kind == "inst" and arg.cls is range:
                _refuse(f"the pickle passes a range to {what} of {_key_of(cls)} (it could expand to any size)")
        if issubclass(cls, (bytes, bytearray)) and args:
            first = args[0]
            if first.kind != "bytearray" and not (first.kind == "lit" and type(first.value) in (str, bytes)):
                _refuse(f"the pickle builds {_key_of(cls)} from a {first.kind} (a size allocates that much)")
        if (issubclass(cls, str) or cls is uuid.UUID) and any(a.kind != "lit" for a in args):
            # str() walks its argument's repr (any size for shared data); UUID() calls its methods.
            _refuse(f"the pickle builds {_key_of(cls)} from a non-literal argument")
        if issubclass(cls, type) and (cls is not type or what != "a call" or len(args) != 1):
            _refuse("the pickle creates a class (type() with other than one argument, or a metaclass)")
        if issubclass(cls, enum.Enum) and len(args) > 1:
            _refuse(f"the pickle calls the enum {_key_of(cls)} with {len(args)} arguments (that creates an enum)")
        if issubclass(cls, (set, frozenset, collections.Counter)) and args:
            self.keys_of(args[0], pairs=False)
        elif issubclass(cls, collections.defaultdict):
            factory = args[0] if args else _NONE
            if factory is not _NONE and not (
                factory.kind == "class"
                and (self.info(factory.value).builtin or self.info(factory.value).key in self.allowed)
            ):
                _refuse(
                    "the pickle gives a defaultdict a default factory (called later)"
                    " that is not a built-in or allowed type"
                )
            if len(args) > 1:
                self.keys_of(args[1], pairs=args[1].kind != "dict")
        elif issubclass(cls, dict) and args:
            self.keys_of(args[0], pairs=args[0].kind != "dict")

    def instance(self, cls: type, args: list[_Sym], *, evaluate: bool) -> _Sym:
        """The symbol of ``cls(*args)`` or ``cls.__new__(cls, *args)``."""
        sym = _Sym("inst", None, list(args), _OPAQUE, 1, 1 + max((a.depth for a in args), default=0))
        sym.cls = cls
        hashing = self.info(cls).hashing
        if hashing == "unhashable":
            sym.stand = _UNHASHABLE
        elif hashing == "identity":
            sym.stand = _Identity()
        elif hashing in ("enum", "random"):
            sym.stand = (hashing, cls)  # equal hashes only for equal values, or finitely many
        elif hashing == "evaluated" and evaluate and all(a.kind == "lit" for a in args):
            try:
                sym.stand = cls(*(a.value for a in args))
            except Exception as exc:  # noqa: BLE001 - unpickling would fail the same way
                _refuse(f"the pickle builds {_key_of(cls)} from invalid arguments ({type(exc).__name__}: {exc})")
        else:
            sym.work = min(_SATURATE, 1 + sum(a.work for a in args))
        return sym

    def call(self, func: _Sym, args_sym: _Sym) -> _Sym:
        """REDUCE: ``func(*args)``."""
        if args_sym.kind != "tuple":
            _refuse(f"the pickle calls with arguments that are a {args_sym.kind}, not a tuple")
        args = list(args_sym.items or [])
        if func.kind == "special":
            return self.traverse(args) if func.value == "getattr" else self.reconstruct(args)
        if func.kind != "class":
            _refuse(f"the pickle calls a {func.kind}, which is not an allowed class")
        cls = func.value
        info = self.info(cls)
        if not info.reduce_call:
            _refuse(
                f"the pickle calls {info.key}(...), a call the pickler never writes for that class (it "
                f"rebuilds it with __new__ and its state): stored data may not run its __init__"
            )
        self.arguments(cls, args, "a call")
        if not info.builtin and not info.enum:
            self.expansion(info.key, args)  # its own code (an __init__) receives them
        if cls is type:
            return _Sym("other", None, None, ("type()",), 1, 1)
        sym = self.instance(cls, args, evaluate=True)
        if info.enum:
            sym.member = True
            self.charge(sum(a.work for a in args))  # the value is looked up by hash
        return sym

    def traverse(self, args: list[_Sym]) -> _Sym:
        """``getattr(owner, name)``: only a nested allowed class or a member of an allowed enum."""
        if len(args) != 2 or args[0].kind != "class" or args[1].kind != "lit" or type(args[1].value) is not str:
            _refuse("the pickle calls getattr on other than an allowed class and a literal name")
        owner, name = args[0].value, args[1].value
        key = f"{_key_of(owner)}.{name}"
        if name.startswith("__") and name.endswith("__"):
            _refuse(f"the pickle reads the special attribute {key!r}")
        for meta in _TYPE_MRO(type(owner)):
            found = _TYPE_DICT(meta).get(name)
            if found is not None and _is_data_descriptor(found):
                _refuse(f"the pickle reads {key!r}, which the class's metaclass computes")
        if (
            isinstance(owner, enum.EnumMeta)
            and _is_allowed_class(owner, self.allowed)
            and name in _defined(owner, "_member_map_")
        ):
            member = _Sym("inst", None, None, ("enum", owner), 1, 1)
            member.cls, member.member = owner, True
            return member
        resolved = _defined(owner, name)
        if isinstance(resolved, type) and _is_allowed_class(resolved, self.allowed):
            return _Sym("class", resolved, None, resolved, 1, 0)
        _refuse(f"the pickle reads {key!r}, which is not an allowed nested class or enum member. " + _how_to_allow(key))

    def reconstruct(self, args: list[_Sym]) -> _Sym:
        """``copyreg._reconstructor(cls, base, state)``: ``base.__new__(cls, state)``, ``base.__init__``."""
        if len(args) != 3 or args[0].kind != "class" or args[1].kind != "class":
            _refuse("the pickle calls copyreg._reconstructor without two allowed classes")
        cls, base, state = args[0].value, args[1].value, args[2]
        if base not in _TYPE_MRO(cls) or (base is not object and base.__flags__ & _HEAPTYPE):
            _refuse(
                f"the pickle calls copyreg._reconstructor({_key_of(cls)}, {_key_of(base)}): the base "
                f"must be object or a built-in base of the class"
            )
        if issubclass(cls, type):
            _refuse("the pickle creates a class through copyreg._reconstructor")
        if _defined(cls, "__new__") is not _defined(base, "__new__"):
            _refuse(f"the pickle calls copyreg._reconstructor to bypass {_key_of(cls)}.__new__ (an enum's lookup, ...)")
        if base is object:
            if state is not _NONE:
                _refuse("the pickle calls copyreg._reconstructor with object and a state")
            return self.instance(cls, [], evaluate=False)
        self.arguments(base, [state], "copyreg._reconstructor")
        return self.instance(cls, [state], evaluate=False)

    def new_object(self, cls_sym: _Sym, args_sym: _Sym, kwargs_sym: _Sym | None) -> _Sym:
        """NEWOBJ / NEWOBJ_EX: ``cls.__new__(cls, *args, **kwargs)``."""
        if cls_sym.kind != "class":
            _refuse(f"the pickle creates an object of a {cls_sym.kind}, not of an allowed class")
        if args_sym.kind != "tuple":
            _refuse("the pickle creates an object with arguments that are not a tuple")
        cls = cls_sym.value
        args = list(args_sym.items or [])
        if kwargs_sym is not None:
            if kwargs_sym.kind != "dict":
                _refuse("the pickle creates an object with keyword arguments that are not a dict")
            items = kwargs_sym.items or []
            if any(k.kind != "lit" or type(k.value) is not str for k in items[0::2]):
                _refuse("the pickle creates an object with a keyword that is not a string")
            args += items[1::2]
        self.arguments(cls, args, "__new__")
        info = self.info(cls)
        if args and not info.builtin:
            self.expansion(info.key, args)
        return self.instance(cls, args, evaluate=kwargs_sym is None and cls in (int, float, complex))

    # -- BUILD and container updates --

    def state_keys(self, info: _ClassInfo, state: _Sym, dunder_ok: frozenset[str], attributes: bool) -> None:
        """A state dict's keys: literal strings, no dunder names beyond ``dunder_ok`` and, when they
        are set as attributes, no data descriptor (a property setter) other than a slot."""
        if state is _NONE:
            return
        if state.kind != "dict":
            _refuse(f"the pickle restores {info.key} from a {state.kind} where a dict is expected")
        state.sealed = True
        for key in (state.items or [])[0::2]:
            name = key.value
            if key.kind != "lit" or type(name) is not str:
                _refuse(f"the pickle restores {info.key} with an attribute name that is not a string")
            if name[:2] == "__" and name[-2:] == "__" and name not in dunder_ok:
                _refuse(f"the pickle sets the special attribute {name!r} of {info.key}")
            if attributes and name in info.descriptors:
                _refuse(f"the pickle sets {name!r} of {info.key}, which runs a descriptor (a property)")

    def build(self, inst: _Sym, state: _Sym) -> None:
        self.as_value(state)
        if inst.kind != "inst" or inst.member or inst.built:
            _refuse("the pickle restores the state of something that is not a new object of an allowed class")
        if inst.used and inst.stand is _OPAQUE:
            _refuse(f"the pickle restores a hashable {_key_of(inst.cls)} after using it")
        inst.built = True
        info = self.info(inst.cls)
        if state.kind == "inst" and state.cls is range:
            _refuse("the pickle restores an object from a range")
        if info.lookup_runs_code:
            _refuse(f"the pickle restores {info.key}, whose attribute lookup runs code")
        pair = state.kind == "tuple" and state.items is not None and len(state.items) == 2
        if info.setstate == "pydantic":
            self.state_keys(info, state, _PYDANTIC_STATE_KEYS, False)
            items = state.items or []
            # an odd trailing item (a malformed pickle) has no value: skipped, as before
            for key, value in zip(items[0::2], items[1::2], strict=False):
                if key.value in ("__dict__", "__pydantic_private__", "__pydantic_extra__") and value is not _NONE:
                    self.state_keys(info, value, _NO_KEYS, False)
        elif info.setstate:
            dunder_ok = _EXCEPTION_STATE_KEYS if issubclass(inst.cls, BaseException) else _NO_KEYS
            for part in state.items if pair else [state]:  # type: ignore[union-attr]
                if part.kind == "dict":
                    self.state_keys(info, part, dunder_ok, True)
        elif pair:
            assert state.items is not None
            self.state_keys(info, state.items[0], _NO_KEYS, False)
            self.state_keys(info, state.items[1], _NO_KEYS, True)
        else:
            self.state_keys(info, state, _NO_KEYS, False)
        inst.depth = max(inst.depth, 1 + state.depth)
        if inst.depth > _MAX_NESTING:
            _refuse(f"the pickle nests deeper than {_MAX_NESTING} levels")
        if inst.stand is _OPAQUE:
            inst.work = min(_SATURATE, inst.work + state.work)
        if inst.items is not None:
            inst.items.append(state)
        if inst.cls is uuid.UUID and state.kind == "dict":
            items = state.items or []
            for key, value in zip(items[0::2], items[1::2], strict=False):
                if key.value == "int" and value.kind == "lit" and type(value.value) is int:
                    inst.stand, inst.work = value.value, value.work  # hash(UUID) is hash(UUID.int)

    def update(self, base: type, items: list[_Sym]) -> _Sym:
        """APPEND(S) / SETITEM(S) / ADDITEMS: the target must be a ``base`` (for ``list``: or a deque)."""
        target = self.top()
        if target.kind != _UPDATED_KINDS[base] and not (
            target.kind == "inst"
            and not target.member
            and (issubclass(target.cls, base) or (base is list and issubclass(target.cls, collections.deque)))
        ):
            _refuse(f"the pickle updates a {target.kind} as if it were a {base.__name__}")
        if target.sealed or (target.used and target.stand is _OPAQUE):
            _refuse(f"the pickle updates a {base.__name__} after using it")
        work = target.work
        depth = target.depth
        for item in items:
            if item.kind == "special":
                self.as_value(item)
            item.used = True
            work += item.work
            if item.depth >= depth:
                depth = item.depth + 1
        if depth > _MAX_NESTING:
            _refuse(f"the pickle nests deeper than {_MAX_NESTING} levels")
        target.work, target.depth = min(_SATURATE, work), depth
        if target.items is not None:
            target.items.extend(items)
        return target

    def container(self, kind: str, items: list[_Sym]) -> _Sym:
        work, depth = 1, 0
        for item in items:
            if item.kind == "special":
                self.as_value(item)
            item.used = True
            work += item.work
            depth = max(depth, item.depth)
        sym = _Sym(kind, None, items, _UNHASHABLE, min(_SATURATE, work), depth + 1)
        if kind in ("tuple", "frozenset"):
            if kind == "frozenset":
                for item in items:
                    self.hashed(item)
                sym.work = 1 + len(items)  # hashed from its members' stored hashes
            stands = [i.stand for i in items]
            if any(s is _UNHASHABLE for s in stands):
                sym.stand = _UNHASHABLE
            elif any(s is _OPAQUE for s in stands):
                sym.stand = _OPAQUE
            else:
                sym.stand = tuple(stands) if kind == "tuple" else frozenset(stands)
        return sym

    # -- opcodes (each returns True at STOP) --

    def op_proto(self, arg: int, pos: int) -> None:
        self.proto = arg

    def op_frame(self, arg: int, pos: int) -> None:
        pass

    def op_stop(self, arg: None, pos: int) -> bool:
        self.as_value(self.pop())
        return True

    def op_literal(self, arg: Any, pos: int) -> None:
        self.stack.append(_lit(arg))

    def op_bytearray(self, arg: Any, pos: int) -> None:
        self.stack.append(_Sym("bytearray", None, None, _UNHASHABLE, 1, 0))

    def op_none(self, arg: None, pos: int) -> None:
        self.stack.append(_NONE)

    def op_true(self, arg: None, pos: int) -> None:
        self.stack.append(_TRUE)

    def op_false(self, arg: None, pos: int) -> None:
        self.stack.append(_FALSE)

    def op_empty_tuple(self, arg: None, pos: int) -> None:
        self.stack.append(self.container("tuple", []))

    def op_tuple1(self, arg: None, pos: int) -> None:
        self.push(self.container("tuple", [self.pop()]))

    def op_tuple2(self, arg: None, pos: int) -> None:
        second = self.pop()
        self.push(self.container("tuple", [self.pop(), second]))

    def op_tuple3(self, arg: None, pos: int) -> None:
        third, second = self.pop(), self.pop()
        self.push(self.container("tuple", [self.pop(), second, third]))

    def op_tuple(self, arg: None, pos: int) -> None:
        self.push(self.container("tuple", self.pop_mark()))

    def op_empty_list(self, arg: None, pos: int) -> None:
        self.stack.append(_Sym("list", None, [], _UNHASHABLE, 1, 1))

    def op_list(self, arg: None, pos: int) -> None:
        self.push(self.container("list", self.pop_mark()))

    def op_empty_dict(self, arg: None, pos: int) -> None:
        self.stack.append(_Sym("dict", None, [], _UNHASHABLE, 1, 1))

    def op_dict(self, arg: None, pos: int) -> None:
        items = self.pop_mark()
        if len(items) % 2:
            _refuse("the pickle builds a dict from an odd number of items")
        for key in items[0::2]:
            self.hashed(key)
        self.push(self.container("dict", items))

    def op_empty_set(self, arg: None, pos: int) -> None:
        self.stack.append(_Sym("set", None, [], _UNHASHABLE, 1, 1))

    def op_frozenset(self, arg: None, pos: int) -> None:
        self.push(self.container("frozenset", self.pop_mark()))

    def op_append(self, arg: None, pos: int) -> None:
        item = self.pop()
        self.update(list, [item])

    def op_appends(self, arg: None, pos: int) -> None:
        self.update(list, self.pop_mark())

    def op_setitem(self, arg: None, pos: int) -> None:
        value = self.pop()
        self.setitems([self.pop(), value])

    def op_setitems(self, arg: None, pos: int) -> None:
        self.setitems(self.pop_mark())

    def setitems(self, items: list[_Sym]) -> None:
        if len(items) % 2:
            _refuse("the pickle sets an odd number of dict items")
        self.update(dict, items)
        for key in items[0::2]:
            self.hashed(key)

    def op_additems(self, arg: None, pos: int) -> None:
        items = self.pop_mark()
        self.update(set, items)
        for item in items:
            self.hashed(item)

    def op_mark(self, arg: None, pos: int) -> None:
        self.metastack.append(self.stack)
        self.stack = []

    def op_pop(self, arg: None, pos: int) -> None:
        if self.stack:
            self.stack.pop()
        else:
            self.pop_mark()

    def op_pop_mark(self, arg: None, pos: int) -> None:
        self.pop_mark()

    def op_dup(self, arg: None, pos: int) -> None:
        self.stack.append(self.top())

    def op_get(self, arg: int, pos: int) -> None:
        try:
            self.stack.append(self.memo[arg])
        except KeyError:
            _refuse("the pickle reads a memo slot it never wrote")

    def op_put(self, arg: int, pos: int) -> None:
        # The pickler numbers memo slots 0, 1, 2, ...; the C unpickler allocates (and zeroes) a memo
        # array up to twice the slot written, so a 9-byte pickle naming slot 2**27 costs 2 GiB.
        if not 0 <= arg <= len(self.memo):
            _refuse(f"the pickle writes memo slot {arg}, out of sequence (that would allocate as many slots)")
        self.memo[arg] = self.top()

    def op_memoize(self, arg: None, pos: int) -> None:
        if not self.stack:
            _refuse("the pickle memoizes an empty stack")
        self.memo[len(self.memo)] = self.stack[-1]

    def op_global(self, arg: str, pos: int) -> None:
        # The two lines as the C unpickler reads them (UTF-8, no escapes), not as pickletools shows them.
        lines = self.data[pos + 1 :].split(b"\n", 2)
        try:
            module, name = lines[0].decode("utf-8"), lines[1].decode("utf-8")
        except (IndexError, UnicodeDecodeError):
            _refuse("the pickle names a global that is not UTF-8")
        self.push(self.find_class(module, name))

    def op_stack_global(self, arg: None, pos: int) -> None:
        name, module = self.pop(), self.pop()
        if module.kind != "lit" or type(module.value) is not str or name.kind != "lit" or type(name.value) is not str:
            _refuse("the pickle names a global through operands that are not literal strings")
        self.push(self.find_class(module.value, name.value))

    def find_class(self, module: str, name: str) -> _Sym:
        key = (module, name, self.proto)
        found = self.limits.globals.get(key)
        if found is None:
            found = self.limits.globals[key] = _resolve_global(module, name, self.proto, self.allowed)
        return found

    def op_reduce(self, arg: None, pos: int) -> None:
        args = self.pop()
        self.push(self.call(self.pop(), args))

    def op_newobj(self, arg: None, pos: int) -> None:
        args = self.pop()
        self.push(self.new_object(self.pop(), args, None))

    def op_newobj_ex(self, arg: None, pos: int) -> None:
        kwargs, args = self.pop(), self.pop()
        self.push(self.new_object(self.pop(), args, kwargs))

    def op_build(self, arg: None, pos: int) -> None:
        state = self.pop()
        self.build(self.top(), state)


_UPDATED_KINDS: dict[type, str] = {list: "list", dict: "dict", set: "set"}
_OPCODES = {opcode.name: opcode for opcode in pickletools.opcodes}
_CODE2OP = {ord(opcode.code): opcode for opcode in pickletools.opcodes}
_NO_ARGUMENT = frozenset(code for code, opcode in _CODE2OP.items() if opcode.arg is None)
_ONE_BYTE_ARGUMENT = frozenset(ord(_OPCODES[name].code) for name in ("PROTO", "BININT1", "BINGET", "BINPUT"))
_SHORT_BINUNICODE = ord(_OPCODES["SHORT_BINUNICODE"].code)
_MEMOIZE = ord(_OPCODES["MEMOIZE"].code)
_NONE_CODE = ord(_OPCODES["NONE"].code)
_STOP_CODE = ord(_OPCODES["STOP"].code)


def _opcodes(data: bytes) -> Iterator[tuple[int, Any, int]]:
    """``(opcode byte, argument, position)`` of each opcode up to STOP, as ``pickletools.genops`` reads
    them (and the unpickler: one linear stream): the most frequent argument formats are read here,
    every other with pickletools' own reader. Malformed data raises ``ValueError``."""
    end = len(data)
    stream: io.BytesIO | None = None
    i = 0
    while i < end:
        pos, code = i, data[i]
        i += 1
        if code in _NO_ARGUMENT:
            yield code, None, pos
            if code == _STOP_CODE:
                return
        elif code == _SHORT_BINUNICODE:
            stop = i + 1 + data[i] if i < end else end + 1
            if stop > end:
                raise ValueError(f"at position {pos}, a string runs past the end of the pickle")
            yield code, data[i + 1 : stop].decode("utf-8", "surrogatepass"), pos
            i = stop
        elif code in _ONE_BYTE_ARGUMENT:
            if i >= end:
                raise ValueError(f"at position {pos}, an argument runs past the end of the pickle")
            yield code, data[i], pos
            i += 1
        else:
            opcode = _CODE2OP.get(code)
            if opcode is None or opcode.arg is None:
                raise ValueError(f"at position {pos}, opcode {bytes([code])!r} unknown")
            if stream is None:
                stream = io.BytesIO(data)
            stream.seek(i)
            arg = opcode.arg.reader(stream)
            i = stream.tell()
            yield code, arg, pos
    raise ValueError("pickle exhausted before seeing STOP")

#: Opcode -> check. Any opcode missing here (INST, OBJ: legacy calls; EXT1/2/4: copyreg extension
#: codes; PERSID/BINPERSID: persistent ids; NEXT_BUFFER/READONLY_BUFFER: out-of-band buffers) is refused.
_HANDLERS: dict[int, Any] = {
    ord(_OPCODES[name].code): handler
    for names, handler in [
        (("PROTO",), _PickleCheck.op_proto),
        (("FRAME",), _PickleCheck.op_frame),
        (("STOP",), _PickleCheck.op_stop),
        (
            (
                "INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4", "FLOAT", "BINFLOAT",
                "UNICODE", "SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "BINBYTES", "SHORT_BINBYTES",
                "BINBYTES8", "STRING", "BINSTRING", "SHORT_BINSTRING",
            ),
            _PickleCheck.op_literal,
        ),
        (("BYTEARRAY8",), _PickleCheck.op_bytearray),
        (("NONE",), _PickleCheck.op_none),
        (("NEWTRUE",), _PickleCheck.op_true),
        (("NEWFALSE",), _PickleCheck.op_false),
        (("EMPTY_TUPLE",), _PickleCheck.op_empty_tuple),
        (("TUPLE1",), _PickleCheck.op_tuple1),
        (("TUPLE2",), _PickleCheck.op_tuple2),
        (("TUPLE3",), _PickleCheck.op_tuple3),
        (("TUPLE",), _PickleCheck.op_tuple),
        (("EMPTY_LIST",), _PickleCheck.op_empty_list),
        (("LIST",), _PickleCheck.op_list),
        (("EMPTY_DICT",), _PickleCheck.op_empty_dict),
        (("DICT",), _PickleCheck.op_dict),
        (("EMPTY_SET",), _PickleCheck.op_empty_set),
        (("FROZENSET",), _PickleCheck.op_frozenset),
        (("APPEND",), _PickleCheck.op_append),
        (("APPENDS",), _PickleCheck.op_appends),
        (("SETITEM",), _PickleCheck.op_setitem),
        (("SETITEMS",), _PickleCheck.op_setitems),
        (("ADDITEMS",), _PickleCheck.op_additems),
        (("MARK",), _PickleCheck.op_mark),
        (("POP",), _PickleCheck.op_pop),
        (("POP_MARK",), _PickleCheck.op_pop_mark),
        (("DUP",), _PickleCheck.op_dup),
        (("GET", "BINGET", "LONG_BINGET"), _PickleCheck.op_get),
        (("PUT", "BINPUT", "LONG_BINPUT"), _PickleCheck.op_put),
        (("MEMOIZE",), _PickleCheck.op_memoize),
        (("GLOBAL",), _PickleCheck.op_global),
        (("STACK_GLOBAL",), _PickleCheck.op_stack_global),
        (("REDUCE",), _PickleCheck.op_reduce),
        (("NEWOBJ",), _PickleCheck.op_newobj),
        (("NEWOBJ_EX",), _PickleCheck.op_newobj_ex),
        (("BUILD",), _PickleCheck.op_build),
    ]
    for name in names
}


def _pickled_leaves(value: Any) -> Iterator[Any]:
    """Every value ``decode_checkpoint_value`` would unpickle, found as its ``_decode`` finds them."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            if _PICKLE_MARKER in item and _TYPE_MARKER in item:
                yield item[_PICKLE_MARKER]
            else:
                pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)


def _unbase64(encoded: Any) -> bytes:
    """A pickled leaf's bytes, decoded as ``_base64_to_unpickle`` decodes them."""
    if not isinstance(encoded, str):
        _refuse("a pickled value is not a base64 string")
    try:
        return base64.b64decode(encoded.encode("ascii"), validate=True)
    except (UnicodeEncodeError, binascii.Error) as exc:
        _refuse(f"a pickled value is not valid base64 ({exc})")


def _check_pickles(parsed: Any, allowed: frozenset[str]) -> None:
    """Run every pickled leaf of ``parsed`` through :class:`_PickleCheck`, under one set of limits."""
    pickles = [_unbase64(encoded) for encoded in _pickled_leaves(parsed)]
    limits = _Limits(sum(map(len, pickles)))
    for data in pickles:
        _PickleCheck(data, allowed, limits).run()


def restricted_decode(parsed: Any, allowed_types: frozenset[str]) -> Any:
    """``decode_checkpoint_value(parsed)`` once every pickled leaf has passed :class:`_PickleCheck`."""
    _check_pickles(parsed, allowed_types | frozenset(_REGISTERED_CHECKPOINT_TYPE_KEYS))
    return decode_checkpoint_value(parsed, allowed_types=allowed_types)
