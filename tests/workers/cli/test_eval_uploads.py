"""`tempered eval` of a workspace suite puts the suite's trees in the store before any task starts.

Only the run's `load_tasks` activity uploaded them: an eval of `harbor:DIR` (or `workspace`,
`basics`) before any training run of it, or after a task was edited, failed every task at its
reset (`TreeError: no tree at workspaces/trees/...`). Real SeaweedFS; the tasks' workflows are
not started (Temporal is not reached): what they would read is checked where they would start.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import pytest

from contracts.learner import PolicyManifest, PolicyVersion
from contracts.rollout import AgentTaskResult
from contracts.run import TrainingRunInput
from contracts.task import TaskSpec
from infra import keys
from infra.presets import load_preset
from infra.settings import Settings
from infra.storage import ObjectStore
from infra.tasks import load_suite, quarantine_path
from tests.paths import REPO_ROOT
from workers.cli import evaluate, run

RUN = "rec"


def published_version(store: ObjectStore) -> None:
    """Version 0 of run `RUN` (its files are never read: no task runs), and its run.json: an
    `agent` run's, whose eval sampling fits workspace tasks (`tempered eval`'s own settings
    stop at a code block: refused on a workspace suite, `test_eval_sampling_fit.py`)."""
    store.put_json(
        keys.run_record_key(RUN), load_preset("agent").model_copy(update={"run_id": RUN})
    )
    policy = PolicyVersion(run_id=RUN, version=0, prefix=keys.policy_prefix(RUN, 0), step=0)
    store.put_json(keys.policy_manifest_key(RUN, 0), PolicyManifest(policy=policy, files={}))


def test_an_eval_of_a_harbor_suite_stores_its_trees_before_any_task_starts(
    store: ObjectStore,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    suite = Path(shutil.copytree(REPO_ROOT / "examples" / "harbor", tmp_path / "suite"))
    settings = Settings(
        home=tmp_path / "home", s3=store.settings.model_copy(update={"bucket": store.bucket})
    )
    published_version(store)
    every = load_suite(f"harbor:{suite}")
    quarantined = every[0]
    quarantine_path(settings, f"harbor:{suite}").parent.mkdir(parents=True)
    quarantine_path(settings, f"harbor:{suite}").write_text(
        f'{{"quarantined": ["{quarantined.id}"]}}'
    )
    missing: dict[str, list[str]] = {}

    async def evaluate_(
        settings: Settings,
        args: argparse.Namespace,
        spec: TrainingRunInput,
        tasks: list[TaskSpec],
        eval_run: str,
        version: int,
    ) -> list[AgentTaskResult]:
        for task in tasks:  # what each task's reset and verifier would read
            assert task.workspace is not None
            refs = (task.workspace.files, task.workspace.verifier)
            missing[task.id] = [ref.key for ref in refs if store.head(ref.key) != ref]
        return [
            AgentTaskResult(
                run_id=eval_run, task_id=task.id, state="DONE", turns=1, rewards=[0.0],
                solved=[False], best_reward=0.0, policy_versions=[version], trajectories=[],
            )
            for task in tasks
        ]  # fmt: skip

    monkeypatch.setattr(evaluate, "_evaluate", evaluate_)
    argv = ["eval", "--run", RUN, "--policy", "0", "--suite", f"harbor:{suite}", "--split", "all"]
    assert run([*argv, "--wait-for-workers"], settings) == 0, capsys.readouterr().err
    assert sorted(missing) == sorted(t.id for t in every if t.id != quarantined.id)
    assert all(not keys_ for keys_ in missing.values()), missing
    assert quarantined.workspace is not None  # not evaluated, so not uploaded
    assert store.head(quarantined.workspace.files.key) is None
