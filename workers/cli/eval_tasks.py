"""The tasks `tempered eval` evaluates: those a run recorded, or a suite's as it is today.

`recorded_tasks`: the held-out set a run's run.json names (`HeldoutSet`, written by
`prepare_run`), each task found in the suite by id and checked against its digest. A task gone
from the suite or changed under its id since is refused (ValueError: exit 2, before any task
starts), naming the tasks and `--current-tasks`: the figures would not be the run's. A task
quarantined since is evaluated, as the run evaluated it. `suite_tasks`: the split's tasks less
the quarantined ones, `spread` to `heldout_limit`, as a run's `load_tasks` and its workflow
choose them. Neither writes: `store_trees` puts a workspace suite's trees of the tasks taken in
the store, as `load_tasks` puts them (`infra.tasks.workspace_specs`), once every check of the
eval passed (stored before the sampling was checked, a refused eval left them behind);
without them (only a run stored them) an eval of a suite no run had loaded failed every task
at its reset. Which of the two an eval takes is evaluate.py's.
"""

from __future__ import annotations

from contracts.run import HeldoutSet, spread, task_digest
from contracts.task import TaskSpec
from infra.settings import Settings
from infra.storage import ObjectStore
from infra.tasks import is_workspace_suite, load_quarantine, load_suite, workspace_specs

SHOWN = 5
"""Task ids a message names at most (the rest counted)."""


def recorded_tasks(
    run: str, suite: str, recorded: HeldoutSet, settings: Settings
) -> tuple[list[TaskSpec], str]:
    """The tasks of `recorded` in its order, and a phrase saying which they are; ValueError
    for a suite that does not load, or where one of them is gone or changed since."""
    wanted = recorded.tasks

    def same(task: TaskSpec) -> bool:
        return wanted.get(task.id) == task_digest(task)

    today = {task.id: task for task in _load(suite)}
    gone = [task for task in wanted if task not in today]
    changed = [task for task in wanted if task in today and not same(today[task])]
    if gone or changed:
        parts = [f"changed since: {_listed(changed)}"] if changed else []
        parts += [f"gone: {_listed(gone)}"] if gone else []
        raise ValueError(
            f"{len(gone) + len(changed)} of the {len(wanted)} held-out tasks run {run!r} "
            f"recorded are not in suite {suite!r} as they were: {'; '.join(parts)}; so the "
            "run's figures cannot be reproduced and nothing was evaluated: pass "
            "--current-tasks to evaluate the held-out tasks the suite and its quarantine list "
            "give today instead"
        )
    about = f"the {len(wanted)} held-out tasks run {run!r} recorded, of {suite!r}"
    skip = load_quarantine(settings, suite)
    if quarantined := [task for task in wanted if task in skip]:
        about += (
            f"; {len(quarantined)} of them quarantined since ({_listed(quarantined)}), "
            "evaluated as the run did"
        )
    return [today[task] for task in wanted], about


def suite_tasks(
    suite: str, split: str, limit: int, settings: Settings
) -> tuple[list[TaskSpec], str]:
    """`limit` of the suite's tasks of `split` (`heldout`, `train` or `all`) not quarantined,
    `spread`, and a phrase saying how many of how many; ValueError for a suite that does not
    load or has none."""
    skip = load_quarantine(settings, suite)
    only = None if split == "all" else split

    def chosen(task: TaskSpec) -> bool:
        return task.id not in skip and (only is None or task.split == only)

    every = [task for task in _load(suite) if chosen(task)]
    if not every:
        raise ValueError(f"suite {suite!r} has no {split} tasks")
    tasks = spread(every, limit)
    return tasks, f"{len(tasks)} of {len(every)} {split} tasks of {suite!r}"


def store_trees(suite: str, tasks: list[TaskSpec], store: ObjectStore) -> None:
    """Put the trees of `tasks` (suite `suite`'s, workspace tasks) in the store, where their
    refs name them (content-addressed: a no-op for those stored before); nothing for a suite of
    code tasks. ValueError where one of them changed since it was loaded (its refs would name
    trees never stored)."""
    if not is_workspace_suite(suite):
        return
    wanted = {task.id: task_digest(task) for task in tasks}
    stored: set[str] = set()

    def keep(task: TaskSpec) -> bool:
        if wanted.get(task.id) != task_digest(task):
            return False
        stored.add(task.id)
        return True

    workspace_specs(suite, store.put_bytes, keep=keep)
    if changed := [task for task in wanted if task not in stored]:
        raise ValueError(
            f"{len(changed)} task(s) of suite {suite!r} changed while the evaluation began "
            f"({_listed(changed)}); nothing was evaluated: run it again"
        )


def _load(suite: str) -> list[TaskSpec]:
    """The suite's tasks (a workspace suite's specs only: nothing is stored)."""
    if is_workspace_suite(suite):
        return workspace_specs(suite)[0]
    return load_suite(suite)


def _listed(ids: list[str]) -> str:
    more = f" and {len(ids) - SHOWN} more" if len(ids) > SHOWN else ""
    return ", ".join(ids[:SHOWN]) + more
