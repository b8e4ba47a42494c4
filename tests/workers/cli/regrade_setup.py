"""The set-ups the `tempered regrade` tests share: the command's settings on the local sandbox
backend, a trajectory solved by its task's canonical solution, and the command's help text.

`settings` is a fixture: a test module imports it as `settings as settings`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from contracts.sandbox import ExecStatus
from contracts.task import TaskSpec
from contracts.trajectory import Trajectory
from infra.settings import SandboxSettings, Settings
from infra.storage import ObjectStore
from tests.fixtures.cli_settings import cli_settings
from tests.trajectories import Step, trajectory
from workers.cli import build_parser


@pytest.fixture
def settings(store: ObjectStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The test's bucket, home `tmp_path`, the local sandbox backend (the test is skipped where it
    is not written) running one program at a time (the trajectories are graded in the order
    they are read), and a terminal 200 columns wide (the table's cells whole)."""
    pytest.importorskip("infra.sandbox.local", reason="local sandbox backend not written yet")
    monkeypatch.setenv("COLUMNS", "200")
    return cli_settings(tmp_path, store, sandbox=SandboxSettings(concurrency=1))


def solved_trajectory(task: TaskSpec, run_id: str) -> Trajectory:
    """A one-step trajectory of `task` solved by its canonical solution, as a run stores it."""
    assert task.canonical_solution
    return trajectory(
        [Step([1], [2], code=task.canonical_solution, status=ExecStatus.PASSED)],
        reward=1.0,
        run_id=run_id,
        task_id=task.id,
        sample=0,
        group_size=1,
        solved=True,
        prompt=task.prompt,
    )


def regrade_help() -> str:
    """`tempered regrade --help`'s text, its whitespace folded."""
    (regrade,) = [
        parser
        for action in build_parser()._subparsers._group_actions  # type: ignore[union-attr]
        for name, parser in getattr(action, "choices", {}).items()
        if name == "regrade"
    ]
    return " ".join(regrade.format_help().split())
