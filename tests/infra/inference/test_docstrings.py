"""The inference modules' docstrings name real code: every `infra.…` path in them resolves (a
module, or an attribute of one), so a reader who follows one finds it."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

from tests.paths import REPO_ROOT

MODULES = sorted((REPO_ROOT / "infra" / "inference").glob("*.py"))
DOTTED = re.compile(r"`(infra(?:\.\w+)+)`|\((infra(?:\.\w+)+)\)")


def resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for name in parts[split:]:
            if not hasattr(found, name):
                return False
            found = getattr(found, name)
        return True
    return False


@pytest.mark.parametrize("path", MODULES, ids=[p.name for p in MODULES])
def test_every_dotted_name_in_a_docstring_resolves(path: Path) -> None:
    tree = ast.parse(path.read_text())
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    docs = [ast.get_docstring(node) or "" for node in ast.walk(tree) if isinstance(node, kinds)]
    named = {a or b for doc in docs for a, b in DOTTED.findall(doc)}
    assert [name for name in sorted(named) if not resolves(name)] == []
