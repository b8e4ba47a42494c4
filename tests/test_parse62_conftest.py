"""tests/conftest.py loads without pytest-xdist: its xdist hook is optional to pluggy.

Before, `pytest_xdist_make_scheduler` was an ordinary hook implementation: with `-p no:xdist`
(or pytest-xdist not installed) pluggy refused it as an unknown hook (INTERNALERROR
PluginValidationError) and no test ran."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_parse62_trivial() -> None:
    """What the run below collects: passes anywhere."""
    assert True


def test_the_suite_runs_without_xdist() -> None:
    here = Path(__file__).relative_to(ROOT)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider"]
        + [f"{here}::test_parse62_trivial"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "1 passed" in run.stdout
