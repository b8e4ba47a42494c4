"""The stored trajectory document (`runs/<run>/trajectories/<task>--s<sample>.json`).

Written once by the rewards worker when an agent task reaches DONE; read by the learner and by
`tempered regrade`, which writes a `RewardRecord` per trajectory beside it. It holds the exact
token ids that were sampled, so the learner never re-tokenizes.
"""

from pydantic import Field

from contracts.common import Contract
from contracts.sandbox import ExecStatus


class TrajectoryTurn(Contract):
    turn: int
    policy_version: int
    prompt_token_ids: list[int]
    completion_token_ids: list[int]
    completion_logprobs: list[float]
    completion_text: str
    code: str
    status: ExecStatus
    tests_passed: int = 0
    tests_total: int = 0
    reward: float
    started_at: str = ""
    finished_at: str = ""


class Trajectory(Contract):
    id: str = Field(description="`<run>.<task>.s<sample>`; deterministic, so a rewrite is a no-op.")
    run_id: str
    task_id: str
    sample: int
    group_size: int
    prompt: str
    turns: list[TrajectoryTurn]
    reward: float
    solved: bool
    policy_version: int = Field(description="Version that generated the last turn.")
    created_at: str


class RewardRecord(Contract):
    """One regrade of one trajectory (`runs/<run>/rewards/<grader>/<task>--s<sample>.json`)."""

    trajectory_id: str
    grader: str
    suite: str
    status: ExecStatus
    tests_passed: int = Field(default=0, ge=0)
    tests_total: int = Field(default=0, ge=0)
    solved: bool
    reward: float
    previous_solved: bool
    previous_reward: float
    detail: str = Field(default="", description="Tail of stderr when the program failed.")


def trajectory_id(run_id: str, task_id: str, sample: int) -> str:
    return f"{run_id}.{task_id}.s{sample}"
