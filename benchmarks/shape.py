"""The checkpoints the raw-operation workloads write, in issue 15's shape by default.

A :class:`ShapeThread` is one LangGraph thread written with ``put`` (and
``put_writes``): ``channels`` channels of ``size`` bytes of text each, of
which ``changing`` get a new value (and a new version) per put, as a graph
step does; each put is followed by ``put_writes`` of 2 writes. The default is
the issue's shape: 3 channels x 1 KB, one changing per put, 2 writes.
"""

from __future__ import annotations

import random
import time
from typing import Any

from .harness import Clock, SaverCall, Script, timed

__all__ = ["CHUNK", "ShapeThread", "by_id_config", "thread_config"]

CHUNK = "".join(random.Random(1).choices("abcdefghijklmnopqrstuvwxyz0123456789", k=1024))


def thread_config(thread_id: str, ns: str | None = "") -> dict[str, Any]:
    """The config of a thread (``ns=None``: without ``checkpoint_ns``)."""
    configurable: dict[str, Any] = {"thread_id": thread_id}
    if ns is not None:
        configurable["checkpoint_ns"] = ns
    return {"configurable": configurable}


def by_id_config(thread_id: str, checkpoint_id: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": "", "checkpoint_id": checkpoint_id}}


def _text(channel: str, thread_id: str, i: int, size: int) -> str:
    head = f"{channel}:{thread_id}:{i:08d}:"
    return head + (CHUNK * (size // len(CHUNK) + 1))[: max(0, size - len(head))]


class ShapeThread:
    """One thread written in a fixed shape; remembers its versions, ids and last config."""

    def __init__(self, thread_id: str, *, channels: int = 3, size: int = 1024, changing: int = 1) -> None:
        self.thread_id = thread_id
        self.channels = [f"ch{c}" for c in range(channels)]
        self.size, self.changing = size, changing
        self.config: Any = thread_config(thread_id)
        self.versions: dict[str, Any] = {}
        self.values: dict[str, str] = {}
        self.ids: list[str] = []

    def _next(self, saver: Any) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        from langgraph.checkpoint.base import empty_checkpoint
        from langgraph.checkpoint.base.id import uuid6

        i = len(self.ids)
        first = (i * self.changing) % len(self.channels)
        changed = self.channels if i == 0 else [
            self.channels[(first + k) % len(self.channels)] for k in range(self.changing)]
        new_versions = {}
        for channel in changed:
            self.versions[channel] = saver.get_next_version(self.versions.get(channel), None)
            self.values[channel] = _text(channel, self.thread_id, i, self.size)
            new_versions[channel] = self.versions[channel]
        checkpoint = empty_checkpoint()
        checkpoint["id"] = str(uuid6(clock_seq=i))
        checkpoint["channel_versions"] = dict(self.versions)
        checkpoint["channel_values"] = dict(self.values)
        self.ids.append(checkpoint["id"])
        return dict(checkpoint), {"source": "loop", "step": i, "parents": {}}, new_versions

    def puts(self, saver: Any, count: int, *, writes: bool = True, clock: Clock | None = None,
             suffix: str = "", deadline: float = float("inf")) -> Script[int]:
        """``count`` puts (each with 2 writes when ``writes``), timed into ``clock`` as
        ``put{suffix}`` / ``put_writes{suffix}``; stops early at ``deadline``; returns the puts done."""
        for done in range(count):
            if time.perf_counter() > deadline:
                return done
            checkpoint, metadata, new_versions = self._next(saver)
            put = SaverCall("put" + suffix, "put", (self.config, checkpoint, metadata, new_versions))
            self.config = yield from timed(clock, put)
            if writes:
                pending = [(self.channels[0], f"w{len(self.ids)}:{CHUNK[:64]}"), ("step", len(self.ids))]
                yield from timed(clock, SaverCall("put_writes" + suffix, "put_writes",
                                                  (self.config, pending, f"task-{len(self.ids)}")))
        return count
