"""The example tests a `workspace` task's repository holds (`visible_tests`), as the agent reads
their output: each failing call written as it is called. Before, a call of one argument printed
its tuple, `FAIL slugify('Hello,  World!',): …`, a comma no call has."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from infra.tasks.workspace_repo import Repo, reference_results, visible_tests

BUGGY = "def neg(a):\n    return a\n\n\ndef add(a, b):\n    return a - b\n"
FIXED = "def neg(a):\n    return -a\n\n\ndef add(a, b):\n    return a + b\n"


def test_a_failing_example_prints_the_call_as_written(tmp_path: Path) -> None:
    visible = [("neg", (2,)), ("add", (1, 2)), ("neg", (0,))]
    repo = Repo("calc", "", "", BUGGY, FIXED, visible=visible, hidden=[])
    (tmp_path / "calc.py").write_text(BUGGY)
    tests = visible_tests(repo, reference_results(FIXED, "calc", visible))
    (tmp_path / "test_calc.py").write_text(tests)
    ran = subprocess.run(  # our own code: safe to run here
        [sys.executable, "-B", "test_calc.py"], cwd=tmp_path, capture_output=True, text=True
    )
    assert ran.returncode == 1
    assert ran.stdout == (
        "FAIL neg(2): expected -2, got 2\n"
        "FAIL add(1, 2): expected 3, got -1\n"
        "1/3 example tests passed\n"
    )
