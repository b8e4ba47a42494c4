"""The built-in `workspace` suite: mini-repositories with a bug to fix, for agent episodes.

Twelve families (`workspace_families_text.py`, `workspace_families_data.py`): instances 0-3 are
`train`, instance 4 of nine of them `heldout` (48 / 9 tasks: `HELDOUT`), one that no training
task's fix passes (`same_fix`, `infra/tasks/seeded.py`). Each task is a
directory of three or four files, the module with its bug (or a missing function), README.md
stating the behaviour, example tests the agent may run (`python3 test_<module>.py`) and, for
one family, a helper module; hidden tests check more calls through the two-process verifier.
The reference solution (`solve.sh`) writes the fixed module; `tempered tasks validate
workspace` runs it 5 times per task and checks that the untouched workspace fails.

    from infra.tasks.workspace import workspace_tasks
    tasks = workspace_tasks()        # 57 WorkspaceTasks, identical on every call and machine
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from functools import cache

from infra.tasks.seeded import Split, seeded
from infra.tasks.workspace_families_data import FAMILIES as DATA_FAMILIES
from infra.tasks.workspace_families_text import FAMILIES as TEXT_FAMILIES
from infra.tasks.workspace_repo import SUITE, Repo, reference_results, render
from infra.tasks.workspace_task import WorkspaceTask

FAMILIES = {**TEXT_FAMILIES, **DATA_FAMILIES}
TRAIN_PER_FAMILY = 4
HELDOUT = {family: 1 for family in FAMILIES if family not in ("rle", "versions", "game")}
"""One held-out instance per family, but for the three whose instances all share one behaviour
(run-length encoding, version order, a game's rules: any training task's fix passes them)."""


def same_fix(earlier: Repo, new: Repo) -> bool:
    """Whether `earlier`'s fixed module gives `new`'s answers on all `new`'s calls (so recalling
    that fix would pass `new`'s tests): no held-out task may (`seeded`)."""
    calls = [*new.visible, *new.hidden]
    try:
        theirs = reference_results(earlier.fixed, earlier.module, calls, new.extra)
        return bool(theirs == reference_results(new.fixed, new.module, calls, new.extra))
    except Exception:  # noqa: BLE001 - our own code, on calls of another instance: no match
        return False


def repos() -> Iterator[tuple[str, Repo, Split, random.Random]]:
    """(task id, instance, split, the stream its hidden asserts' order is drawn from next), in
    the suite's order: what `workspace_tasks` renders."""
    return seeded(SUITE, FAMILIES, train=TRAIN_PER_FAMILY, heldout=HELDOUT, clashes=same_fix)


@cache
def workspace_tasks() -> tuple[WorkspaceTask, ...]:
    """Every task of the suite, train first within each family."""
    return tuple(render(repo, task_id, split, rng) for task_id, repo, split, rng in repos())
