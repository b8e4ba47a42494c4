"""A coding task (prompt + tests) and the knobs of one agent-task rollout.

`AgentTaskInput` is what `temporal workflow start --type AgentTaskWorkflow --input '<json>'`
takes; see the README for an example. The rules a task's tests must follow
(`hidden_tests_problem`, `defines_check`, `uncalled_check`), which `TaskSpec.load_problem` asks,
are contracts/task_tests.py's.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import Literal

from pydantic import Field, model_validator

from contracts.common import Contract, Identifier, InputContract, ObjectRef, empty_left_out
from contracts.task_tests import defines_check, hidden_tests_problem

MIN_MEMORY_MB, MAX_MEMORY_MB = 16, 65536
"""A sandbox's memory limit at least and at most (`SandboxLimits.memory_mb`), and a task's
(`WorkspaceSpec.memory_mb`)."""


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
    env_vars: dict[str, str] = {}
    """Environment variables of every command run in the workspace (the Dockerfile's ENV); not
    of its verifier, which has `Check.env` only (infra/environments/checks.py)."""
    memory_mb: int | None = Field(
        default=None, ge=MIN_MEMORY_MB, le=MAX_MEMORY_MB, exclude_if=empty_left_out
    )
    """The memory limit (MB) the task states (Harbor's `[environment] memory_mb`): that of its
    agent's commands and of its check, in place of the run's `limits.memory_mb`, larger or
    smaller, at most the sandbox worker's cap (`limits_of`); None, the run's. Left out of the
    payload while None (`empty_left_out`): a sandbox worker of the release before, which refuses
    unknown fields, still takes a task that states none."""

    def limits_of(self, run: SandboxLimits, cap_mb: int) -> SandboxLimits:
        """The limits of this task's commands and check: the run's, but the memory it states,
        at most `cap_mb` (the operator's `sandbox.workspaces.max_task_memory_mb`), a cap that
        never lowers it below the run's own limit. The rule's one home: a task stating 4096 MB
        whose test needed 1 GB ran under the run's 512 MB, and a correct answer scored 0; then
        any task.toml gave each sandbox up to 64 GB. Applied twice with the same cap, or again
        with `cap_mb` the memory it gave, it gives the same limits."""
        if self.memory_mb is None:
            return run
        memory = min(self.memory_mb, max(cap_mb, run.memory_mb))
        return run.model_copy(update={"memory_mb": memory})


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
    hidden_tests: str = Field(
        default="",
        description="Python test units run in the same namespace after `tests` (and after "
        "`check(entry_point)`), counted in the verdict like every other unit, whose failures are "
        "never shown: the checker reports only 'a hidden test failed (<exception type>)', so a "
        "program cannot special-case what its feedback showed. Each top-level assert is one unit "
        "(`judge.split_tests`), and there must be one at least (`hidden_tests_problem`, asked "
        "where tasks load: a hidden `def check(candidate)` would never be called). The `starter` "
        "suite holds half its asserts here; HumanEval and other suites have none (HumanEval's "
        "`check` is one function).",
    )
    helpers: str = Field(
        default="",
        description="Trusted task code (e.g. helpers the prompt defines) run beside the tests on "
        "the verifier's checker side, never from the model's output, so a program cannot redefine "
        "what the tests call.",
    )
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

    def load_problem(self) -> str | None:
        """Why this task may not be loaded into a run or an evaluation (None: it may), asked
        where task files load (`infra.tasks.jsonl.parse_line`), not on decode: a run carries its
        suite through every continue-as-new (`RunResume.tasks`), so a suite an earlier release
        stored must still decode, or the run's next segment fails for ever."""
        if problem := hidden_tests_problem(self.hidden_tests):
            return f"hidden_tests: {problem}"
        if self.entry_point and not defines_check(self.tests, self.helpers):
            return (
                "tests: they (and the helpers) define no check(candidate), which the checker "
                f"calls with the program's {self.entry_point!r}, so every program fails: write "
                "them as `def check(candidate):` asserting on candidate(...)"
            )
        return None


class SamplingParams(InputContract):
    """How a row's completion is sampled (a run's `sampling` and `eval_sampling`)."""

    temperature: float = Field(
        default=0.8,
        ge=0.0,
        le=2.0,
        description="Softmax temperature of the sampling distribution; 0 is greedy (argmax).",
    )
    top_p: float = Field(
        default=0.95,
        gt=0.0,
        le=1.0,
        description="Nucleus sampling: each token is drawn from the smallest set of tokens whose "
        "probabilities sum to at least this; 1 samples from the whole distribution (the `vllm` "
        "backend refuses a sampled row with less: its log-probs would include the cut).",
    )
    max_new_tokens: int = Field(
        default=256,
        ge=1,
        le=8192,
        description="Completion tokens of one turn at most. A step is taken only while its "
        "prompt plus this fits the episode's context budget (`max_context_tokens`).",
    )
    seed: int | None = Field(
        default=None,
        # no bound: inputs recorded before must decode; a new run's is `new_run_problem`'s
        description="Base seed; each row (task, sample, turn) seeds its own stream from it "
        "(None: unseeded).",
    )
    stop_after_code_block: bool = Field(
        default=False,
        description="Stop a completion once its first block that `extract_code` would run "
        "(untagged or python, defining a function) is closed.",
    )
    stop_after_tool_call: bool = Field(
        default=False,
        description="Stop a completion once the call the parser takes is closed (a tag "
        "mentioned before it is none, nor one drafted in a <think> block, be it opened by the "
        "completion or by the chat template's generation prompt).",
    )
    tool_choice: Literal["auto", "required"] = Field(
        default="auto",
        description="`required`: the turn is one well-formed tool call, decoded under a grammar "
        "(the local backend; see infra/inference/guided.py); `auto`: the model writes freely.",
    )
    priority: int = Field(
        default=0,
        ge=0,
        le=9,
        description="Order in which waiting rows enter the local backend's running batch, lower "
        "first (a run's evaluations: 1, behind its training rollouts); it never changes a token.",
    )

    @property
    def logprob_temperature(self) -> float:
        """The temperature at which a sampled token's log-prob is taken, by the sampler and by
        the learner alike: `temperature`, whose softmax the token was drawn from (top-p left
        out, as verl's and TRL's learners leave it out), or 1 for a greedy row (no distribution
        to take it from: the policy's own). The policy gradient and the importance ratio are
        then those of the distribution that sampled, not of another one."""
        return self.temperature if self.temperature > 0 else 1.0


class RewardConfig(InputContract):
    """Reward of a sample: `solved` when its tests pass, plus `failed_turn` per failed round;
    a `workspace` episode earns `solved` times its verifier's score above the untouched
    workspace's."""

    solved: float = Field(default=1.0, ge=-100, le=100, description="Reward of a solved sample.")
    failed_turn: float = Field(
        default=-0.1, ge=-100, le=100, description="Added once per round whose tests failed."
    )

    def score(
        self,
        rounds_passed: Sequence[bool],
        verdict: float | None = None,
        untouched: float | None = None,
        cut_short_of: int | None = None,
    ) -> float:
        """The reward formula, in its one home: a sample whose rounds passed or failed as
        `rounds_passed` says (the last round decides `solved`) scores `solved` if it solved,
        plus `failed_turn` for every failed round. A `workspace` episode has no test rounds:
        its final workspace's `verdict` (the verifier's score in [0, 1]) earns `solved` times
        its share of the way from the `untouched` workspace's score to 1, never below 0 (the
        hidden asserts the bug does not touch pass anyway: doing nothing earned 0.34 on average
        in the workspace suite). `cut_short_of`: the turns a `code` episode was allowed when its
        context ran out (`context_budget`): unless its last round passed, each it never took is
        a failed round (else a long failing turn that ends an episode early would score above
        trying again). The workflow's FEEDBACK and DONE and
        `tempered regrade` call it."""
        if verdict is not None:
            if untouched is not None and untouched < 1.0:
                verdict = max(0.0, (verdict - untouched) / (1.0 - untouched))
            earned = self.solved * verdict
        else:
            earned = self.solved if rounds_passed and rounds_passed[-1] else 0.0
        failed = sum(1 for passed in rounds_passed if not passed)
        if cut_short_of is not None and not (rounds_passed and rounds_passed[-1]):
            failed += max(0, cut_short_of - len(rounds_passed))
        return earned + self.failed_turn * failed


MAX_CHECK_S = 3600.0
"""The longest a workspace task's check may take (`Check.timeout_s`; Harbor's `[verifier]
timeout_sec`): the workflows allow a verified item as much (workflows/activity_options.py)."""


class SandboxLimits(InputContract):
    """Resource limits of one sandboxed execution."""

    timeout_s: float = Field(default=10.0, gt=0, le=3600, description="Wall-clock deadline.")
    cpu_s: int = Field(default=10, ge=1, le=3600, description="CPU-time limit (RLIMIT_CPU).")
    memory_mb: int = Field(
        default=512, ge=MIN_MEMORY_MB, le=MAX_MEMORY_MB, description="Memory limit."
    )
    max_processes: int = Field(default=32, ge=1, le=4096, description="Processes/threads.")
    file_size_mb: int = Field(default=16, ge=1, le=4096, description="Largest file written.")
    tmpfs_mb: int = Field(default=64, ge=1, le=4096, description="Size of the private work dir.")
    output_bytes: int = Field(
        default=65536,
        ge=256,
        le=16 * 2**20,
        description="Stdout/err cap (a Kubernetes pod keeps at most 1 MiB of each: "
        "infra/sandbox/kubernetes_job.py's POD_OUTPUT_BYTES).",
    )


MAX_GROUP_STEPS = 768
"""The most episode-steps (`group_size × max_turns`) of one task: its history stays within a
quarter of Temporal's limits (50 MiB, 51,200 events). An episode-step adds 12.5 KB at worst
(128-character run and task ids, a call whose brief keeps 2,000 characters: `MAX_KEPT_CHARS`),
5 KB with short ids and `write_file` calls; a step 2 KB and 16 events, plus its prompt and tests,
whatever G is. The largest groups, G=256 × 3 and G=3 × 256, made 9.6 and 10 MiB (scaled from 16
turns), 4,300 events at most (tests/workflows/test_agent_task_history_bound.py): 2.5 MiB are
left for prompts and tests (10 KB a step at 256 turns). G=128 × 20 made 9.4 MiB before."""


def group_steps_problem(group_size: int, max_turns: int) -> str:
    """Why a task of `group_size` episodes of `max_turns` steps is too large for one workflow's
    history, or "" when it is not: the rule, in its one home, asked of a new run
    (`contracts.new_run`) and of a new task (`AgentTaskWorkflow`, behind a patch). Not a
    validator of `AgentTaskInput`: a new bound on old fields would fail the replay of tasks and
    runs started before it (a larger G × turns was valid then)."""
    steps = group_size * max_turns
    if steps <= MAX_GROUP_STEPS:
        return ""
    return (
        f"group_size × max_turns = {group_size} × {max_turns} = {steps:,} episode-steps: at most "
        f"{MAX_GROUP_STEPS:,} (MAX_GROUP_STEPS), so that a task's history stays within a "
        "quarter of Temporal's 50 MiB limit; lower group_size or max_turns"
    )


class AgentTaskInput(InputContract):
    """Input of `AgentTaskWorkflow`: one task rolled out as a GRPO group of `group_size` samples;
    a new task of more than `MAX_GROUP_STEPS` episode-steps (`group_size × max_turns`) fails at
    its start (`group_steps_problem`)."""

    task: TaskSpec
    run_id: Identifier = "adhoc"
    group_size: int = Field(default=4, ge=1, le=256, description="G, samples in the group.")
    max_turns: int = Field(
        default=3, ge=1, le=256, description="Steps (generate/execute rounds) per episode at most."
    )
    max_context_tokens: int = Field(
        default=4096,
        ge=64,
        le=1 << 20,
        description="Context budget of an episode: a step whose prompt plus "
        "`sampling.max_new_tokens` would exceed it is not taken; the episode ends as "
        "`context_budget`.",
    )
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
    session_timeout_s: float = Field(
        default=30.0,
        ge=1.0,
        le=3600,
        description="`workspace`: a step not picked up this long by the sandbox worker holding "
        "its session finds that worker gone; the session is restored on another.",
    )


def eval_task_input(
    task: TaskSpec,
    *,
    run_id: str,
    policy_run: str,
    policy_version: int,
    sampling: SamplingParams,
    limits: SandboxLimits,
    max_turns: int,
    max_context_tokens: int,
    heartbeat_timeout_s: float,
) -> AgentTaskInput:
    """Evaluation rollout of one task: one greedy-or-given sample, up to `max_turns` turns, a
    pinned policy (pass@1 is whether its first turn solved it)."""
    return AgentTaskInput(
        task=task,
        run_id=run_id,
        group_size=1,
        max_turns=max_turns,
        max_context_tokens=max_context_tokens,
        sampling=sampling,
        limits=limits,
        policy_run=policy_run,
        policy_version=policy_version,
        heartbeat_timeout_s=heartbeat_timeout_s,
    )
