"""Contracts of a held-out evaluation's figures (`EvalResult`, one per policy version a run or
`tempered eval` evaluates), and which envs are judged by their solve rate rather than pass@1 at
turn 1 (`SUBMIT_GRADED`). Read by the run's progress and result (contracts/run.py), its closing
line and report (workers/cli/progress.py, report.py)."""

from collections.abc import Sequence

from pydantic import Field

from contracts.common import Contract, empty_left_out
from contracts.rollout import AgentTaskResult
from contracts.task import EnvName, TaskSpec

SUBMIT_GRADED = frozenset({EnvName.WORKSPACE})
"""Envs whose tasks are graded only once the agent has acted and called `submit` (the tree as
it starts fails its tests): none is solved at its first turn, pass@1 at turn 1 is 0."""


class EvalResult(Contract):
    """Held-out figures of one policy version: one greedy episode per held-out task, up to the
    run's `max_turns` turns, through the same pipeline as training."""

    policy_version: int
    pass_at_1: float = Field(description="Share of tasks solved at the first turn.")
    tasks: int
    solve_rate: float | None = Field(
        default=None, description="Share of tasks solved within `turns` turns (None: not run)."
    )
    turns: int = Field(default=1, ge=1, description="The turns each episode could take.")
    graded_at_submit: bool = Field(
        default=False,
        exclude_if=empty_left_out,  # a reader of the release before still takes it while False
        description="Every task is of a `SUBMIT_GRADED` env: pass@1 is 0 by construction, the "
        "solve rate is the figure (`by_solve_rate`). False where `of` was given no tasks.",
    )

    @property
    def by_solve_rate(self) -> bool:
        """Its figure is the solve rate within `turns` turns, not pass@1 at turn 1."""
        return self.graded_at_submit and self.solve_rate is not None

    @classmethod
    def of(
        cls,
        version: int,
        results: Sequence[AgentTaskResult],
        turns: int,
        tasks: Sequence[TaskSpec] = (),
    ) -> "EvalResult":
        """The figures of one greedy episode (G = 1) per held-out task (`tasks`, whose envs say
        whether pass@1 can be above 0), up to `turns` turns."""
        first_turn = sum(1 for r in results if r.solved[0] and r.turns == 1)
        solved = sum(1 for r in results if r.solved[0])
        count = len(results)
        return cls(
            policy_version=version,
            pass_at_1=first_turn / count,
            solve_rate=solved / count,
            tasks=count,
            turns=turns,
            graded_at_submit=bool(tasks) and all(t.env in SUBMIT_GRADED for t in tasks),
        )
