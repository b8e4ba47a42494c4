"""How `make test` schedules the suite, read from what it runs: the Makefile copied into a sandbox
whose venv tools are stubs that log their calls, as tests/test_packaging.py does.

- The parallel run sends every test of an `xdist_group` to one worker (`--dist loadgroup`), so a
  module's costly module-scoped fixture (a stack, a torchrun group, a wheel) is set up once, not
  once a worker: checked with the installed pytest-xdist and tests/conftest.py's mend of
  loadgroup under pytest 9, on a suite of its own.
- The session's `trained_stack` (tests/fixtures/trained_stack.py) is set up once only where every
  module that asks for it is in its group: the modules are found by their tests' arguments.
- The serial run of the `alone` tests collects only the files ALONE_TESTS lists (collecting all
  ~3,500 tests to run 5 took 12-30 s), and collecting an `alone` test from any other file is a
  collection error (tests/conftest.py), so that no such test falls between the two runs.
"""

from __future__ import annotations

import ast
import importlib
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.paths import REPO_ROOT

STUB = '#!/bin/sh\necho "$0 $*" >> "$RAN"\n'
INI = "[pytest]\nasyncio_default_fixture_loop_scope = function\nmarkers =\n    alone: serial\n"
GROUPED = [  # modules whose module-scoped fixture costs seconds: one worker runs each
    "tests.test_train",
    "tests.test_stack",
    "tests.test_packaging",
    "tests.workers.test_background_pollers",
    "tests.infra.test_learner_ranks",
    "tests.infra.test_learner_engine",
    "tests.infra.sandbox.test_gvisor",
]


def make_test_runs(root: Path) -> list[list[str]]:
    """The argv of each pytest run `make test` starts, from a sandbox copy of the Makefile."""
    root.mkdir(exist_ok=True)
    shutil.copy(REPO_ROOT / "Makefile", root)
    for name in ("pyproject.toml", "scripts/setup-system.sh", ".tempered/bin/helm"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).touch()
        os.utime(root / name, (1e9, 1e9))  # older than the stamps
    for tool in ("python", "ruff", "mypy", "lint-imports"):
        (root / ".venv" / "bin" / tool).parent.mkdir(parents=True, exist_ok=True)
        (root / ".venv" / "bin" / tool).write_text(STUB)
        (root / ".venv" / "bin" / tool).chmod(0o755)
    for stamp in (".tempered-core", ".tempered-setup", ".tempered-compiled"):
        (root / ".venv" / stamp).touch()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MAKE", "PYTEST_"))}
    done = subprocess.run(
        ["make", "--no-print-directory", "test"],
        cwd=root,
        env={**env, "RAN": str(root / "ran.log")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    calls = (root / "ran.log").read_text().splitlines()
    return [call.split()[1:] for call in calls if call.split()[1:3] == ["-m", "pytest"]]


def run_pytest(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=root,
        env={**env, "PYTHONPATH": str(REPO_ROOT), "SETUPS": str(root / "setups.log")},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_parallel_run_sets_a_groups_module_fixture_up_once(tmp_path: Path) -> None:
    """Under xdist's default `--dist load` both workers took tests of one module, and each set
    its module fixture up (test_background_pollers' stack: 15.9 s and 15.1 s)."""
    parallel = [run for run in make_test_runs(tmp_path / "make") if "-n" in run]
    assert len(parallel) == 1, parallel
    dist = [arg for arg in parallel[0] if arg.startswith("--dist")]
    assert dist, f"the parallel run leaves xdist's default, `--dist load`: {parallel[0]}"
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "pytest.ini").write_text(INI)
    (suite / "conftest.py").write_text(
        "from tests.conftest import pytest_xdist_make_scheduler  # noqa: F401\n"
    )
    tests = "".join(f"def test_{i}(costly):\n    pass\n\n\n" for i in range(8))
    for name in ("test_one", "test_two"):
        (suite / f"{name}.py").write_text(
            "import os\n\nimport pytest\n\npytestmark = pytest.mark.xdist_group(__name__)\n\n\n"
            '@pytest.fixture(scope="module")\ndef costly():\n'
            '    with open(os.environ["SETUPS"], "a") as log:\n        log.write(__name__ + "\\n")'
            f"\n\n\n{tests}"
        )
    at = parallel[0].index(dist[0])
    done = run_pytest(suite, "-n", "2", *parallel[0][at : at + (1 if "=" in dist[0] else 2)])
    assert done.returncode == 0, done.stdout + done.stderr
    setups = Counter((suite / "setups.log").read_text().split())
    assert setups == {"test_one": 1, "test_two": 1}, f"{dist}: module fixtures set up {setups}"


@pytest.mark.parametrize("module", GROUPED)
def test_a_module_with_a_costly_module_fixture_is_one_group(module: str) -> None:
    marks = importlib.import_module(module).pytestmark
    marks = marks if isinstance(marks, list) else [marks]
    assert len([mark for mark in marks if mark.name == "xdist_group"]) == 1, marks


def fixture_users(fixture: str) -> list[str]:
    """The test modules under tests/ (as paths from the repository root) with a function (a test
    or a fixture of the module) that takes `fixture` as an argument or marks `usefixtures` it."""
    users = []
    for path in sorted((REPO_ROOT / "tests").rglob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                taken = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
                if any(arg.arg == fixture for arg in taken):
                    break
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "usefixtures"
                and any(isinstance(a, ast.Constant) and a.value == fixture for a in node.args)
            ):
                break
        else:
            continue
        users.append(str(path.relative_to(REPO_ROOT)))
    return users


def test_the_modules_that_share_the_trained_stack_are_its_group() -> None:
    """Each module that takes `trained_stack` is in the group "trained_stack", as the scheduler
    reads it (tests/conftest.py `module_group`): one outside it would set a second stack (a
    Temporal, a SeaweedFS, five workers) up on another pytest-xdist worker."""
    from tests.conftest import module_group  # the scheduler's reader of a module's group

    users = fixture_users("trained_stack")
    assert "tests/test_train.py" in users, f"the scan finds none of its users: {users}"
    groups = {name: module_group(REPO_ROOT / name, REPO_ROOT) for name in users}
    assert all(group == "trained_stack" for group in groups.values()), groups


def test_the_serial_run_collects_the_files_alone_tests_lists(tmp_path: Path) -> None:
    from tests.conftest import alone_files  # the one reader of ALONE_TESTS

    listed = alone_files(REPO_ROOT / "Makefile")
    assert listed, "the Makefile's ALONE_TESTS lists no file"
    serial = [run for run in make_test_runs(tmp_path) if "-n" not in run]
    assert len(serial) == 1, serial
    assert [arg for arg in serial[0] if arg.endswith(".py")] == list(listed), serial[0]
    assert all((REPO_ROOT / name).is_file() for name in listed), listed


def test_an_alone_test_in_a_file_alone_tests_does_not_list_fails_collection(
    tmp_path: Path,
) -> None:
    (tmp_path / "pytest.ini").write_text(INI)
    (tmp_path / "Makefile").write_text(
        "ALONE_TESTS := suite/test_listed.py \\\n\tsuite/test_listed_too.py\n"
    )
    (tmp_path / "conftest.py").write_text(
        "from tests.conftest import pytest_make_collect_report  # noqa: F401\n"
    )
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_listed.py").write_text(
        "import pytest\n\n\n@pytest.mark.alone\ndef test_alone():\n    pass\n\n\n"
        "def test_with_others():\n    pass\n"
    )
    (suite / "test_listed_too.py").write_text(
        "import pytest\n\npytestmark = pytest.mark.alone\n\n\n"
        "class TestAll:\n    def test_alone(self):\n        pass\n"
    )
    (suite / "test_stray.py").write_text(
        "import pytest\n\n\nclass TestSome:\n"
        "    @pytest.mark.parametrize('x', [1, pytest.param(2, marks=pytest.mark.alone)])\n"
        "    def test_p(self, x):\n        pass\n"
    )
    everything = run_pytest(tmp_path, "-m", "not alone")
    assert everything.returncode != 0, everything.stdout
    assert "ERROR collecting suite/test_stray.py" in everything.stdout, everything.stdout
    assert "suite/test_stray.py::TestSome::test_p[2]" in everything.stdout, everything.stdout
    assert "test_listed" not in everything.stdout.split("short test summary")[0]
    serial = run_pytest(tmp_path, "-m", "alone", "suite/test_listed.py", "suite/test_listed_too.py")
    assert serial.returncode == 0 and "2 passed" in serial.stdout, serial.stdout + serial.stderr
