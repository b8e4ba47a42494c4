"""The control plane stays bounded: a training run of many tasks through the real
`TrainingRunWorkflow` and `LearnerWorkflow` (and the real ledger activities on a real S3) on the
time-skipping test server, with scripted tasks, suite and train step
(tests/workflows/control_plane.py).

    test_small_run_stays_in_a_tiny_budget     300 tasks, a 600-event or a 128 KiB budget:
                                              many continues-as-new of both workflows
                                              (make test)
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
from dataclasses import dataclass
from pathlib import Path

import pytest
from temporalio.api.history.v1 import History
from temporalio.client import Client

from contracts.learner import GRPOConfig, HistoryBudget, LedgerSegment
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

EVENT_LIMIT, BYTE_LIMIT = 51_200, 50 * 1024 * 1024
"""Temporal's hard limits on one run's history."""


@dataclass
class Chain:
    """Every run of one workflow id, first to last: (events, bytes) of each history."""

    workflow_id: str
    runs: list[tuple[int, int]]

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
        workflow_id, [(len(h.events), History(events=h.events).ByteSize()) for h in histories]
    )


async def run_at_scale(
    store: ObjectStore,
    run_input: TrainingRunInput,
    train_tasks: int,
    agent_task: type[StandInAgentTask] = StandInAgentTask,
) -> tuple[TrainingRunResult, ScriptedTrainer, list[Chain], float]:
    suite, trainer = ScriptedSuite(train=train_tasks, heldout=2), ScriptedTrainer()
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
