"""The usage lines of `workers.versioning`'s docstring call its functions as they are: with
their parameters, and keeping a result only where one is returned."""

from __future__ import annotations

import ast
import inspect

from workers import versioning


def test_the_docstrings_calls_match_the_functions() -> None:
    doc = versioning.__doc__ or ""
    lines = [line.split("#")[0].strip() for line in doc.splitlines() if line.startswith("    ")]
    checked = 0
    for line in lines:
        statement = ast.parse(line).body[0]
        call = statement.value if isinstance(statement, ast.Assign | ast.Expr) else None
        if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name):
            continue
        function = getattr(versioning, call.func.id)
        signature = inspect.signature(function)
        signature.bind(*call.args, **{k.arg: k.value for k in call.keywords if k.arg})
        if isinstance(statement, ast.Assign):
            assert signature.return_annotation not in ("None", None), line
        checked += 1
    assert checked >= 2
