"""`tempered eval` of a workspace suite puts the suite's trees in the store before any task starts.

Only the run's `load_tasks` activity uploaded them: an eval of `harbor:DIR` (or `workspace`,
`basics`) before any training run of it, or after a task was edited, failed every task at its
reset (`TreeError: no tree at workspaces/trees/...`). Real SeaweedFS; the tasks' workflows are
not started (Temporal is not reached): what they would read is checked where they would start.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from contracts.task import TaskSpec
from infra.storage import ObjectStore
from infra.tasks import load_suite
from tests.fixtures.cli_settings import cli_settings
from tests.paths import REPO_ROOT
from tests.workers.cli.eval_setup import agent_run, quarantine, tasks_never_start
from workers.cli import run

RUN = "rec"


def test_an_eval_of_a_harbor_suite_stores_its_trees_before_any_task_starts(
    store: ObjectStore,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    suite = Path(shutil.copytree(REPO_ROOT / "examples" / "harbor", tmp_path / "suite"))
    settings = cli_settings(tmp_path / "home", store)
    agent_run(store, RUN)  # its eval sampling fits workspace tasks
    every = load_suite(f"harbor:{suite}")
    quarantined = every[0]
    quarantine(settings, quarantined, suite=f"harbor:{suite}")
    missing: dict[str, list[str]] = {}

    def where_they_would(tasks: list[TaskSpec], version: int) -> None:
        for task in tasks:  # what each task's reset and verifier would read
            assert task.workspace is not None
            refs = (task.workspace.files, task.workspace.verifier)
            missing[task.id] = [ref.key for ref in refs if store.head(ref.key) != ref]

    tasks_never_start(monkeypatch, where_they_would)
    argv = ["eval", "--run", RUN, "--policy", "0", "--suite", f"harbor:{suite}", "--split", "all"]
    assert run([*argv, "--wait-for-workers"], settings) == 0, capsys.readouterr().err
    assert sorted(missing) == sorted(t.id for t in every if t.id != quarantined.id)
    assert all(not keys_ for keys_ in missing.values()), missing
    assert quarantined.workspace is not None  # not evaluated, so not uploaded
    assert store.head(quarantined.workspace.files.key) is None
