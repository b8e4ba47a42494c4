"""What the Harbor loader once lost or skipped without a word: a task directory it could not
read (a PermissionError out of `load_harbor`: every task lost, and the run's `load_tasks`
retried it without end), a directory of tests or build context it could not read, a link
inside tests/ or a copied directory (skipped: the task ran without those files), and a task
directory without a regular task.toml (Terminal-Bench's task.yaml, a dangling link: ignored)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from infra.tasks.harbor import load_harbor
from tests.paths import REPO_ROOT

EXAMPLE = REPO_ROOT / "examples" / "harbor" / "fix-greeting"
NOBODY = 65534

LOAD = """
import json, sys
from infra.tasks.harbor import load_harbor
try:
    tasks, errors = load_harbor(sys.argv[1])
    print(json.dumps({"loaded": [t.spec.id for t in tasks], "errors": errors}))
except Exception as exc:
    print(json.dumps({"raised": type(exc).__name__, "message": str(exc)}))
"""


def task(root: Path, name: str, dockerfile: str | None = None) -> Path:
    directory = Path(shutil.copytree(EXAMPLE, root / name))
    if dockerfile is not None:
        (directory / "environment" / "Dockerfile").write_text(dockerfile)
    return directory


def load_as_a_worker_that_is_not_root(path: Path) -> dict[str, object]:
    """`load_harbor(path)` where a mode of 000 stops a read: as root, under another uid (root
    reads whatever the mode), as the repository's other such tests do."""
    unprivileged = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    prefix = unprivileged if os.geteuid() == 0 else []
    done = subprocess.run(
        [*prefix, sys.executable, "-c", LOAD, str(path)],
        capture_output=True, text=True, cwd=REPO_ROOT, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    result: dict[str, object] = json.loads(done.stdout)
    return result


def test_what_a_worker_cannot_read_is_that_tasks_error_naming_it() -> None:
    with tempfile.TemporaryDirectory() as top:  # in /tmp: pytest's tmp_path is root's alone
        suite = Path(top)
        suite.chmod(0o755)
        task(suite, "good")
        locked_dir = task(suite, "locked-dir")
        locked_tests = task(suite, "locked-tests")
        fixtures = task(suite, "locked-fixtures") / "tests" / "fixtures"
        fixtures.mkdir()
        (fixtures / "expected.txt").write_text("the tests need it\n")
        copy = "FROM python\nCOPY greet.py /app/\nCOPY src /app/src\n"
        context = task(suite, "locked-context", copy) / "environment" / "src"
        context.mkdir()
        (context / "data.txt").write_text("the workspace needs it\n")
        for locked in (locked_dir, locked_tests / "tests", fixtures, context):
            locked.chmod(0)
        try:
            loaded = load_as_a_worker_that_is_not_root(suite)
            whole = load_as_a_worker_that_is_not_root(locked_dir)
        finally:
            for locked in (locked_dir, locked_tests / "tests", fixtures, context):
                locked.chmod(0o755)
    assert loaded["loaded"] == ["good"], loaded
    errors = loaded["errors"]
    assert isinstance(errors, dict) and sorted(errors) == [
        "locked-context",
        "locked-dir",
        "locked-fixtures",
        "locked-tests",
    ]
    denied = "unreadable (Permission denied)"
    assert errors["locked-dir"] == f"task locked-dir: {locked_dir}/task.toml: {denied}"
    assert errors["locked-tests"].startswith(f"task locked-tests: {locked_tests}/tests")
    assert errors["locked-tests"].endswith(denied)
    assert errors["locked-fixtures"] == f"task locked-fixtures: {fixtures}: {denied}"
    assert errors["locked-context"] == f"task locked-context: {context}: {denied}"
    # a directory of tasks it cannot list: bad input (not retried), not a PermissionError
    assert whole == {"raised": "ValueError", "message": f"{locked_dir}: {denied}"}


@pytest.mark.parametrize(
    ("where", "target"),
    [
        ("tests/fixtures", "dir"),
        ("tests/expected.txt", "file"),
        ("environment/src/data", "dir"),
        ("environment/src/data.txt", "file"),
    ],
)
def test_a_link_inside_tests_or_a_copied_directory_is_that_tasks_error(
    tmp_path: Path, where: str, target: str
) -> None:
    """A link is not followed (its target may lie anywhere on the host) and was skipped: the
    task ran without the files its author meant it to have."""
    secret = tmp_path / "host"
    secret.mkdir()
    (secret / "key.txt").write_text("host secret\n")
    suite = tmp_path / "suite"
    task(suite, "good")
    leaky = task(suite, "leaky", "FROM python\nCOPY greet.py /app/\nCOPY src /app/src\n")
    (leaky / "environment" / "src").mkdir()
    (leaky / where).symlink_to(secret if target == "dir" else secret / "key.txt")
    tasks, errors = load_harbor(suite)
    assert [t.spec.id for t in tasks] == ["good"]
    assert errors == {
        "leaky": f"task leaky: {leaky / where}: is a link: a task's files must lie in its directory"
    }


def test_a_task_directory_without_a_regular_task_toml_is_that_tasks_error(tmp_path: Path) -> None:
    task(tmp_path, "good")
    yaml = task(tmp_path, "terminal-bench")
    (yaml / "task.toml").rename(yaml / "task.yaml")
    bare = tmp_path / "tests-only"
    shutil.copytree(EXAMPLE / "tests", bare / "tests")
    dangling = task(tmp_path, "dangling")
    (dangling / "task.toml").unlink()
    (dangling / "task.toml").symlink_to(tmp_path / "nowhere")
    (tmp_path / "docs").mkdir()  # no task's file in it: no task
    (tmp_path / "docs" / "README.md").write_text("How the suite was made.\n")
    tasks, errors = load_harbor(tmp_path)
    assert [t.spec.id for t in tasks] == ["good"]
    assert sorted(errors) == ["dangling", "terminal-bench", "tests-only"]
    assert errors["dangling"] == (
        f"task dangling: {dangling}/task.toml: is a link: a task's files must lie in its directory"
    )
    assert errors["terminal-bench"].startswith(f"task terminal-bench: {yaml}/task.toml: missing")
    assert "task.yaml" in errors["terminal-bench"]
    assert errors["tests-only"].startswith(f"task tests-only: {bare}/task.toml: missing")
    # named alone, such a directory is that task's error too, not "no Harbor task in it"
    assert load_harbor(yaml) == ([], {"terminal-bench": errors["terminal-bench"]})


def test_a_fifo_inside_tests_is_that_tasks_error_never_waited_on(tmp_path: Path) -> None:
    """It was passed over like a link: the tests ran without it."""
    task(tmp_path, "good")
    fifo = task(tmp_path, "piped") / "tests" / "fixture"
    os.mkfifo(fifo)
    tasks, errors = load_harbor(tmp_path)
    assert [t.spec.id for t in tasks] == ["good"]
    assert errors == {"piped": f"task piped: {fifo}: not a regular file"}
