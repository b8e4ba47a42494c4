"""A mini-repository of the built-in `workspace` suite, and how it becomes a task.

    repo = FAMILIES["roman"](rng)             # a Repo: module, README, bug, reference, calls
    task = render(repo, "workspace-roman-0", "train", rng)

The workspace holds the module with its bug (or missing function), `README.md` stating the
behaviour, and `test_<module>.py`, example tests the agent may run (`python3 test_<module>.py`).
The hidden tests are top-level asserts on more calls (`assert f(x) == y`, or a group of calls
at once with one of them repeated, `assert (f(b), f(a), f(a), f(a)) == (y, x, x, x)`:
`Repo.together`), run by the two-process verifier against the module's functions; its score is
the share of asserts that pass. Expected values are computed here by running the reference
module (our own, trusted code), so they always agree with it. The reference solution,
`solve.sh`, writes the reference module over the buggy one.

One candidate process answers all of a check's calls, so a program may keep state between
them: the order of the asserts and of each group's calls is drawn per task instance
(`hidden_order`), and a group's calls are laid out so that no answer sequence that repeats
every one, two or three calls (`PERIODS`: a constant, an alternating toggle, a counter modulo
2 or 3, a cycle through -1, 0, 1) passes it, whatever the arguments, nor one that remembers
each argument's answer and answers new ones so (`_layouts`, `MEMO_PERIODS`).
"""

from __future__ import annotations

import itertools
import random
import sys
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from infra.environments.tree import Check, File
from infra.tasks.workspace_task import SOLVE, WorkspaceTask, workspace_task

SUITE = "workspace"
HIDDEN_TESTS = "hidden_tests.py"
FLOAT_TOLERANCE = 1e-9

Call = tuple[str, tuple[Any, ...]]
"""(function name, positional arguments)."""
PERIODS = (1, 2, 3)
"""No group of hidden calls passes an answer sequence of one of these periods: for each, the
group has two calls this far apart whose expected values differ (a constant: 1; a toggle or a
counter modulo 2: 2; a counter modulo 3 or a cycle through three answers: 3)."""
MEMO_PERIODS = PERIODS
"""Nor does a program that remembers each argument's answer and answers a new one by how many
it has seen (True, False, True, ... over new arguments; a cycle through -1, 0, 1): a group's
calls, in the order first made, have two this far apart whose expected values differ, where
the group has more calls than the period (four calls pass none; two pass a phase of every
period), and no call is in two groups (a remembered answer would let it skip one)."""


@dataclass(frozen=True)
class Repo:
    """One instance of a family, before it is rendered into a task."""

    module: str
    summary: str
    """What the function does, one phrase (the task's first line)."""
    behaviour: str
    """The README's statement of the intended behaviour, with an example."""
    source: str
    """The module as the agent finds it (with the bug, or without the function)."""
    fixed: str
    """The reference module."""
    visible: Sequence[Call]
    hidden: Sequence[Call]
    extra: dict[str, str] = field(default_factory=dict)
    """Other files of the repository (a helper module), path → text."""
    together: int = 1
    """Distinct hidden calls an assert checks: consecutive groups of this many, whose expected
    values must not all be equal, each call at least once and one more than once, in an order
    drawn per instance (`assert (f(b), f(a), f(a), f(a)) == (False, True, True, True)`).
    Where answers take a few values (True/False, -1/0/1), one call an assert let a constant
    answer pass every assert expecting it (half of them, a third) while the bug passed fewer:
    a reward for solving nothing, since an episode is paid above the untouched workspace's
    score; and groups with one answer pattern in every instance (True then False) let a
    program that alternates its answers pass them all."""


def reference_results(
    source: str, module: str, calls: Sequence[Call], helpers: Mapping[str, str] | None = None
) -> list[Any]:
    """What the reference `source` of `module` returns for `calls`, with `helpers` (path →
    text of other modules) importable meanwhile: the expected values of hidden tests."""
    imported = {path.removesuffix(".py"): text for path, text in (helpers or {}).items()}
    for name, text in imported.items():
        helper = types.ModuleType(name)
        exec(compile(text, f"<{name}>", "exec"), helper.__dict__)  # noqa: S102 - our own code
        sys.modules[name] = helper
    namespace: dict[str, Any] = {}
    try:
        exec(compile(source, f"<{module}>", "exec"), namespace)  # noqa: S102 - ours
        return [namespace[name](*args) for name, args in calls]
    finally:
        for name in imported:
            sys.modules.pop(name, None)


def _results(repo: Repo, calls: Sequence[Call]) -> list[Any]:
    return reference_results(repo.fixed, repo.module, calls, repo.extra)


def _call(name: str, args: tuple[Any, ...]) -> str:
    return f"{name}({', '.join(repr(arg) for arg in args)})"


def assertion(name: str, args: tuple[Any, ...], expected: Any) -> str:
    if isinstance(expected, float):
        return f"assert abs({_call(name, args)} - {expected!r}) < {FLOAT_TOLERANCE}\n"
    return f"assert {_call(name, args)} == {expected!r}\n"


def hidden_order(rng: random.Random) -> random.Random:
    """The stream that orders a task's hidden asserts: drawn from its family's stream `rng`
    where the instance ended, which it leaves there (a draw from `rng` would change every
    later instance of the family: their prompts, files and solutions). Deterministic: the
    same in every process."""
    return random.Random(repr(rng.getstate()))


def _layouts(values: Sequence[Any]) -> list[tuple[int, ...]]:
    """The ways to check calls whose expected values are `values` in one assert: sequences of
    their indices, each at least once (so one more than once), in which every period of
    `PERIODS` has two positions that far apart whose expected values differ. Their length is
    one more than the calls' and than the longest period: a window of three calls alone is
    passed by some phase of a counter modulo 3 (every pattern of three answers is one)."""
    length = max(len(values), *PERIODS) + 1
    return [
        layout
        for layout in itertools.product(range(len(values)), repeat=length)
        if len(set(layout)) == len(values)
        and _breaks(values, layout, PERIODS)
        and _breaks(values, list(dict.fromkeys(layout)), MEMO_PERIODS)
    ]


def _breaks(values: Sequence[Any], order: Sequence[int], periods: Sequence[int]) -> bool:
    """Whether `order` (indices of `values`) has, for each period shorter than it, two
    positions that far apart whose values differ: no sequence of that period matches it."""
    return all(
        any(values[order[i]] != values[order[i + period]] for i in range(len(order) - period))
        for period in periods
        if period < len(order)
    )


def hidden_asserts(repo: Repo, order: random.Random) -> list[str]:
    """The hidden tests, one assert a line, in an order drawn from `order` (`hidden_order`):
    `repo.together` calls each, laid out as one of `_layouts`, drawn from `order` too
    (ValueError if a group's expected values are all equal: one constant answer would pass
    it, or floats, which an assert of several calls cannot compare within a tolerance; or if
    no layout passes `_layouts`, or a call is in two groups)."""
    expected = _results(repo, repo.hidden)
    if repo.together > 1 and len(set(map(repr, repo.hidden))) < len(repo.hidden):
        raise ValueError(f"{repo.module}: a hidden call is checked in two groups")
    asserts = []
    for start in range(0, len(repo.hidden), repo.together):
        calls = repo.hidden[start : start + repo.together]
        values = expected[start : start + repo.together]
        if len(calls) == 1:
            asserts.append(assertion(*calls[0], values[0]))
            continue
        layouts = [] if any(isinstance(v, float) for v in values) else _layouts(values)
        if not layouts:
            raise ValueError(f"{repo.module}: hidden calls {calls} expect {values} together")
        layout = order.choice(layouts)
        checked = ", ".join(_call(*calls[i]) for i in layout)
        asserts.append(f"assert ({checked}) == {tuple(values[i] for i in layout)!r}\n")
    order.shuffle(asserts)
    return asserts


def visible_tests(repo: Repo, expected: list[Any]) -> str:
    """`test_<module>.py`: runs `repo.visible` against the module, printing each call that
    fails as it is written (`f(a, b)`; a call's tuple of one argument had a stray comma)."""
    cases = ",\n".join(
        f"    ({name!r}, {args!r}, {value!r})"
        for (name, args), value in zip(repo.visible, expected, strict=True)
    )
    return f'''"""Example tests of {repo.module}.py: run `python3 test_{repo.module}.py`."""

import {repo.module}

CASES = [
{cases},
]

failed = 0
for name, args, expected in CASES:
    try:
        got = getattr({repo.module}, name)(*args)
    except Exception as exc:  # a failing call is a failed case
        got = exc
    if got != expected:
        failed += 1
        shown = ", ".join(map(repr, args))
        print(f"FAIL {{name}}({{shown}}): expected {{expected!r}}, got {{got!r}}")
print(f"{{len(CASES) - failed}}/{{len(CASES)}} example tests passed")
raise SystemExit(1 if failed else 0)
'''


def render(
    repo: Repo, task_id: str, split: Literal["train", "heldout"], rng: random.Random
) -> WorkspaceTask:
    """The task of `repo`, whose family's stream `rng` ends where the instance did (`seeded`):
    the hidden asserts' order is drawn from it (`hidden_order`), which draws nothing from it."""
    module_file = f"{repo.module}.py"
    readme = (
        f"# {repo.module}\n\n{repo.behaviour}\n\n"
        f"Run the example tests with `python3 test_{repo.module}.py`.\n"
    )
    hidden = "".join(hidden_asserts(repo, hidden_order(rng)))
    prompt = (
        f"The repository in your working directory (/app) has a Python module, {module_file}, "
        f"in which {repo.summary}. It does not behave as README.md says. Fix it, run the "
        f"example tests (`python3 test_{repo.module}.py`) to check your work, and call "
        "`submit` when you are done. Hidden tests will check more cases."
    )
    solve = f"#!/bin/sh\ncat > {module_file} <<'EOF'\n{repo.fixed}EOF\n"
    return workspace_task(
        task_id,
        prompt,
        {
            module_file: repo.source,
            "README.md": readme,
            f"test_{repo.module}.py": visible_tests(repo, _results(repo, repo.visible)),
            **repo.extra,
        },
        {HIDDEN_TESTS: hidden},
        Check(kind="functions", tests=HIDDEN_TESTS, modules=[repo.module]),
        solution={SOLVE: File(solve.encode(), executable=True)},
        suite=SUITE,
        split=split,
    )
