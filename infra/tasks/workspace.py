"""The built-in `workspace` suite: mini-repositories with a bug to fix, for agent episodes.

Twelve families (`workspace_families_text.py`, `workspace_families_data.py`) × 5 seeded
instances: instances 0-3 are `train`, instance 4 `heldout` (48 / 12 tasks). Each task is a
directory of three or four files, the module with its bug (or a missing function), README.md
stating the behaviour, example tests the agent may run (`python3 test_<module>.py`) and, for
one family, a helper module; hidden tests check more calls through the two-process verifier.
The reference solution (`solve.sh`) writes the fixed module; `tempered tasks validate
workspace` runs it 5 times per task and checks that the untouched workspace fails.

    from infra.tasks.workspace import workspace_tasks
    tasks = workspace_tasks()        # 60 WorkspaceTasks, identical on every call and machine
"""

from __future__ import annotations

from functools import cache

from infra.tasks.seeded import seeded
from infra.tasks.workspace_families_data import FAMILIES as DATA_FAMILIES
from infra.tasks.workspace_families_text import FAMILIES as TEXT_FAMILIES
from infra.tasks.workspace_repo import SUITE, render
from infra.tasks.workspace_task import WorkspaceTask

FAMILIES = {**TEXT_FAMILIES, **DATA_FAMILIES}
INSTANCES_PER_FAMILY = 5
TRAIN_PER_FAMILY = 4


@cache
def workspace_tasks() -> tuple[WorkspaceTask, ...]:
    """Every task of the suite, train first within each family."""
    instances = seeded(SUITE, FAMILIES, per_family=INSTANCES_PER_FAMILY, train=TRAIN_PER_FAMILY)
    return tuple(render(repo, task_id, split, rng) for task_id, repo, split, rng in instances)
