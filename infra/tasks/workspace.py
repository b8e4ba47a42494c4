"""The built-in `workspace` suite: mini-repositories with a bug to fix, for agent episodes.

Twelve families (`workspace_families_text.py`, `workspace_families_data.py`) × 5 seeded
instances: instances 0-3 are `train`, instance 4 `heldout` (48 / 12 tasks), whose fixed module
is no earlier instance's (`fixed_by`, `infra/tasks/seeded.py`). Each task is a
directory of three or four files, the module with its bug (or a missing function), README.md
stating the behaviour, example tests the agent may run (`python3 test_<module>.py`) and, for
one family, a helper module; hidden tests check more calls through the two-process verifier.
The reference solution (`solve.sh`) writes the fixed module; `tempered tasks validate
workspace` runs it 5 times per task and checks that the untouched workspace fails.

    from infra.tasks.workspace import workspace_tasks
    tasks = workspace_tasks()        # 60 WorkspaceTasks, identical on every call and machine
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from functools import cache

from infra.tasks.seeded import Split, seeded
from infra.tasks.workspace_families_data import FAMILIES as DATA_FAMILIES
from infra.tasks.workspace_families_text import FAMILIES as TEXT_FAMILIES
from infra.tasks.workspace_repo import SUITE, Repo, render
from infra.tasks.workspace_task import WorkspaceTask

FAMILIES = {**TEXT_FAMILIES, **DATA_FAMILIES}
TRAIN_PER_FAMILY = 4
HELDOUT_PER_FAMILY = 1


def fixed_by(repo: Repo) -> tuple[str, str]:
    """What solves an instance (its module and the fixed text): no held-out task may share it
    with a training one (`seeded`)."""
    return repo.module, repo.fixed


def repos() -> Iterator[tuple[str, Repo, Split, random.Random]]:
    """(task id, instance, split, the stream its hidden asserts' order is drawn from next), in
    the suite's order: what `workspace_tasks` renders."""
    return seeded(SUITE, FAMILIES, train=TRAIN_PER_FAMILY, heldout=HELDOUT_PER_FAMILY, key=fixed_by)


@cache
def workspace_tasks() -> tuple[WorkspaceTask, ...]:
    """Every task of the suite, train first within each family."""
    return tuple(render(repo, task_id, split, rng) for task_id, repo, split, rng in repos())
