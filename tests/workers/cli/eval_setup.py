"""The set-ups the `tempered eval` tests share: a run recorded as a training run records it, the
command run with the task workers in this process (real Temporal dev server, SeaweedFS, sandbox
and trajectory writer; only the model is scripted, recording what it was asked), and a stand-in
for the tasks' workflows where a test checks what they would read before they start.

`settings` is a fixture: a test module imports it as `settings as settings`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from activities.rewards import RewardActivities
from activities.sandbox import SandboxActivities
from contracts.learner import PolicyManifest, PolicyVersion
from contracts.names import Queue
from contracts.rollout import AgentTaskResult, GenerateRequest
from contracts.run import TrainingRunInput
from contracts.task import SamplingParams, SandboxLimits, TaskSpec
from infra import keys
from infra.presets import load_preset
from infra.settings import Settings
from infra.storage import ObjectStore
from infra.tasks import quarantine_path
from tests.fixtures.cli_settings import cli_settings, dev_temporal
from tests.fixtures.temporal import TemporalServer
from tests.workflows.harness import ScriptedModel, connect, running_workers
from workers.cli import evaluate, run
from workflows.agent_task import AgentTaskWorkflow

Capture = pytest.CaptureFixture[str]
RUN = "rec"


@pytest.fixture
def settings(
    temporal_server: TemporalServer, namespace: str, store: ObjectStore, tmp_path: Path
) -> Settings:
    """The command's settings: the test's bucket and dev-server namespace, home `tmp_path/home`."""
    return cli_settings(tmp_path / "home", store, temporal=dev_temporal(temporal_server, namespace))


def wrong(sample: int, turn: int) -> str:
    return "def nothing():\n    return None\n"  # fails every task: a second turn where allowed


def workers(settings: Settings, store: ObjectStore, model: ScriptedModel) -> dict[Any, Any]:
    return {
        Queue.AGENT_TASKS: {"workflows": [AgentTaskWorkflow]},
        Queue.INFERENCE: {"activities": [model.generate]},
        Queue.SANDBOX: {"activities": [SandboxActivities(settings, store).execute]},
        Queue.REWARDS: {"activities": [RewardActivities(store).write_trajectories]},
    }


def publish_v0(store: ObjectStore, run_id: str) -> None:
    """Version 0 of `run_id`, its manifest naming no files (no test's model reads them)."""
    policy = PolicyVersion(run_id=run_id, version=0, prefix=keys.policy_prefix(run_id, 0), step=0)
    store.put_json(keys.policy_manifest_key(run_id, 0), PolicyManifest(policy=policy, files={}))


def agent_run(store: ObjectStore, run_id: str) -> None:
    """Version 0 of run `run_id` (its files are never read: no task runs), and its run.json: an
    `agent` run's, whose eval sampling fits workspace tasks and not code tasks
    (`test_eval_sampling_fit.py`)."""
    store.put_json(
        keys.run_record_key(run_id), load_preset("agent").model_copy(update={"run_id": run_id})
    )
    publish_v0(store, run_id)


def recorded_run(store: ObjectStore) -> TrainingRunInput:
    """A run whose evaluation settings are all unlike `tempered eval`'s own defaults, its input
    stored as the run stores it, and a version 0 (the scripted model never reads its files)."""
    spec = TrainingRunInput(
        run_id=RUN,
        suite="starter",
        max_turns=3,
        eval_max_turns=2,
        max_context_tokens=2048,
        heldout_limit=4,
        eval_sampling=SamplingParams(temperature=0.0, max_new_tokens=128, priority=1),
        limits=SandboxLimits(timeout_s=7.0),
    )
    store.put_json(keys.run_record_key(RUN), spec)
    publish_v0(store, RUN)
    return spec


async def evaluate_with(
    settings: Settings, store: ObjectStore, argv: list[str], capsys: Capture
) -> tuple[int, list[GenerateRequest], str, str]:
    """`tempered eval ARGV` with the workers running: (exit code, the model's requests, stdout,
    stderr)."""
    model = ScriptedModel(store, wrong)
    client = await connect(settings.temporal.address, settings.temporal.namespace)
    async with running_workers(client, workers(settings, store, model)):
        code = await asyncio.to_thread(run, ["eval", *argv, "--wait-for-workers"], settings)
    captured = capsys.readouterr()
    return code, model.calls, captured.out, captured.err


def quarantine(settings: Settings, *tasks: TaskSpec, suite: str = "starter") -> None:
    """What `tempered tasks validate SUITE` leaves for tasks it found broken."""
    path = quarantine_path(settings, suite)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"quarantined": [task.id for task in tasks]}))


def task_ids(calls: Sequence[GenerateRequest]) -> set[str]:
    return {call.task_id for call in calls}


def tasks_never_start(
    monkeypatch: pytest.MonkeyPatch, where_they_would: Callable[[list[TaskSpec], int], None]
) -> None:
    """`tempered eval` with no task's workflow started (Temporal is not reached):
    `where_they_would(tasks, version)` runs where the tasks would start, and each task ends
    DONE, unsolved, in one turn."""

    async def evaluate_(*given: Any) -> list[AgentTaskResult]:
        """`_evaluate(settings, args, spec, tasks, eval_run, version)` starting no workflow."""
        tasks, eval_run, version = given[3:]
        where_they_would(tasks, version)
        return [
            AgentTaskResult(
                run_id=eval_run, task_id=task.id, state="DONE", turns=1, rewards=[0.0],
                solved=[False], best_reward=0.0, policy_versions=[version], trajectories=[],
            )
            for task in tasks
        ]  # fmt: skip

    monkeypatch.setattr(evaluate, "_evaluate", evaluate_)
