"""Task-provided helper code: what a task's prompt defines besides the function to write.

    helpers = task_helpers(task.prompt, task.entry_point)   # "" for prose prompts

HumanEval prompts are Python: imports, sometimes helper functions the tests call (/32 `poly`,
/38 `encode_cyclic`, /50 `encode_shift`, /10 `is_palindrome`) or constants (/64 `FIX`), then
the entry point's signature and docstring. The verifier runs the helpers in the *checker*
(`infra/sandbox/checker.py`), from the task's own prompt, after the program's names: a program
that redefines `encode_cyclic` changes only its own copy, never what the tests call.

Kept: imports, assignments, classes, and functions with a real body, in prompt order. Dropped:
the entry point, stubs (a body of only a docstring, `pass` or `...`: code the model is asked to
write), and any other statement (a bare expression, a loop), which would run arbitrary prompt
text on the checker. A prompt that is not Python has no helpers.
"""

from __future__ import annotations

import ast

_KEPT = (ast.Import, ast.ImportFrom, ast.Assign, ast.AnnAssign, ast.ClassDef)


def _is_stub(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    for statement in node.body:
        if isinstance(statement, ast.Pass):
            continue
        if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant):
            continue  # a docstring or `...`
        return False
    return True


def task_helpers(prompt: str, entry_point: str | None) -> str:
    """The helper code of `prompt`: everything it defines except `entry_point` and stubs."""
    try:
        tree = ast.parse(prompt)
    except SyntaxError:
        return ""
    lines = prompt.splitlines(keepends=True)
    kept = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            if node.name == entry_point or _is_stub(node):
                continue
        elif not isinstance(node, _KEPT):
            continue
        first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        kept.append("".join(lines[first - 1 : node.end_lineno]).rstrip() + "\n")
    return "\n\n".join(kept)
