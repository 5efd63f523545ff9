"""The saver's decoding allowlist: the application's own data classes resume, code never runs."""

from __future__ import annotations

import dataclasses
import enum
import subprocess  # imported on purpose: Popen is a class of an imported module
import sys
import uuid
from pathlib import Path
from typing import Any

import ormsgpack
import pytest
from langgraph.checkpoint.serde.jsonplus import (
    EXT_CONSTRUCTOR_KW_ARGS,
    EXT_CONSTRUCTOR_POS_ARGS,
    JsonPlusSerializer,
)
from langgraph.graph import END, START, StateGraph
from pydantic import BaseModel

from checkpointers._serde import SafeSerializer
from checkpointers.backends import Backend
from checkpointers.errors import DisallowedTypeError
from checkpointers.savers import Checkpointer


class Item(BaseModel):
    name: str
    qty: int


class Color(enum.Enum):
    RED = "red"


@dataclasses.dataclass
class Note:
    text: str


class State(BaseModel):
    items: list[Item] = []
    color: Color = Color.RED
    notes: list[Note] = []
    n: int = 0


def _graph(saver: Any) -> Any:
    def step(state: State) -> dict[str, Any]:
        return {
            "items": [*state.items, Item(name=f"i{state.n}", qty=state.n)],
            "notes": [*state.notes, Note(f"n{state.n}")],
            "n": state.n + 1,
        }

    builder = StateGraph(State)
    builder.add_node("step", step)
    builder.add_edge(START, "step")
    builder.add_conditional_edges("step", lambda s: END if s.n >= 3 else "step")
    return builder.compile(checkpointer=saver, interrupt_before=["step"])


def test_a_state_of_the_apps_own_models_resumes_on_a_fresh_saver(backend: Backend) -> None:
    user, config = f"u-{uuid.uuid4().hex}", {"configurable": {"thread_id": "t"}}
    first = _graph(Checkpointer(backend).for_user(user))
    first.invoke(State(), config)  # stops before the first step
    first.invoke(None, config)  # one step, then the interrupt again
    fresh = _graph(Checkpointer(backend).for_user(user))  # a new saver: nothing cached
    state = fresh.get_state(config).values
    assert state["items"] == [Item(name="i0", qty=0)] and state["notes"] == [Note("n0")]
    assert state["color"] is Color.RED
    while fresh.get_state(config).next:
        fresh.invoke(None, config)
    assert fresh.get_state(config).values["n"] == 3


def test_strict_decoding_refuses_even_the_apps_own_models(backend: Backend) -> None:
    user, config = f"u-{uuid.uuid4().hex}", {"configurable": {"thread_id": "t"}}
    graph = _graph(Checkpointer(backend).for_user(user))
    graph.invoke(State(), config)
    graph.invoke(None, config)
    strict = Checkpointer(backend, strict_decoding=True).for_user(user)
    with pytest.raises(DisallowedTypeError, match="not in the decoding allowlist"):
        strict.get_tuple(config)
    allowed = Checkpointer(backend, strict_decoding=True, allowed_msgpack_modules=[State, Item, Note, Color])
    assert allowed.for_user(user).get_tuple(config) is not None


def _ext(code: int, *parts: Any) -> tuple[str, bytes]:
    return "msgpack", ormsgpack.packb(ormsgpack.Ext(code, ormsgpack.packb(list(parts))))


@pytest.mark.parametrize(
    ("module", "name", "code", "args"),
    [
        ("subprocess", "Popen", EXT_CONSTRUCTOR_POS_ARGS, [["touch", "{marker}"]]),  # a class, not a data class
        ("os", "system", EXT_CONSTRUCTOR_POS_ARGS, ["touch {marker}"]),  # a function
        ("builtins", "eval", EXT_CONSTRUCTOR_POS_ARGS, ["open({marker!r}, 'w')"]),
        ("tests.test_serde", "Item", EXT_CONSTRUCTOR_KW_ARGS, {"name": "x", "qty": 1}),  # strict only
    ],
    ids=["popen", "os-system", "eval", "own-model-strict"],
)
def test_nothing_but_data_classes_is_ever_called(tmp_path: Path, module: str, name: str, code: int, args: Any) -> None:
    marker = str(tmp_path / "marker")
    filled = [a.replace("{marker}", marker) if isinstance(a, str) else a for a in args] if isinstance(args, list) else args
    if isinstance(filled, list):
        filled = [[x.replace("{marker}", marker) for x in a] if isinstance(a, list) else a for a in filled]
    serde = SafeSerializer(strict=name == "Item")
    with pytest.raises(DisallowedTypeError) as info:
        serde.loads_typed(_ext(code, module, name, filled))
    assert (info.value.module, info.value.name) == (module, name)
    assert not Path(marker).exists()


def test_a_module_not_yet_imported_is_never_imported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    marker = tmp_path / "imported"
    (tmp_path / "lazy_side_effect.py").write_text(
        f"open({str(marker)!r}, 'w').close()\nimport dataclasses\n@dataclasses.dataclass\nclass D:\n    x: int = 0\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(DisallowedTypeError):
        SafeSerializer().loads_typed(_ext(EXT_CONSTRUCTOR_KW_ARGS, "lazy_side_effect", "D", {"x": 1}))
    assert "lazy_side_effect" not in sys.modules and not marker.exists()


def test_what_jsonplus_writes_reads_back() -> None:
    value = {"items": [Item(name="a", qty=1)], "color": Color.RED, "note": Note("t"), "set": {1, 2}}
    assert SafeSerializer().loads_typed(JsonPlusSerializer().dumps_typed(value)) == value
    assert subprocess.Popen  # the import above is used: Popen is reachable in sys.modules


def test_a_model_defined_in_a_function_comes_back_as_its_fields() -> None:
    class Local(BaseModel):
        a: int

    data = JsonPlusSerializer().dumps_typed({"v": Local(a=1)})
    assert SafeSerializer().loads_typed(data) == {"v": {"a": 1}}  # as LangGraph returns a class it cannot find
