"""The environment Protocol: what an agent acts in, one file per environment.

    state = await env.reset(task, session_id)                 # INIT: the starting state
    state, observation = await env.step(state, action, limits, 3)   # EXECUTE: step 3
    graded = await env.verify(task, state, limits)            # DONE: the final state's score
    await env.close([session_id])

`code` (code.py): the action is the answer (a program), the observation its test log, and the
state the last answer. `workspace` (workspace.py): the action is a tool call (`bash`,
`read_file`, `write_file`, `submit`), the state a session on a sandbox worker with its last
snapshot, and the score comes from a fresh verifier sandbox holding the hidden tests.

A step runs from the state it is given, never on top of what an earlier attempt of it did:
a retried step keeps its number, and a workspace session that already applied that number
starts again from `state`.

An action that cannot run (a malformed call, an unknown tool, bad arguments, a path out of the
workspace) is an observation saying why, never an exception: it counts as a step. Only faults
of the platform raise (`SandboxInfraError`, storage errors), and those are retried.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from contracts.common import ObjectRef
from contracts.episode import ToolSpec
from contracts.sandbox import ExecStatus, ExecutionResult
from contracts.task import EnvName, SandboxLimits

TaskT = TypeVar("TaskT", contravariant=True)
StateT = TypeVar("StateT")
ActionT = TypeVar("ActionT", contravariant=True)


@dataclass(frozen=True)
class Observation:
    """What one step shows the agent."""

    text: str
    """As the model will read it (a tool's result, a test log)."""
    status: ExecStatus | None = None
    """Of the command or program the step ran (None: nothing ran)."""
    submitted: bool = False
    """The episode is over (`submit`, or an answer that passed)."""


@dataclass(frozen=True)
class Graded:
    """The verifier's result for a final state and the score it earns (in [0, 1])."""

    result: ExecutionResult
    score: float


class Environment(Protocol[TaskT, StateT, ActionT]):
    """reset → step … → verify, for one kind of task (`TaskT`)."""

    name: EnvName
    tools: tuple[ToolSpec, ...]
    """The tools the model may call (empty when the action is the answer itself)."""

    async def reset(
        self, task: TaskT, session_id: str, snapshot: ObjectRef | None = None
    ) -> StateT:
        """The starting state of an episode (from `snapshot` when one is given: a restore)."""
        ...

    async def step(
        self, state: StateT, action: ActionT, limits: SandboxLimits, number: int | None = None
    ) -> tuple[StateT, Observation]:
        """Run one action; the new state and what the agent sees. `number`: the step's in its
        episode, a retry's the same (None: no retry to tell apart)."""
        ...

    async def verify(self, task: TaskT, state: StateT, limits: SandboxLimits) -> Graded:
        """Score a final state."""
        ...

    async def close(self, session_ids: Sequence[str]) -> int:
        """Release these episodes' resources; how many were held here."""
        ...
