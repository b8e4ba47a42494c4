"""The built-in `starter` suite: small, procedurally generated Python function tasks.

Twenty task families (see `infra/tasks/starter_families.py`), from trivial (add a constant) to
moderate (fizzbuzz with custom words, running maxima, deduplication). Each family yields 10
seeded instances whose constants, function names and test values differ; instances 0-5 are
`train`, 6-9 are `heldout` (120 / 80 tasks: one held-out task is 1.25 points). Held-out tasks are therefore *new instances of
the families seen in training*, which is what lets a ~135M-parameter policy measurably improve
its held-out pass@1 from a few minutes of GRPO.

Tests are derived from the canonical solution itself (its outputs on the instance's inputs),
so canonical and tests cannot disagree; the family's `wrong_body` is a plausible mistake that
the unit tests and `tempered tasks validate starter` prove the tests reject.

    from infra.tasks.starter import starter_tasks
    tasks = starter_tasks()          # 200 TaskSpecs, identical on every call and machine
"""

from __future__ import annotations

from functools import cache
from typing import Any

from contracts.task import TaskSpec
from infra.tasks.seeded import seeded
from infra.tasks.starter_families import FAMILIES, Instance

SUITE = "starter"
INSTANCES_PER_FAMILY = 10
TRAIN_PER_FAMILY = 6
FLOAT_TOLERANCE = 1e-6


def program(instance: Instance, body: str) -> str:
    """A complete program defining the instance's function with `body`."""
    return f"def {instance.name}({instance.params}) -> {instance.returns}:\n{body}\n"


def _call(source: str, name: str, args: tuple[Any, ...]) -> Any:
    namespace: dict[str, Any] = {}
    exec(compile(source, f"<starter:{name}>", "exec"), namespace)  # our own, trusted source
    return namespace[name](*args)


def _args(args: tuple[Any, ...]) -> str:
    return ", ".join(repr(arg) for arg in args)


def _assertion(args: tuple[Any, ...], expected: Any) -> str:
    if isinstance(expected, float):
        return f"    assert abs(candidate({_args(args)}) - {expected!r}) < {FLOAT_TOLERANCE}"
    return f"    assert candidate({_args(args)}) == {expected!r}"


def render(instance: Instance, task_id: str, split: str) -> TaskSpec:
    """The `TaskSpec` of an instance: prompt with a docstring example, derived tests."""
    canonical = program(instance, instance.body)
    inputs = list({repr(args): args for args in instance.inputs}.values())  # drop repeats
    outputs = [_call(canonical, instance.name, args) for args in inputs]
    example_args, example_out = inputs[0], outputs[0]
    spec = instance.spec.replace("\n", "\n    ")
    prompt = (
        "Complete this Python function:\n\n"
        "```python\n"
        f"def {instance.name}({instance.params}) -> {instance.returns}:\n"
        f'    """{spec}\n\n'
        f"    >>> {instance.name}({_args(example_args)})\n"
        f"    {example_out!r}\n"
        '    """\n'
        "```\n\n"
        f"Answer with one ```python code block that defines `{instance.name}`."
    )
    checks = [_assertion(args, out) for args, out in zip(inputs, outputs, strict=True)]
    tests = "def check(candidate):\n" + "\n".join(checks) + "\n"
    return TaskSpec(
        id=task_id,
        prompt=prompt,
        entry_point=instance.name,
        tests=tests,
        canonical_solution=canonical,
        wrong_solution=program(instance, instance.wrong_body),
        suite=SUITE,
        split="train" if split == "train" else "heldout",
    )


@cache
def _generate() -> tuple[TaskSpec, ...]:
    instances = seeded(SUITE, FAMILIES, per_family=INSTANCES_PER_FAMILY, train=TRAIN_PER_FAMILY)
    return tuple(render(instance, task_id, split) for task_id, instance, split, _ in instances)


def starter_tasks() -> list[TaskSpec]:
    """All starter tasks (train first within each family), as fresh copies."""
    return [task.model_copy(deep=True) for task in _generate()]
