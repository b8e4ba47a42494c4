"""The control plane stays bounded: a training run of many tasks through the real
`TrainingRunWorkflow` and `LearnerWorkflow` (and the real ledger activities on a real S3) on the
time-skipping test server, with scripted tasks, suite and train step
(tests/workflows/control_plane.py).

    test_small_run_stays_in_a_tiny_budget     300 tasks, a 600-event or a 128 KiB budget:
                                              many continues-as-new of both workflows
                                              (make test)
    test_a_runs_ending_fits_its_byte_budget   a run whose learner's state is large, 176 KiB
    test_a_learners_ending_fits_its_byte_budget
                                              a learner with a large state, 64 KiB
    test_20000_tasks_stay_in_a_fifth_of_the_limits
                                              20,000 tasks, the default budget (20% of
                                              Temporal's 51,200 events / 50 MiB); slow
    test_10000_agent_tasks_in_flight          bench/concurrency.py at 10,000 real agent-task
                                              workflows in flight on the dev server; slow

Both check every run of both workflows against the budget, and that every task was started,
finished and trained on exactly once (the scripted trainer's record and the learner's ledger
agree). The 20,000-task figures are printed and merged into bench/results.json ("scale").
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from temporalio import workflow
from temporalio.api.history.v1 import History
from temporalio.client import Client
from temporalio.common import RawValue
from temporalio.worker import Worker

from contracts.common import ObjectRef
from contracts.learner import (
    GRPOConfig,
    HistoryBudget,
    LearnerInput,
    LedgerSegment,
    PolicyVersion,
    TrainStepResponse,
    TrajectoryGroup,
)
from contracts.names import Queue
from contracts.run import TrainingRunInput, TrainingRunResult
from infra import keys
from infra.storage import ObjectStore
from tests.accounting import record_results
from tests.fixtures.temporal import time_skipping_server
from tests.paths import REPO_ROOT
from tests.workflows.control_plane import (
    ScriptedSuite,
    ScriptedTrainer,
    SecondsAgentTask,
    StandInAgentTask,
    control_plane,
    run_histories,
)
from workers.training import start_run
from workflows.learner import LearnerWorkflow

EVENT_LIMIT, BYTE_LIMIT = 51_200, 50 * 1024 * 1024
"""Temporal's hard limits on one run's history."""


@dataclass
class Chain:
    """Every run of one workflow id, first to last: (events, bytes) of each history, and the
    children each started."""

    workflow_id: str
    runs: list[tuple[int, int]]
    children: list[int]

    @property
    def max_events(self) -> int:
        return max(events for events, _ in self.runs)

    @property
    def max_bytes(self) -> int:
        return max(size for _, size in self.runs)


async def chain(client: Client, workflow_id: str) -> Chain:
    """Every run of `workflow_id`, sized."""
    histories = await run_histories(client, workflow_id)
    return Chain(
        workflow_id,
        [(len(h.events), History(events=h.events).ByteSize()) for h in histories],
        [
            sum(
                e.HasField("start_child_workflow_execution_initiated_event_attributes")
                for e in h.events
            )
            for h in histories
        ],
    )


async def run_at_scale(
    store: ObjectStore,
    run_input: TrainingRunInput,
    train_tasks: int,
    agent_task: type[StandInAgentTask] = StandInAgentTask,
    trainer: ScriptedTrainer | None = None,
) -> tuple[TrainingRunResult, ScriptedTrainer, list[Chain], float]:
    suite, trainer = ScriptedSuite(train=train_tasks, heldout=2), trainer or ScriptedTrainer()
    async with (
        time_skipping_server() as env,
        control_plane(env.client, store, suite, trainer, agent_task=agent_task),
    ):
        started = time.monotonic()
        handle = await start_run(env.client, run_input)
        result: TrainingRunResult = await handle.result()
        wall_s = time.monotonic() - started
        chains = [
            await chain(env.client, workflow_id)
            for workflow_id in (handle.id, f"{handle.id}-learner")
        ]
    return result, trainer, chains, wall_s


def check_accounting(
    result: TrainingRunResult,
    trainer: ScriptedTrainer,
    store: ObjectStore,
    run_input: TrainingRunInput,
    train_tasks: int,
) -> None:
    total = run_input.steps * run_input.grpo.groups_per_step
    assert result.tasks_started == result.tasks_done == total
    assert result.steps == run_input.steps
    trained = Counter(trainer.trained())
    assert max(trained.values()) == 1, f"trained twice: {[t for t, n in trained.items() if n > 1]}"
    assert len(trained) == total, f"{total - len(trained)} tasks never trained on"
    # epoch e of the suite is its tasks (in the run's shuffled order) named `<id>-e<e>`
    suite = {f"train-{i}" for i in range(train_tasks)}
    epochs = Counter(int(t.rsplit("-e", 1)[1]) for t in trained)
    full, rest = divmod(total, train_tasks)
    assert epochs == Counter({e: train_tasks for e in range(full)} | ({full: rest} if rest else {}))
    assert {t.rsplit("-e", 1)[0] for t in trained} == suite
    prefix = keys.learner_ledger_prefix(run_input.run_id)
    segments = [store.get_model(k, LedgerSegment) for k in store.list_keys(prefix)]
    in_ledger = [task for s in segments for task in s.consumed]
    assert sorted(in_ledger) == sorted(trained), "the ledger disagrees with what was trained"
    assert [(s.first_step, s.next_step) for s in segments] == list(
        zip(
            [0] + [s.next_step for s in segments[:-1]], [s.next_step for s in segments], strict=True
        )
    ), "ledger segments leave a gap or overlap"


@pytest.mark.parametrize(
    "budget",
    [
        pytest.param(HistoryBudget(events=600, bytes=256 * 1024), id="events"),
        # the bytes bind: a segment's look-ahead must count the tails its next input carries,
        # grown since it started (without that, one segment reached 132,341 bytes of these)
        pytest.param(HistoryBudget(events=10_000, bytes=128 * 1024), id="bytes"),
    ],
)
@pytest.mark.asyncio
async def test_small_run_stays_in_a_tiny_budget(store: ObjectStore, budget: HistoryBudget) -> None:
    run_input = TrainingRunInput(
        run_id="scale-small",
        steps=75,
        group_size=2,
        concurrency=16,
        eval_every=25,
        grpo=GRPOConfig(groups_per_step=4, max_staleness=2),
        budget=budget,
    )
    result, trainer, chains, _ = await run_at_scale(store, run_input, train_tasks=40)
    check_accounting(result, trainer, store, run_input, train_tasks=40)
    run, learner = chains
    assert len(run.runs) > 3 and len(learner.runs) > 3, "neither continued as new often"
    for c in chains:
        assert c.max_events <= budget.events, f"{c.workflow_id}: {c.runs}"
        assert c.max_bytes <= budget.bytes, f"{c.workflow_id}: {c.runs}"
    assert [e.policy_version for e in result.evals] == [0, 25, 50, 75]


@pytest.mark.asyncio
async def test_a_runs_ending_fits_its_byte_budget(store: ObjectStore) -> None:
    """A run's ending receives its learner's state (the last step records) up to three times:
    in `learner_done`, in the learner's completion as its child, and in its own result. With
    records of ~850 bytes, 30 steps of one group and 176 KiB, the run fits in one segment but
    for its ending: counted once at 1 KiB a step, the ending ran to about 201,000 bytes in one
    segment (3 of 3 runs); counted as reported by the learner (`state_bytes`), once a copy, the
    run continues as new before it (not earlier: its second segment starts the final
    evaluation's 2 tasks only) and both segments fit (about 129,000 and 74,000 bytes)."""
    budget, steps = HistoryBudget(events=10_000, bytes=176 * 1024), 30
    run_input = TrainingRunInput(
        run_id="scale-ending",
        steps=steps,
        group_size=2,
        concurrency=2,
        grpo=GRPOConfig(groups_per_step=1, max_staleness=2),
        budget=budget,
    )
    trainer = ScriptedTrainer(padding=600)
    result, trainer, chains, _ = await run_at_scale(store, run_input, steps, trainer=trainer)
    check_accounting(result, trainer, store, run_input, train_tasks=steps)
    run, learner = chains
    assert len(run.runs) == 2, run.runs
    assert run.children[1] == 2, "it continued as new before its ending: the final evaluation only"
    for c in chains:
        assert c.max_bytes <= budget.bytes, f"{c.workflow_id}: {c.runs}"


@workflow.defn(name="SignalSink", sandboxed=False)
class SignalSink:
    """A learner's parent that takes every signal and never ends (the server goes with the test)."""

    @workflow.run
    async def run(self) -> None:
        await workflow.wait_condition(lambda: False)

    @workflow.signal(dynamic=True)
    def any_signal(self, name: str, args: Sequence[RawValue]) -> None:
        pass


@pytest.mark.asyncio
async def test_a_learners_ending_fits_its_byte_budget(store: ObjectStore) -> None:
    """A learner's ending carries its state twice, in `learner_done` and in its result: with a
    large state (24 step records of ~720 bytes carried in, 5 steps, every group pending from the
    start, so the history is the same every run) the ending does not fit beside 5 steps, and it
    must continue as new before its last step. Without the ending in its look-ahead it ran to
    69,045 bytes of 65,536 in one segment; with it, about 47,000 and 63,000 in two."""
    budget, steps = HistoryBudget(bytes=64 * 1024), 5
    record = TrainStepResponse(
        policy=PolicyVersion(run_id="ending", version=0, prefix="p/0"),
        loss=0.0,
        trained=1,
        ack=ObjectRef(key="ack/" + "x" * 400, size=1, sha256="0" * 64),
    )
    ref = ObjectRef(key="trajectories/t", size=1, sha256="0" * 64)
    learner_input = LearnerInput(
        run_id="ending",
        config=GRPOConfig(groups_per_step=1),
        max_steps=steps,
        pending=[
            TrajectoryGroup(task_id=f"t{i}", trajectories=[ref], rewards=[1.0], policy_version=0)
            for i in range(steps)
        ],
        history=[record] * 24,
        parent_workflow_id="ending-parent",
        budget=budget,
        burst=1,
    )
    trainer = ScriptedTrainer()
    async with (
        time_skipping_server() as env,
        control_plane(env.client, store, ScriptedSuite(train=1, heldout=0), trainer),
        Worker(env.client, task_queue="sink", workflows=[SignalSink]),
    ):
        await env.client.start_workflow(SignalSink.run, id="ending-parent", task_queue="sink")
        handle = await env.client.start_workflow(
            LearnerWorkflow.run, learner_input, id="ending-learner", task_queue=Queue.AGENT_TASKS
        )
        final: LearnerInput = await handle.result()
        learner = await chain(env.client, handle.id)
    assert final.step == steps and sorted(trainer.trained()) == [f"t{i}" for i in range(steps)]
    assert len(learner.runs) == 2, learner.runs
    assert learner.max_bytes <= budget.bytes, learner.runs


@pytest.mark.slow
@pytest.mark.timeout(7200)
@pytest.mark.asyncio
async def test_20000_tasks_stay_in_a_fifth_of_the_limits(store: ObjectStore) -> None:
    budget = HistoryBudget()  # 20% of each limit
    run_input = TrainingRunInput(
        run_id="scale-20000",
        steps=1250,
        group_size=4,
        concurrency=64,
        eval_every=125,
        grpo=GRPOConfig(groups_per_step=16, max_staleness=4),
    )
    # at the pace its recorded figures (bench/results.json) were measured at
    result, trainer, chains, wall_s = await run_at_scale(
        store, run_input, train_tasks=50, agent_task=SecondsAgentTask
    )
    check_accounting(result, trainer, store, run_input, train_tasks=50)
    figures = {
        "tasks": result.tasks_done,
        "learner_steps": result.steps,
        "concurrency": run_input.concurrency,
        "wall_s": round(wall_s, 1),
        "budget": budget.model_dump(),
        **{
            name: {
                "runs": len(c.runs),
                "max_events": c.max_events,
                "max_bytes": c.max_bytes,
                "max_fraction_of_event_limit": round(c.max_events / EVENT_LIMIT, 3),
                "max_fraction_of_size_limit": round(c.max_bytes / BYTE_LIMIT, 3),
            }
            for name, c in zip(("training_run", "learner"), chains, strict=True)
        },
    }
    print(f"\n[scale] {figures}")
    record_results("scale", figures)
    for c in chains:
        assert c.max_events <= budget.events, f"{c.workflow_id}: {c.runs}"
        assert c.max_bytes <= budget.bytes, f"{c.workflow_id}: {c.runs}"


@pytest.mark.slow
@pytest.mark.timeout(7200)
def test_10000_agent_tasks_in_flight(tmp_path: Path) -> None:
    """bench/concurrency.py at 10,000: every task in flight at once, then every one done."""
    out = tmp_path / "concurrency.json"
    done = subprocess.run(
        [
            sys.executable,
            str(REPO_ROOT / "bench" / "concurrency.py"),
            "--levels",
            "10000",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=7000,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (level,) = json.loads(out.read_text())["levels"]
    print(f"\n[concurrency] {level}")
    assert level["in_flight"] == 10_000 and level["completion_per_s"] > 0
