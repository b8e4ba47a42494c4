"""The group's bookkeeping (`workflows/episodes.py`) as the pure functions it is: what FEEDBACK
records, how an episode ends, the rewards of both environments and the workflow's result.
tests/workflows/test_agent_task.py and test_episodes.py drive the same code through Temporal."""

from __future__ import annotations

from contracts.common import ObjectRef
from contracts.episode import EnvStepOutcome, EpisodeEnd, SessionRef, ToolCall, Verdict
from contracts.rollout import Completion, GenerateResponse
from contracts.sandbox import ExecStatus, ExecuteOutcome
from contracts.task import AgentTaskInput, EnvName, RewardConfig, TaskSpec, WorkspaceSpec
from workflows.episodes import EpisodeGroup


def ref(name: str) -> ObjectRef:
    return ObjectRef(key=name, size=1, sha256="0" * 64)


CODE = TaskSpec(id="add", prompt="add", entry_point="add", tests="assert add(1, 2) == 3\n")
WORKSPACE = TaskSpec(
    id="fix",
    prompt="fix it",
    env=EnvName.WORKSPACE,
    workspace=WorkspaceSpec(files=ref("files"), verifier=ref("hidden")),
)
REWARD = RewardConfig(solved=1.0, failed_turn=-0.1)


def group(task: TaskSpec, size: int = 3) -> EpisodeGroup:
    return EpisodeGroup(AgentTaskInput(task=task, run_id="r", group_size=size, reward=REWARD))


def generated(
    version: int, *samples: int, over_budget: dict[int, int] | None = None
) -> GenerateResponse:
    completions = [
        Completion(sample=s, completion=ref(f"c{s}"), code=ref(f"code{s}"), num_tokens=5 + s)
        for s in samples
    ]
    return GenerateResponse(
        policy_version=version, completions=completions, over_budget=over_budget or {}
    )


def ran(sample: int, status: ExecStatus, passed: int = 0) -> ExecuteOutcome:
    return ExecuteOutcome(
        sample=sample, status=status, tests_passed=passed, tests_total=2, result=ref(f"r{sample}")
    )


def stepped(
    sample: int, *, submitted: bool = False, status: ExecStatus | None = None
) -> EnvStepOutcome:
    session = SessionRef(session_id=f"s{sample}", queue="q", snapshot=ref("snap"), tree_digest="d")
    return EnvStepOutcome(
        sample=sample,
        call=ToolCall(name="submit" if submitted else "bash", arguments={}),
        observation=ref(f"obs{sample}"),
        status=status,
        submitted=submitted,
        session=session,
    )


def test_a_code_step_scores_every_round_and_ends_the_solved() -> None:
    g = group(CODE)
    g.feedback(
        0,
        generated(4, 0, 1, 2),
        {
            0: ran(0, ExecStatus.PASSED, 2),
            1: ran(1, ExecStatus.FAILED, 1),
            2: ran(2, ExecStatus.TIMEOUT),
        },
    )
    solved, failed, slow = g.episodes
    assert (solved.end, solved.solved, solved.reward) == (EpisodeEnd.SUBMITTED, True, 1.0)
    assert (failed.end, failed.solved, failed.reward) == (None, False, -0.1)
    step = failed.steps[0]
    assert (step.step, step.policy_version, step.status, step.reward) == (
        0,
        4,
        ExecStatus.FAILED,
        -0.1,
    )
    assert (step.tests_passed, step.tests_total, step.num_tokens) == (1, 2, 6)
    assert step.observation == ref("r1") and step.code == ref("code1")
    assert [e.sample for e in g.acting()] == [1, 2] and not g.all_ended()
    assert g.resource_failures() == 1 and g.tool_calls() is None

    g.feedback(
        1, generated(5, 1, 2), {1: ran(1, ExecStatus.PASSED, 2), 2: ran(2, ExecStatus.FAILED)}
    )
    assert failed.reward == 1.0 - 0.1 and failed.solved and failed.end is EpisodeEnd.SUBMITTED
    assert slow.reward == -0.2 and slow.end is None  # two failed rounds
    assert g.best_reward() == 1.0
    g.end_acting(EpisodeEnd.STEP_BUDGET)
    assert g.all_ended() and slow.end is EpisodeEnd.STEP_BUDGET
    assert solved.end is EpisodeEnd.SUBMITTED  # an ended episode keeps its end

    result = g.result("DONE", [ref("t0")], policy_version=6, aborted_reason=None)
    assert result.turns == 2 and result.steps == [1, 2, 2]
    assert result.rewards == [1.0, 0.9, -0.2] and result.solved == [True, True, False]
    assert result.policy_versions == [4, 5, 5] and result.best_reward == 1.0
    assert result.ends == [EpisodeEnd.SUBMITTED, EpisodeEnd.SUBMITTED, EpisodeEnd.STEP_BUDGET]


def test_a_step_records_the_version_that_sampled_its_completion() -> None:
    """An overlapping attempt's stored completion (v3) answered a response of v4: the step
    said v4, and staleness was counted from the wrong version."""
    g = group(CODE, size=2)
    response = generated(4, 0, 1)
    response.completions[0].policy_version = 3
    g.feedback(0, response, {0: ran(0, ExecStatus.FAILED), 1: ran(1, ExecStatus.FAILED)})
    assert [e.steps[0].policy_version for e in g.episodes] == [3, 4]


def test_an_episode_over_the_context_budget_ends_unsampled() -> None:
    g = group(CODE, size=2)
    g.feedback(0, generated(0, 0), {0: ran(0, ExecStatus.FAILED)})
    g.feedback(1, generated(0, over_budget={1: 4000}), {})
    assert g.episodes[1].end is EpisodeEnd.CONTEXT_BUDGET and g.episodes[1].steps == []
    assert g.episodes[0].end is None
    result = g.result("DONE", [], policy_version=3, aborted_reason="stopped")
    assert result.policy_versions == [0, 3]  # no step: the version the task ended at
    assert result.ends == [EpisodeEnd.STEP_BUDGET, EpisodeEnd.CONTEXT_BUDGET]
    assert result.aborted_reason == "stopped" and result.turns == 1


def test_workspace_steps_count_tool_calls_and_the_verdict_decides_the_reward() -> None:
    g = group(WORKSPACE, size=2)
    g.feedback(0, generated(1, 0, 1), {0: stepped(0, status=ExecStatus.TIMEOUT), 1: stepped(1)})
    g.feedback(1, generated(1, 0, 1), {0: stepped(0, submitted=True), 1: stepped(1)})
    first, second = g.episodes
    assert first.end is EpisodeEnd.SUBMITTED and second.end is None
    assert first.session is not None and first.session.session_id == "s0"
    assert first.steps[1].call == ToolCall(name="submit", arguments={})
    assert first.steps[0].reward is None and first.reward == 0.0  # no reward before DONE
    assert g.tool_calls() == 4 and g.resource_failures() == 1
    g.end_acting(EpisodeEnd.STEP_BUDGET)
    g.judge(
        [
            Verdict(sample=0, status=ExecStatus.PASSED, score=1.0, result=ref("v0")),
            Verdict(sample=1, status=ExecStatus.FAILED, score=0.5, result=ref("v1")),
        ]
    )
    assert (first.reward, first.solved, first.steps[-1].reward) == (1.0, True, 1.0)
    assert (second.reward, second.solved, second.steps[-1].reward) == (0.5, False, 0.5)
    assert second.verdict is not None and second.verdict.score == 0.5
    assert g.best_reward() == 1.0


def test_a_workspace_reward_is_measured_from_the_untouched_workspace() -> None:
    """Hidden asserts the bug does not touch pass in the untouched workspace (the workspace
    suite's averaged 0.34): an episode that did nothing earned that much, one that broke more
    than it fixed less than doing nothing."""
    g = group(WORKSPACE, size=4)
    g.judge(
        [
            Verdict(sample=s, status=status, score=score, result=ref(f"v{s}"))
            for s, (status, score) in enumerate(
                [
                    (ExecStatus.PASSED, 1.0),
                    (ExecStatus.FAILED, 0.75),
                    (ExecStatus.FAILED, 0.5),  # as untouched: nothing done
                    (ExecStatus.FAILED, 0.25),  # worse than untouched
                ]
            )
        ],
        untouched=0.5,
    )
    assert [e.reward for e in g.episodes] == [1.0, 0.5, 0.0, 0.0]
    assert [e.verdict.score for e in g.episodes if e.verdict] == [1.0, 0.75, 0.5, 0.25]
    assert REWARD.score([], verdict=0.6) == 0.6  # no baseline (histories from before)
    assert REWARD.score([], verdict=1.0, untouched=1.0) == 1.0  # nothing to fix: as verified


def test_a_verdict_for_an_episode_without_steps_sets_only_its_reward() -> None:
    g = group(WORKSPACE, size=1)
    g.judge([Verdict(sample=0, status=ExecStatus.FAILED, score=0.0, result=ref("v"))])
    assert g.episodes[0].reward == 0.0 and g.episodes[0].steps == []
    assert group(WORKSPACE, size=2).best_reward() == 0.0


def test_a_code_episode_its_context_cut_short_scores_its_turns_left_as_failed() -> None:
    """Three turns; every sample fails turn 0, sample 0's next prompt is over the context
    budget, the others fail turns 1 and 2. Before, sample 0 scored one failed round (-0.1)
    against the others' three (-0.3): the long failing turn that ended it earned a positive
    advantage. Now its turns left count as failed: all three score alike."""
    episodes = EpisodeGroup(
        AgentTaskInput(task=CODE, run_id="r", group_size=3, max_turns=3, reward=REWARD)
    )
    episodes.feedback(0, generated(0, 0, 1, 2), {s: ran(s, ExecStatus.FAILED) for s in range(3)})
    cut = generated(0, 1, 2, over_budget={0: 5000})
    episodes.feedback(1, cut, {s: ran(s, ExecStatus.FAILED) for s in (1, 2)})
    episodes.feedback(2, generated(0, 1, 2), {s: ran(s, ExecStatus.FAILED) for s in (1, 2)})
    first = episodes.episodes[0]
    assert first.end is EpisodeEnd.CONTEXT_BUDGET and len(first.steps) == 1
    assert [round(e.reward, 6) for e in episodes.episodes] == [-0.3, -0.3, -0.3]
