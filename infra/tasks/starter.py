"""The built-in `starter` suite: small, procedurally generated Python function tasks.

Twenty task families (see `infra/tasks/starter_families.py`), from trivial (add a constant) to
moderate (fizzbuzz with custom words, running maxima, deduplication). Each family's first 6
seeded instances are `train` (120 tasks); `heldout` are 80 more (one is 1.25 points) of the
nine families whose instances differ in what solves them (`HELDOUT`: their constants), each
passed by no earlier instance's function of its family, whatever the function's name
(`same_answer`, `infra/tasks/seeded.py`). Held-out tasks are therefore *new instances of the
families seen in training*: the trained rule with other constants, never a trained answer
(which is what lets a ~135M-parameter policy measurably improve its held-out pass@1 from a few
minutes of GRPO, and what makes that gain learning, not recall). The other eleven families
(reverse a string, parity, ...) have one or two answers in all, so none of their instances is
held out.

Tests are derived from the canonical solution itself (its outputs on the instance's inputs),
so canonical and tests cannot disagree; the family's `wrong_body` is a plausible mistake that
the unit tests and `tempered tasks validate starter` prove the tests reject.

Public and hidden tests, as programming judges have them: of the n distinct inputs, the first
ceil(n/2) (the first is the prompt's docstring example) are the shown `tests`
(`def check(candidate)`, whose failing assert the feedback of a failed turn quotes), the rest
`hidden_tests` (top-level asserts on the function's name, whose failures are reported without
source or values). The verdict runs both, so its asserts are all n, as before the split; a
program that special-cases what its feedback showed still fails the hidden ones. Not covered:
the hidden inputs themselves (the program sees its arguments and may print them), and the shown
half alone need not reject `wrong_body` (the verdict does).

    from infra.tasks.starter import starter_tasks
    tasks = starter_tasks()          # 200 TaskSpecs, identical on every call and machine
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from functools import cache
from typing import Any, cast

from contracts.task import TaskSpec
from infra.tasks.seeded import seeded
from infra.tasks.starter_families import FAMILIES, Instance

SUITE = "starter"
TRAIN_PER_FAMILY = 6
HELDOUT = {
    "add": 6, "multiply": 4, "repeat": 10, "sumabove": 2, "letters": 4, "fizzbuzz": 8,
    "compare": 14, "linear": 16, "clamp": 16,
}  # fmt: skip
"""Held-out instances per family: at most the distinct answers its stream holds beyond its
training instances' (add: 11 constants in all); families with one or two answers have none."""
FLOAT_TOLERANCE = 1e-6


def program(instance: Instance, body: str) -> str:
    """A complete program defining the instance's function with `body`."""
    return f"def {instance.name}({instance.params}) -> {instance.returns}:\n{body}\n"


def _args(args: tuple[Any, ...]) -> str:
    return ", ".join(repr(arg) for arg in args)


def _assertion(function: str, args: tuple[Any, ...], expected: Any) -> str:
    """`assert function(args) == expected` (a float: within FLOAT_TOLERANCE)."""
    if isinstance(expected, float):
        return f"assert abs({function}({_args(args)}) - {expected!r}) < {FLOAT_TOLERANCE}"
    return f"assert {function}({_args(args)}) == {expected!r}"


def render(instance: Instance, task_id: str, split: str) -> TaskSpec:
    """The `TaskSpec` of an instance: prompt with a docstring example, derived tests."""
    canonical = program(instance, instance.body)
    inputs = list({repr(args): args for args in instance.inputs}.values())  # drop repeats
    outputs = [_function(instance)(*args) for args in inputs]
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
    shown = (len(inputs) + 1) // 2  # ceil(n/2): the docstring's example is the first
    cases = list(zip(inputs, outputs, strict=True))
    checks = [f"    {_assertion('candidate', args, out)}\n" for args, out in cases[:shown]]
    hidden = [f"{_assertion(instance.name, args, out)}\n" for args, out in cases[shown:]]
    return TaskSpec(
        id=task_id,
        prompt=prompt,
        entry_point=instance.name,
        tests="def check(candidate):\n" + "".join(checks),
        hidden_tests="".join(hidden),
        canonical_solution=canonical,
        wrong_solution=program(instance, instance.wrong_body),
        suite=SUITE,
        split="train" if split == "train" else "heldout",
    )


def same_answer(earlier: Instance, new: Instance) -> bool:
    """Whether `earlier`'s function, whatever it is called, gives `new`'s expected values on
    `new`'s inputs (so recalling it would pass `new`): no held-out task may (`seeded`)."""
    try:
        return all(
            _agree(_function(earlier)(*copy.deepcopy(args)), _function(new)(*copy.deepcopy(args)))
            for args in new.inputs
        )
    except Exception:  # noqa: BLE001 - our own code, on inputs of another instance: no match
        return False


@cache
def _compiled(name: str, params: str, returns: str, body: str) -> Callable[..., Any]:
    namespace: dict[str, Any] = {}
    source = f"def {name}({params}) -> {returns}:\n{body}\n"
    exec(compile(source, f"<starter:{name}>", "exec"), namespace)  # our own, trusted source
    return cast(Callable[..., Any], namespace[name])


def _function(instance: Instance) -> Callable[..., Any]:
    return _compiled(instance.name, instance.params, instance.returns, instance.body)


def _agree(got: Any, expected: Any) -> bool:
    if isinstance(expected, float) and isinstance(got, int | float):
        return abs(got - expected) < FLOAT_TOLERANCE
    return bool(type(got) is type(expected) and got == expected)


@cache
def _generate() -> tuple[TaskSpec, ...]:
    instances = seeded(
        SUITE, FAMILIES, train=TRAIN_PER_FAMILY, heldout=HELDOUT, clashes=same_answer
    )
    return tuple(render(instance, task_id, split) for task_id, instance, split, _ in instances)


def starter_tasks() -> list[TaskSpec]:
    """All starter tasks (train first within each family), as fresh copies."""
    return [task.model_copy(deep=True) for task in _generate()]
