"""One stored episode, step by step, as `tempered runs show RUN --task ID [--sample N]` prints it.

    print_episode(Console(), store, trajectory)

For each step: the policy version, tokens and finish reason, the model's call (its tool call, or
why it was none, else its program), and what it was shown back (the stored observation as text,
clipped to SHOWN_CHARS); then the verifier's result on the hidden tests.

Not covered: finding and loading a run's trajectories (`runs.py`'s `show_episodes`), and the
run-wide tables of `runs show`.
"""

from __future__ import annotations

import json

from rich.console import Console
from rich.padding import Padding
from rich.text import Text

from contracts.sandbox import ExecutionResult
from contracts.trajectory import Trajectory, TrajectoryStep
from infra.inference.prompts import clip, observation_text
from infra.storage import ObjectStore

SHOWN_CHARS = 2000
"""Most characters of one observation `runs show --task` prints."""


def print_episode(console: Console, store: ObjectStore, trajectory: Trajectory) -> None:
    """Print `trajectory` under a rule: a summary line, each step, the verifier's result."""
    console.rule()
    console.print(
        f"[bold]{trajectory.task_id} sample {trajectory.sample}[/]: {len(trajectory.steps)} "
        f"steps, ended {trajectory.end.value}, reward {trajectory.reward:+.3f}, "
        f"{'solved' if trajectory.solved else 'not solved'}"
    )
    for step in trajectory.steps:
        status = f", {step.status.value}" if step.status else ""
        tokens = step.span[1] - step.span[0]
        console.print(
            f"[bold]step {step.step}[/] (policy v{step.policy_version}, {tokens} tokens, "
            f"{step.finish_reason}{status})"
        )
        console.print(Padding(Text(_action_text(step)), (0, 0, 0, 2)))
        if step.observation is not None:
            data = store.get_verified(step.observation)
            shown = clip(observation_text(trajectory.env, data), SHOWN_CHARS)
            console.print(Padding(Text(shown, style="dim"), (0, 0, 0, 2)))
    if trajectory.verifier is not None:
        result = store.get_model(trajectory.verifier.key, ExecutionResult)
        console.print(
            f"[bold]verifier[/]: {result.status.value}, "
            f"{result.tests_passed}/{result.tests_total} hidden tests"
        )


def _action_text(step: TrajectoryStep) -> str:
    """The model's call: its tool call (or why it was none), else its program."""
    if step.call is None:
        return f"program:\n{step.code or ''}".rstrip()
    if step.call.error:
        return f"no valid call ({step.call.error}); the model wrote:\n{step.completion_text}"
    return f"{step.call.name}({json.dumps(step.call.arguments, ensure_ascii=False)})"
