"""The rules a task's tests must follow, each in its one home, read from their syntax tree:
hidden tests are top-level asserts, one at least, and define no `check` that nothing calls
(`hidden_tests_problem`); the tests and helpers of a task with an entry point define `check`
(`defines_check`); tests that define a `check` nothing in them calls are HumanEval's form, which
only an entry point calls (`uncalled_check`).

    hidden_tests_problem("def check(candidate): ...")   # why these cannot be hidden tests
    defines_check(tests, helpers)                       # True: the checker has a check to call

`TaskSpec.load_problem` (contracts/task.py) asks them where task files load, the verifier's
`judge.split_tests` and `tempered sandbox run` too. Nothing here runs a test or judges a
program (that is the checker's, infra/sandbox/); text that does not parse is left to it.
"""

from __future__ import annotations

import ast


def hidden_tests_problem(hidden: str) -> str:
    """Why `hidden` cannot be a task's hidden tests, or "" when it can: the rule, in its one home
    (`TaskSpec.load_problem`, `judge.split_tests` and `tempered sandbox run --hidden-tests` apply
    it).

    Hidden tests are top-level asserts (with setup statements between them), at least one. The
    checker calls only the shown tests' `check` with the entry point, before the hidden units: a
    hidden `def check(candidate)` that nothing calls, or hidden text with no top-level assert
    (one unit that passes when it runs), would pass every program. Text that does not parse is
    left to the checker, which fails every program on it ("a hidden test failed (SyntaxError)").
    """
    if not hidden or (tree := parsed(hidden)) is None:
        return ""
    body = tree.body
    example = "write each hidden test as a top-level assert, e.g. `assert add(40, 2) == 42`"
    if _uncalled_check(body):
        return (
            "they define check(candidate), which nothing calls (only the shown tests' check is "
            f"called with the entry point), so every program would pass them: {example}"
        )
    if not any(isinstance(stmt, ast.Assert) for stmt in body):
        return (
            "they hold no top-level assert (such text is one unit, which passes whenever it runs "
            f"without an error: a definition alone passes every program): {example}"
        )
    return ""


def parsed(source: str) -> ast.Module | None:
    """`source` parsed, or None where it does not parse: a syntax error, a null byte (ValueError
    on some Pythons), or nesting past the parser's stack (`'-' * 200_000 + '1'`: MemoryError,
    RecursionError), which would otherwise fail every workflow task that checks it, for ever.
    The one parse of tests' text, for the rules here and the host's count (`judge.split_tests`)."""
    try:
        return ast.parse(source)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None


def defines_check(*sources: str) -> bool:
    """Whether one of `sources` (the tests, the helpers: the checker runs both in the namespace
    it calls `check(<entry point>)` from) defines `check` at module level: a `def` or `class`,
    an assignment or an import, also inside a top-level `if`, `try` or `with` (a function's
    local or a loop variable named `check` is none); True for text that does not parse (the
    verifier reports it). The rule, in its one home: a code task's entry point needs it
    (`TaskSpec.load_problem`); `tempered sandbox run --entry-point` asks the same."""
    trees = [parsed(source) for source in sources]
    if any(tree is None for tree in trees):
        return True
    return any(_binds_check(statement) for tree in trees if tree for statement in tree.body)


def _binds_check(statement: ast.stmt) -> bool:
    """Whether a module-level statement binds `check` (not inside a function or class body)."""
    if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return statement.name == "check"
    if isinstance(statement, ast.Import | ast.ImportFrom):
        return any((alias.asname or alias.name) == "check" for alias in statement.names)
    if isinstance(statement, ast.Assign | ast.AnnAssign | ast.AugAssign):
        targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
        return any(
            isinstance(node, ast.Name) and node.id == "check"
            for target in targets
            for node in ast.walk(target)
        )
    if isinstance(statement, ast.If | ast.Try | ast.With):
        blocks = [statement.body, getattr(statement, "orelse", [])]
        blocks += [getattr(statement, "finalbody", [])]
        blocks += [handler.body for handler in getattr(statement, "handlers", [])]
        return any(_binds_check(inner) for block in blocks for inner in block)
    return False


def uncalled_check(tests: str) -> bool:
    """Whether `tests` define a top-level `check` that nothing in them calls (HumanEval's form,
    which only an entry point calls). False for text that does not parse."""
    tree = parsed(tests)
    return tree is not None and _uncalled_check(tree.body)


def _uncalled_check(body: list[ast.stmt]) -> bool:
    defs = (ast.FunctionDef, ast.AsyncFunctionDef)
    if not any(isinstance(stmt, defs) and stmt.name == "check" for stmt in body):
        return False
    return not any(
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "check"
        for stmt in body
        if not (isinstance(stmt, defs) and stmt.name == "check")
        for node in ast.walk(stmt)
    )
