"""A coding task (prompt + tests) and the knobs of one agent-task rollout.

`AgentTaskInput` is what `temporal workflow start --type AgentTaskWorkflow --input '<json>'`
takes; see the README for an example.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import Literal

from pydantic import Field, model_validator

from contracts.common import Contract, Identifier, ObjectRef


class EnvName(StrEnum):
    """The environments (infra/environments/, one file each)."""

    CODE = "code"
    """Write one function; the action is the answer, the observation its test log."""
    WORKSPACE = "workspace"
    """Act in a directory with tools (bash, read_file, write_file, submit); verified at DONE."""


class WorkspaceSpec(Contract):
    """What a `workspace` task adds: its initial tree and its hidden tests, both in the store."""

    files: ObjectRef = Field(description="The initial workspace: a snapshot (compressed tree).")
    verifier: ObjectRef = Field(
        description="The hidden tests (a compressed tree); never copied into the workspace."
    )
    workdir: str = Field(default="/app", pattern=r"^/[A-Za-z0-9_./-]*$")
    """Where the workspace is mounted in the sandbox (Harbor's Dockerfile WORKDIR)."""


class TaskSpec(Contract):
    """One task. `code`: write `entry_point` so that `tests` pass (HumanEval's `check(candidate)`
    style). `workspace`: change the tree in `workspace.files` so that its hidden tests pass."""

    id: Identifier
    prompt: str = Field(min_length=1, description="What the model is asked to do.")
    env: EnvName = EnvName.CODE
    entry_point: str | None = Field(
        default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", description="Function under test."
    )
    tests: str = Field(default="", description="Python run after the program in its namespace.")
    workspace: WorkspaceSpec | None = Field(default=None, description="For `workspace` tasks.")
    canonical_solution: str | None = Field(default=None, description="A known-good program.")
    wrong_solution: str | None = Field(default=None, description="A program the tests must reject.")
    suite: str = Field(default="user", description="Name of the suite the task came from.")
    split: Literal["train", "heldout"] = "train"

    @model_validator(mode="after")
    def _fields_of_its_env(self) -> TaskSpec:
        if self.env is EnvName.CODE and not (self.entry_point and self.tests):
            raise ValueError("a code task needs entry_point and tests")
        if self.env is EnvName.WORKSPACE and self.workspace is None:
            raise ValueError("a workspace task needs workspace (files and verifier)")
        return self


class SamplingParams(Contract):
    temperature: float = Field(default=0.8, ge=0.0, le=2.0)
    top_p: float = Field(default=0.95, gt=0.0, le=1.0)
    max_new_tokens: int = Field(default=256, ge=1, le=8192)
    seed: int | None = Field(
        default=None, description="Base seed; sample s at turn t uses seed + 1000·s + t."
    )
    stop_after_code_block: bool = Field(
        default=False, description="Stop a completion once its first ``` block is closed."
    )


class RewardConfig(Contract):
    """Reward of a sample: `solved` when its tests pass, plus `failed_turn` per failed round."""

    solved: float = Field(default=1.0, ge=-100, le=100, description="Reward of a solved sample.")
    failed_turn: float = Field(
        default=-0.1, ge=-100, le=100, description="Added once per round whose tests failed."
    )

    def score(self, rounds_passed: Sequence[bool]) -> float:
        """The reward formula, in its one home: a sample whose rounds passed or failed as
        `rounds_passed` says (the last round decides `solved`) scores `solved` if it solved,
        plus `failed_turn` for every failed round. The workflow's FEEDBACK and `tempered
        regrade` both call it."""
        solved = bool(rounds_passed) and rounds_passed[-1]
        failed = sum(1 for passed in rounds_passed if not passed)
        return (self.solved if solved else 0.0) + self.failed_turn * failed


class SandboxLimits(Contract):
    """Resource limits of one sandboxed execution."""

    timeout_s: float = Field(default=10.0, gt=0, le=3600, description="Wall-clock deadline.")
    cpu_s: int = Field(default=10, ge=1, le=3600, description="CPU-time limit (RLIMIT_CPU).")
    memory_mb: int = Field(default=512, ge=16, le=65536, description="Memory limit.")
    max_processes: int = Field(default=32, ge=1, le=4096, description="Processes/threads.")
    file_size_mb: int = Field(default=16, ge=1, le=4096, description="Largest file written.")
    tmpfs_mb: int = Field(default=64, ge=1, le=4096, description="Size of the private work dir.")
    output_bytes: int = Field(default=65536, ge=256, le=16 * 2**20, description="Stdout/err cap.")


class AgentTaskInput(Contract):
    """Input of `AgentTaskWorkflow`: one task rolled out as a GRPO group of `group_size` samples."""

    task: TaskSpec
    run_id: Identifier = "adhoc"
    group_size: int = Field(default=4, ge=1, le=256, description="G, samples in the group.")
    max_turns: int = Field(default=3, ge=1, le=32, description="Generate/execute rounds at most.")
    sampling: SamplingParams = SamplingParams()
    reward: RewardConfig = RewardConfig()
    limits: SandboxLimits = SandboxLimits()
    policy_version: int | None = Field(
        default=None, ge=0, description="Policy version to sample from; None = newest published."
    )
    policy_run: Identifier | None = Field(
        default=None, description="Run whose policies are sampled; None = `run_id`."
    )
    abort_after: int = Field(
        default=0,
        ge=0,
        description="Circuit breaker: abort the task once this many runs hit timeout or "
        "memory_exceeded (0 = never).",
    )
    heartbeat_timeout_s: float = Field(
        default=30.0, ge=1.0, le=3600, description="An activity silent this long is retried."
    )


def eval_task_input(
    task: TaskSpec,
    *,
    run_id: str,
    policy_run: str,
    policy_version: int,
    sampling: SamplingParams,
    limits: SandboxLimits,
    heartbeat_timeout_s: float = 30.0,
) -> AgentTaskInput:
    """pass@1 rollout of one task: one greedy-or-given sample, one turn, a pinned policy."""
    return AgentTaskInput(
        task=task,
        run_id=run_id,
        group_size=1,
        max_turns=1,
        sampling=sampling,
        limits=limits,
        policy_run=policy_run,
        policy_version=policy_version,
        heartbeat_timeout_s=heartbeat_timeout_s,
    )
