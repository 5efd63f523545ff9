"""Real ``agent_framework`` workflows for the Agent Framework face tests.

The executors live here, in an importable module, not in a test's
``__main__``: the framework's graph signature includes each executor's class
path, so a resumed process must import the same module to restore a
checkpoint.

Run as a script it is the child process of the SIGKILL test::

    python -m tests.af_workflows run    <sqlite file> <user> <workflow name> <kill at n>
    python -m tests.af_workflows resume <sqlite file> <user> <workflow name>

Each workflow output is printed as one JSON line as soon as it is emitted.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from dataclasses import dataclass, field
from typing import Any

from agent_framework import (
    Executor,
    Workflow,
    WorkflowBuilder,
    WorkflowCheckpoint,
    WorkflowContext,
    handler,
    response_handler,
)
from typing_extensions import Never

COUNTDOWN_FROM = 20


class CrashError(RuntimeError):
    """Raised by :class:`Decrement` to simulate a crash at a chosen number."""


class Decrement(Executor):
    """Outputs ``n`` and sends ``n - 1`` on, until 0; counts what it handled.

    ``crash_at`` raises :class:`CrashError`, ``kill_at`` SIGKILLs the process,
    both before handling that number. ``ballast`` pads the executor state.
    """

    def __init__(
        self,
        *,
        crash_at: int | None = None,
        kill_at: int | None = None,
        ballast: int = 0,
    ) -> None:
        super().__init__(id="decrement")
        self.crash_at = crash_at
        self.kill_at = kill_at
        self.ballast = ballast
        self.handled = 0

    @handler
    async def step(self, n: int, ctx: WorkflowContext[int, int]) -> None:
        if n == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        if n == self.crash_at:
            raise CrashError(f"simulated crash before handling {n}")
        self.handled += 1
        await ctx.yield_output(n)
        if n > 0:
            await ctx.send_message(n - 1)

    async def on_checkpoint_save(self) -> dict[str, Any]:
        return {"handled": self.handled, "ballast": "x" * self.ballast}

    async def on_checkpoint_restore(self, state: dict[str, Any]) -> None:
        self.handled = state["handled"]


class Relay(Executor):
    """Sends every number on unchanged: the second half of the countdown loop, a fan-out's head."""

    def __init__(self, id: str = "relay") -> None:
        super().__init__(id=id)

    @handler
    async def forward(self, n: int, ctx: WorkflowContext[int]) -> None:
        await ctx.send_message(n)


def countdown_workflow(name: str, storage: Any = None, **decrement: Any) -> Workflow:
    """Two executors in a loop: ``decrement -> relay -> decrement``; outputs 20..0."""
    dec, relay = Decrement(**decrement), Relay()
    builder = WorkflowBuilder(name=name, start_executor=dec, checkpoint_storage=storage)
    return builder.add_edge(dec, relay).add_edge(relay, dec).build()


class Multiply(Executor):
    """A worker: sends ``n * factor``."""

    def __init__(self, id: str, factor: int) -> None:
        super().__init__(id=id)
        self.factor = factor

    @handler
    async def multiply(self, n: int, ctx: WorkflowContext[int]) -> None:
        await ctx.send_message(n * self.factor)


class Gather(Executor):
    """Fan-in: outputs the sorted results of every branch."""

    def __init__(self) -> None:
        super().__init__(id="gather")

    @handler
    async def gather(self, results: list[int], ctx: WorkflowContext[Never, list[int]]) -> None:
        await ctx.yield_output(sorted(results))


def fan_workflow(name: str, storage: Any = None) -> Workflow:
    """``split`` fans out to three workers; one branch is a superstep longer.

    The fan-in into ``gather`` is therefore partly filled after superstep 2,
    so one checkpoint carries a half-full fan-in buffer.
    """
    split, gather = Relay("split"), Gather()
    a, b, c, slow = Multiply("a", 2), Multiply("b", 3), Multiply("c", 5), Multiply("slow", 7)
    builder = WorkflowBuilder(name=name, start_executor=split, checkpoint_storage=storage)
    builder.add_fan_out_edges(split, [a, b, c]).add_edge(c, slow)
    return builder.add_fan_in_edges([a, b, slow], gather).build()


@dataclass
class Question:
    """A request for external input; not a framework type, so it needs the allowlist."""

    text: str
    n: int
    notes: list[str] = field(default_factory=list)


#: What ``allowed_checkpoint_types`` must name for :class:`Question`.
QUESTION_TYPE = f"{Question.__module__}:{Question.__qualname__}"


class Ask(Executor):
    """Asks for approval of ``n`` and outputs ``"<n>:<answer>"`` when answered."""

    def __init__(self) -> None:
        super().__init__(id="ask")

    @handler
    async def ask(self, n: int, ctx: WorkflowContext) -> None:
        await ctx.request_info(Question(f"approve {n}?", n), str)

    @response_handler
    async def answered(
        self, original_request: Question, response: str, ctx: WorkflowContext[Never, str]
    ) -> None:
        await ctx.yield_output(f"{original_request.n}:{response}")


def ask_workflow(name: str, storage: Any = None) -> Workflow:
    """``relay -> ask``: pauses on a request for external input."""
    relay, ask = Relay(), Ask()
    builder = WorkflowBuilder(name=name, start_executor=relay, checkpoint_storage=storage)
    return builder.add_edge(relay, ask).build()


def synthetic_checkpoint(
    workflow_name: str,
    *,
    previous_checkpoint_id: str | None = None,
    iteration: int = 0,
    state_bytes: int = 0,
    **fields: Any,
) -> WorkflowCheckpoint:
    """A checkpoint built directly (no workflow run), for unit tests and benchmarks.

    ``state_bytes`` pads ``state`` with that many characters.
    """
    return WorkflowCheckpoint(
        workflow_name=workflow_name,
        graph_signature_hash="0" * 64,
        previous_checkpoint_id=previous_checkpoint_id,
        iteration_count=iteration,
        state={"n": iteration, "pad": "x" * state_bytes},
        **fields,
    )


# -- the SIGKILL test's child process ----------------------------------------


async def _child(command: str, path: str, user: str, name: str, kill_at: int | None) -> None:
    from adapters.agent_framework import IsolatedCheckpointStorage
    from checkpointers.backends.sqlite import SqliteBackend

    with SqliteBackend(path) as backend:
        storage = IsolatedCheckpointStorage(backend, user=user)
        workflow = countdown_workflow(name, storage, kill_at=kill_at)
        if command == "run":
            stream = workflow.run(COUNTDOWN_FROM, stream=True)
        else:
            latest = await storage.get_latest(workflow_name=name)
            assert latest is not None, "nothing to resume from"
            print(json.dumps({"resumed_from": latest.checkpoint_id}), flush=True)
            stream = workflow.run(checkpoint_id=latest.checkpoint_id, stream=True)
        async for event in stream:
            if event.type == "output":
                print(json.dumps({"output": event.data}), flush=True)
        print(json.dumps({"handled": workflow.executors["decrement"].handled}), flush=True)
        storage.raise_if_refused()


def main(argv: list[str]) -> int:
    command, path, user, name = argv[:4]
    kill_at = int(argv[4]) if len(argv) > 4 else None
    asyncio.run(_child(command, path, user, name, kill_at))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
