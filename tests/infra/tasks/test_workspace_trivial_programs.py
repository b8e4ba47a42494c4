"""No trivial program earns a reward in the `workspace` suite.

An episode's reward is its final workspace's score above the untouched workspace's
(`RewardConfig.score`: max(0, (score - untouched) / (1 - untouched))). A constant answer put
in the buggy function (`return True`, `return 0`, `return []`, its first argument, ...)
passed about half the hidden asserts of the true/false families and a third of the -1/0/1
ones, more than the untouched bug: a reward for not solving the task, which RL finds. Here every
task of the suite (train and held out) gets each trivial program in the function its hidden
tests call, scored in-process as the verifier scores it (each top-level assert one unit, the
share that passed, all in one namespace: one candidate process answers all of a check's
calls); a sample goes through the real two-process verifier to show the in-process scores are
its scores. Stateful programs too: when every group of calls had one answer pattern (True then
False), a function that alternated its answers passed every assert of the brackets tasks.
"""

from __future__ import annotations

import ast
import itertools
import random
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from contracts.task import RewardConfig, WorkspaceSpec
from infra.environments.tree import Packed, decode_tree, pack_files
from infra.sandbox.judge import split_tests
from infra.tasks.workspace import workspace_tasks
from infra.tasks.workspace_repo import Repo, hidden_asserts
from infra.tasks.workspace_task import SOLVE, WorkspaceTask
from tests.infra.environments.conftest import needs_root
from tests.infra.tasks.verifying import verified_scores

FIRST_ARGUMENT = "<first argument>"
TRIVIAL = (
    *("True", "False", "-1", "0", "1", "2", "None", "[]", '""'),
    *(FIRST_ARGUMENT, f"str({FIRST_ARGUMENT})"),
)
"""The bodies `return <this>` put in the function under test; besides these, every answer the
task shows (`shown`)."""
STATEFUL = (
    *("n % 2 == 1", "n % 2 == 0", "n % 2", "1 - n % 2"),  # toggles, counters modulo 2
    *("n % 3", "n % 3 - 1", "1 - n % 3"),  # counters modulo 3
    *(f"n % 3 {op} {k}" for op in ("==", "!=") for k in range(3)),
    "n",  # a counter
)
"""The stateful bodies put in the function under test: `return <this>`, n the calls so far
(1 on the first). Besides these, every cycle through the task's answer values (`cycles`).
With a memo (`memo`), n counts the distinct arguments so far and each argument is answered as
the first time: a program that alternates True and False over new arguments."""


def _tree(packed: Packed) -> dict[str, str]:
    manifest, contents = decode_tree(packed.objects[packed.ref.key])
    return {entry.path: contents[entry.sha256].decode() for entry in manifest.files()}


@dataclass(frozen=True)
class Case:
    """One task, as the verifier sees it: the workspace's files, the hidden tests, the module
    and function under test."""

    task: WorkspaceTask
    files: dict[str, str]
    tests: str
    module: str
    function: str

    @classmethod
    def of(cls, task: WorkspaceTask) -> Case:
        check = task.tests.manifest.check
        assert check is not None and check.kind == "functions" and len(check.modules) == 1
        tests = _tree(task.tests)[check.tests]
        called = {
            node.func.id
            for node in ast.walk(ast.parse(tests))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
        } - {"abs"}
        assert len(called) == 1, (task.spec.id, called)  # one function under test
        return cls(task, _tree(task.files), tests, check.modules[0], called.pop())

    @property
    def path(self) -> str:
        return f"{self.module}.py"

    def reference(self) -> str:
        """The module the reference solution writes (solve.sh's here-document)."""
        assert self.task.solution is not None
        solve = _tree(self.task.solution)[SOLVE]
        head, _, rest = solve.partition("<<'EOF'\n")
        assert head.endswith(f"cat > {self.path} "), solve[:80]
        return rest.removesuffix("EOF\n")

    def trivial(self, answer: str) -> str:
        """The untouched module with the function's body replaced by `return <answer>`."""
        return self._with_body([f"return {answer}"])

    def stateful(self, answer: str) -> str:
        """The untouched module with the function's body replaced by one that counts its calls
        in the module (n, 1 on the first) and returns `answer`, an expression of n."""
        counted = ['calls = globals().setdefault("_calls", [0])', "calls[0] += 1", "n = calls[0]"]
        return self._with_body([*counted, f"return {answer}"])

    def _with_body(self, body: list[str]) -> str:
        source = self.files[self.path]
        (node,) = [
            n
            for n in ast.parse(source).body
            if isinstance(n, ast.FunctionDef) and n.name == self.function
        ]
        body = [line.replace(FIRST_ARGUMENT, node.args.args[0].arg) for line in body]
        lines = source.splitlines(keepends=True)
        indent = " " * node.body[0].col_offset
        start, end = node.body[0].lineno - 1, node.end_lineno
        assert end is not None
        return (
            "".join(lines[:start])
            + "".join(f"{indent}{line}\n" for line in body)
            + "".join(lines[end:])
        )

    def memo(self, answer: str) -> str:
        """The untouched module with the function's body replaced by one that remembers each
        argument's answer and answers a new one with `answer`, an expression of n, the
        arguments seen so far with this one (1 on the first)."""
        return self._with_body(
            [
                "key = repr(locals())",  # the arguments, before any other local
                'memo = globals().setdefault("_memo", {})',
                "if key not in memo:",
                "    n = len(memo) + 1",
                f"    memo[key] = {answer}",
                "return memo[key]",
            ]
        )

    def shown(self) -> list[str]:
        """The answers the task shows, as literals: the example tests' expected values and, in
        the `game` family, each word of rules.py (a constant of them, or of the words of a
        multiple of both divisors, which the README shows, passed most hidden asserts)."""
        tests = self.files[f"test_{self.module}.py"]
        (cases,) = [
            node.value
            for node in ast.parse(tests).body
            if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "CASES"
        ]
        assert isinstance(cases, ast.List)
        shown = {
            ast.unparse(case.elts[2]): None for case in cases.elts if isinstance(case, ast.Tuple)
        }
        if "rules.py" in self.files:
            rules: dict[int, str] = {}
            exec(self.files["rules.py"], rules)  # noqa: S102 - our own suite's helper
            shown |= {repr(word): None for word in rules["RULES"].values()}
        return list(shown)

    def answers(self) -> list[str]:
        """The distinct values the hidden asserts expect, as literals, in order of appearance."""
        seen: dict[str, None] = {}
        for node in ast.parse(self.tests).body:
            assert isinstance(node, ast.Assert) and isinstance(node.test, ast.Compare)
            if not isinstance(node.test.ops[0], ast.Eq):
                continue  # abs(f(x) - y) < tolerance
            (expected,) = node.test.comparators
            grouped = isinstance(node.test.left, ast.Tuple)
            for value in (
                expected.elts if grouped and isinstance(expected, ast.Tuple) else [expected]
            ):
                seen[ast.unparse(value)] = None
        return list(seen)

    def cycles(self) -> list[str]:
        """Every cycle through the task's answer values, in every order and so from every phase
        (`return [True, False][(n - 1) % 2]`), where they are few (three at most: True and
        False, -1, 0 and 1)."""
        values = self.answers()
        if len(values) > 3:
            return []
        return [
            f"[{', '.join(order)}][(n - 1) % {len(order)}]"
            for order in itertools.permutations(values)
        ]

    def score(self, module: str) -> float:
        """The verifier's score of the workspace with `module` as the module under test: its
        hidden asserts run one by one in the module's namespace, the share that passed."""
        others = {path: text for path, text in self.files.items() if path.endswith(".py")}
        others.pop(self.path)
        with tempfile.TemporaryDirectory() as root:  # what the module imports, as in a sandbox
            for path, text in others.items():
                Path(root, path).write_text(text)
            sys.path.insert(0, root)
            try:
                namespace: dict[str, Any] = {"__name__": "__main__"}
                exec(compile(module, self.path, "exec"), namespace)  # ours, or a trivial one
                passed = total = 0
                for unit in split_tests(self.tests, None):
                    total += bool(unit["test"])
                    try:
                        exec(str(unit["source"]), namespace)
                    except Exception:
                        continue
                    passed += bool(unit["test"])
                return passed / total
            finally:
                sys.path.remove(root)
                for path in others:
                    sys.modules.pop(path.removesuffix(".py"), None)


CASES = [Case.of(task) for task in workspace_tasks()]
REWARD = RewardConfig(solved=1.0)


def test_the_reference_solves_and_the_untouched_workspace_does_not() -> None:
    for case in CASES:
        assert case.score(case.reference()) == 1.0, case.task.spec.id
        assert case.score(case.files[case.path]) < 1.0, case.task.spec.id


def test_no_trivial_program_scores_above_the_untouched_workspace() -> None:
    earned: dict[str, list[str]] = {}
    for case in CASES:
        untouched = case.score(case.files[case.path])
        for answer in (*TRIVIAL, *case.shown()):
            score = case.score(case.trivial(answer))
            reward = REWARD.score((), verdict=score, untouched=untouched)
            if reward > 0:
                family = case.task.spec.id.split("-")[1]
                earned.setdefault(f"{family}: return {answer}", []).append(
                    f"{case.task.spec.id} {score:.2f} vs {untouched:.2f} -> {reward:.2f}"
                )
    assert not earned, "\n".join(f"{k}: {v}" for k, v in sorted(earned.items()))


def test_no_stateful_program_scores_above_the_untouched_workspace() -> None:
    """One process answers all of a check's calls, so a program may count them. An alternating
    toggle, counters modulo 2 and 3 and every cycle through the answer values, from every
    phase, earn nothing on any task: a group's calls are laid out so that no answer sequence
    of period 1, 2 or 3 passes it (`workspace_repo._layouts`). The same over new arguments,
    remembering the others (`Case.memo`: one that alternated True and False so passed each
    brackets group whose first call expected True, and a cycle through -1, 0, 1 some versions
    groups): a group's calls, in the order first made, are laid out so too, and a call is in
    one group only."""
    earned: dict[str, list[str]] = {}
    tried = 0
    for case in CASES:
        untouched = case.score(case.files[case.path])
        for answer in (*STATEFUL, *case.cycles()):
            for kind, module in (("", case.stateful(answer)), ("memo ", case.memo(answer))):
                score = case.score(module)
                reward = REWARD.score((), verdict=score, untouched=untouched)
                tried += 1
                if reward > 0:
                    family = case.task.spec.id.split("-")[1]
                    earned.setdefault(f"{family}: {kind}return {answer}", []).append(
                        f"{case.task.spec.id} {score:.2f} vs {untouched:.2f} -> {reward:.2f}"
                    )
    assert not earned, "\n".join(f"{k}: {v}" for k, v in sorted(earned.items()))
    assert tried > 2 * len(CASES) * len(STATEFUL)  # cycles were tried too


def test_the_order_of_grouped_calls_is_drawn_per_instance() -> None:
    """No answer pattern is the same in every instance of a family: the asserts' order and each
    group's layout are drawn from the instance's seeded stream."""
    patterns: dict[str, set[str]] = {}
    instances: Counter[str] = Counter()
    for case in CASES:
        family = case.task.spec.id.split("-")[1]
        expected = [
            ast.unparse(node.test.comparators[0])
            for node in ast.parse(case.tests).body
            if isinstance(node, ast.Assert) and isinstance(node.test, ast.Compare)
        ]
        patterns.setdefault(family, set()).add(" ".join(expected))
        instances[family] += 1
    for family in ("brackets", "versions"):  # the same answers, in one order, before
        assert len(patterns[family]) == instances[family] >= 4, (family, patterns[family])


@needs_root
def test_the_verifier_scores_trivial_programs_as_computed() -> None:
    """Each held-out task with two trivial programs (in turn) and untouched, through the real
    sandbox: its score is the in-process one."""
    from infra.environments.snapshots import MemoryObjects

    runs: list[tuple[Case, str, WorkspaceSpec]] = []
    objects = MemoryObjects()
    heldout = [case for case in CASES if case.task.spec.split == "heldout"]
    for n, case in enumerate(heldout):
        objects.update(case.task.objects)
        workspace = case.task.spec.workspace
        assert workspace is not None
        runs.append((case, case.files[case.path], workspace))
        stateful = case.stateful(STATEFUL[n % len(STATEFUL)])  # its count kept between asserts
        for module in (
            case.trivial(TRIVIAL[n % len(TRIVIAL)]),
            case.trivial(TRIVIAL[(n + 4) % len(TRIVIAL)]),
            stateful,
        ):
            packed = pack_files({**case.files, case.path: module})
            objects.update(packed.objects)
            runs.append((case, module, workspace.model_copy(update={"files": packed.ref})))
    scores = verified_scores(objects, [spec for _, _, spec in runs], "trivial")
    for (case, module, _), got in zip(runs, scores, strict=True):
        assert got == pytest.approx(case.score(module)), (case.task.spec.id, module)


def test_an_assert_whose_calls_expect_one_value_is_refused() -> None:
    """A group of calls a constant answer would pass is a task bug, caught when rendered."""
    fixed = "def odd(n: int) -> bool:\n    return n % 2 == 1\n"
    repo = Repo(
        module="parity",
        summary="`odd(n)` says whether n is odd",
        behaviour="`odd(n)` is True for odd n.",
        source=fixed.replace("== 1", "== 0"),
        fixed=fixed,
        visible=[("odd", (1,))],
        hidden=[("odd", (3,)), ("odd", (4,)), ("odd", (5,)), ("odd", (7,))],
        together=2,
    )
    with pytest.raises(ValueError, match="together"):
        hidden_asserts(repo, random.Random(0))
    # (4, 5) checked with a call repeated, laid out so that no sequence of period 1, 2 or 3
    # passes: one of six ways, and the asserts in either order
    a, b = "odd(4)", "odd(5)"
    layouts = {
        f"assert ({', '.join(calls)}) == {tuple(call == b for call in calls)!r}\n"
        for calls in [(a, a, a, b), (a, a, b, b), (a, b, b, b), (b, a, a, a), (b, b, a, a),
                      (b, b, b, a)]
    }  # fmt: skip
    drawn = [hidden_asserts(replace(repo, hidden=repo.hidden[1:]), random.Random(seed))
             for seed in range(60)]  # fmt: skip
    assert {asserts[0] == "assert odd(7) == True\n" for asserts in drawn} == {True, False}
    assert {line for asserts in drawn for line in asserts} == {*layouts, "assert odd(7) == True\n"}


def test_the_hidden_order_draws_nothing_from_the_familys_stream() -> None:
    """A draw would change every later instance of the family: prompts, files, solutions."""
    from infra.tasks.workspace_repo import hidden_order

    rng = random.Random("tempered-workspace-brackets")
    rng.random()
    state = rng.getstate()
    first, second = hidden_order(rng), hidden_order(rng)
    assert rng.getstate() == state and first.random() == second.random()
