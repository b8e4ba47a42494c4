"""`tempered tasks validate` on Harbor tasks whose check the review found wrongly judged.

- A task whose untouched workspace makes verification raise the task's error (a script that
  exits 0 writing no reward): validate called it clean, and training then failed the run on
  the first tree like it. Its untouched run is fatal and the task broken.
- A task whose script exits non-zero on its reference solution (with a reward of 1): a reward
  counts only from a script that exits 0, so the task is broken, saying so.
- `set -e; test …; echo 1 > reward.txt`: the untouched workspace exits 1 without a reward,
  which Harbor's verifier fails on too (it scored 0 and was called clean, and so was a script
  whose interpreter is missing): the task is broken, its untouched run fatal.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from infra.environments.mounts import remove_tree
from infra.settings import SandboxSettings, Settings, WorkspaceSettings
from infra.tasks.validate import CheckPlan
from infra.tasks.workspace_validate import validate_workspace_suite
from tests.infra.environments.conftest import needs_root, session_root

REWARD = "/logs/verifier/reward.txt"
TESTS = {
    "no-reward-untouched": f'if [ "$(cat /app/out.txt)" = ok ]; then echo 1 > {REWARD}; fi\n',
    "exit-1-on-solution": f"echo 1 > {REWARD}\nexit 1\n",
    "set-e": f'set -e\ntest "$(cat /app/out.txt)" = ok\necho 1 > {REWARD}\n',
}


def harbor_task(root: Path, name: str, test: str) -> None:
    for folder in ("environment", "solution", "tests"):
        (root / name / folder).mkdir(parents=True)
    (root / name / "task.toml").write_text("[verifier]\ntimeout_sec = 30.0\n")
    (root / name / "instruction.md").write_text("Write ok to /app/out.txt.\n")
    (root / name / "environment" / "Dockerfile").write_text(
        "FROM ubuntu:24.04\nWORKDIR /app\nCOPY seed.txt /app/seed.txt\n"
    )
    (root / name / "environment" / "seed.txt").write_text("seed\n")
    (root / name / "solution" / "solve.sh").write_text("#!/bin/bash\necho ok > /app/out.txt\n")
    (root / name / "tests" / "test.sh").write_text(f"#!/bin/bash\n{test}")


@needs_root
def test_validate_breaks_tasks_training_would_fail_on_or_no_solution_passes(
    tmp_path: Path,
) -> None:
    for name, test in TESTS.items():
        harbor_task(tmp_path, name, test)
    root = session_root()
    settings = Settings(sandbox=SandboxSettings(workspaces=WorkspaceSettings(root=root)))
    try:
        report = asyncio.run(
            validate_workspace_suite(settings, f"harbor:{tmp_path}", CheckPlan(1, 3))
        )
    finally:
        remove_tree(root)
    checks = {task.task_id: task for task in report.tasks}
    assert {name: check.verdict for name, check in checks.items()} == {
        "no-reward-untouched": "broken",
        "exit-1-on-solution": "broken",
        "set-e": "broken",
    }
    untouched = checks["no-reward-untouched"].wrong
    assert untouched is not None and untouched.fatal, untouched
    assert untouched.detail.startswith("the untouched workspace: ") and untouched.detail.endswith(
        "; training would fail on it"
    ), untouched.detail
    assert "wrote no reward" in untouched.detail
    (solved,) = checks["exit-1-on-solution"].canonical
    assert "exited 1: a reward counts only from a script that exits 0" in solved.detail, solved
    set_e = checks["set-e"].wrong
    assert set_e is not None and set_e.fatal, set_e
    assert "tests/test.sh exited 1 and wrote no reward" in set_e.detail, set_e.detail
