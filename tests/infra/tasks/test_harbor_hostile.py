"""Harbor task directories built to do harm: each once stopped the whole suite, hung the loader,
took the host's memory or scored a correct solution 0. Now each is one task's error naming its
file (and line), or a verdict of that task alone, and the other tasks still load and run."""

from __future__ import annotations

import asyncio
import logging
import math
import os
import re
import shutil
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from rich.console import Console

from contracts.sandbox import ExecStatus
from contracts.task import SandboxLimits
from infra.environments.checks import InvalidTask, read_reward
from infra.environments.tree import Check, TreeError
from infra.sandbox.workspace import CommandResult, CommandRunner, Mounts, cgroup_name, session_uid
from infra.settings import WorkspaceSettings
from infra.tasks import harbor_dockerfile
from infra.tasks.harbor import TaskInputError, load_harbor, load_task
from infra.tasks.validate import CheckPlan
from infra.tasks.workspace_validate import validate_workspace_tasks
from tests.paths import REPO_ROOT
from workers.cli.tasks import print_summary

EXAMPLES = REPO_ROOT / "examples" / "harbor"


def task(
    tmp_path: Path, name: str = "fix-greeting", toml: str | None = None, dockerfile: str = ""
) -> Path:
    """A copy of the fix-greeting example, with `toml` as its task.toml and `dockerfile`."""
    directory = Path(shutil.copytree(EXAMPLES / "fix-greeting", tmp_path / name))
    if toml is not None:
        (directory / "task.toml").write_text(toml)
    if dockerfile:
        (directory / "environment" / "Dockerfile").write_text(dockerfile)
    return directory


def bad_task_error(tmp_path: Path, **damage: str) -> str:
    """The one error of a directory holding a good task and a task `bad` with `damage`."""
    task(tmp_path, name="good")
    task(tmp_path, name="bad", **damage)
    tasks, errors = load_harbor(tmp_path)
    assert [t.spec.id for t in tasks] == ["good"], errors
    return errors["bad"]


# -- task.toml -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ('"C=D" = "x"', r"\[verifier.env\] 'C=D' is not a variable name"),
        ('"" = "x"', r"\[verifier.env\] '' is not a variable name"),
        ('"1A" = "x"', r"\[verifier.env\] '1A' is not a variable name"),
        ('E = "a\\u0000b"', r"\[verifier.env\] E: a NUL character"),
        ("A = [1, 2]", r"\[verifier.env\] A: a string, a number or a boolean, not an array"),
        ("A = { b = 1 }", r"\[verifier.env\] A: a string, a number or a boolean, not a table"),
        ("A = 1979-05-27", r"\[verifier.env\] A: a string, a number or a boolean, not a date"),
    ],
    ids=["equals", "empty", "digit", "nul", "array", "table", "date"],
)
def test_a_verifier_env_no_process_can_take_is_task_tomls_error(
    tmp_path: Path, env: str, message: str
) -> None:
    """Once `"C=D"` and `""` failed every verify with "bwrap: setenv failed" (SandboxNotUp, a
    platform fault, retried for ever), and a NUL stopped `tasks validate` for the whole suite
    ("embedded null byte", no task named)."""
    error = bad_task_error(tmp_path, toml=f"[verifier.env]\n{env}\n")
    assert re.match(rf"task bad: {re.escape(str(tmp_path))}/bad/task.toml: {message}", error)


def test_a_verifier_env_takes_strings_numbers_and_booleans_as_toml_spells_them(
    tmp_path: Path,
) -> None:
    directory = task(
        tmp_path, toml='[verifier.env]\nS = "x y"\nN = 3\nF = 0.5\nB = true\n_u = ""\n'
    )
    check = load_task(directory, suite="harbor:x").tests.manifest.check
    assert check is not None
    assert check.env == {"S": "x y", "N": "3", "F": "0.5", "B": "true", "_u": ""}


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        (
            "[verifier]\ntimeout_secs = 900\n",
            r"\[verifier\] timeout_secs: no such key; did you mean timeout_sec\?",
        ),
        ("[verifierr]\nx = 1\n", r"verifierr: no such key; did you mean verifier\?"),
        (
            "[verifier]\ntimeout_sec = true\n",
            r"\[verifier\] timeout_sec: a number of seconds, not a boolean",
        ),
        (
            "[verifier]\ntimeout_sec = 'soon'\n",
            r"\[verifier\] timeout_sec: a number of seconds, not 'soon'",
        ),
    ],
    ids=["verifier-typo", "table-typo", "bool-timeout", "word-timeout"],
)
def test_the_keys_tempered_reads_are_checked_not_ignored_or_coerced(
    tmp_path: Path, toml: str, message: str
) -> None:
    """Once a typo (`timeout_secs`) gave the default silently, and `timeout_sec = true` was
    a deadline of one second."""
    error = bad_task_error(tmp_path, toml=toml)
    assert re.match(rf"task bad: \S+/bad/task.toml: {message}", error), error


def test_keys_harbor_ignores_load_with_one_warning_naming_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Harbor's TaskConfig ignores keys it does not have, and real tasks carry some: once
    each was an error and the task was lost. A numeric string is Harbor's float too."""
    toml = (
        'timeout_sec = 900\n[verifier]\ntimeout_sec = "30"\nrestart_environment = false\n'
        "[ground_truth]\nepsilon = 0.05\n"
    )
    with caplog.at_level(logging.WARNING, logger="tempered.tasks"):
        loaded = load_task(task(tmp_path, toml=toml), suite="harbor:x")
    check = loaded.tests.manifest.check
    assert check is not None and check.timeout_s == 30.0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert warnings[0].endswith(
        "task.toml: keys Tempered does not know, ignored: timeout_sec, ground_truth, "
        "verifier.restart_environment"
    ), warnings


def test_harbors_tables_tempered_does_not_implement_load_and_are_ignored(tmp_path: Path) -> None:
    toml = (
        'version = "1.0"\nschema_version = "1.1"\nsource = "x"\n'
        '[task]\nname = "org/x"\n'
        '[metadata]\nauthor_name = "a"\ntags = ["x"]\nsplit = "heldout"\n'
        '[verifier]\ntimeout_sec = 30\nuser = "root"\nnetwork_mode = "no-network"\n'
        "[verifier.environment]\ncpus = 1\n"
        "[agent]\ntimeout_sec = 120.0\n"
        "[environment]\ncpus = 2\nmemory_mb = 2048\nstorage_mb = 10240\n"
        '[solution.env]\nX = "1"\n'
        '[[steps]]\nname = "one"\n'
    )
    loaded = load_task(task(tmp_path, toml=toml), suite="harbor:x")
    check = loaded.tests.manifest.check
    assert loaded.spec.split == "heldout" and check is not None and check.timeout_s == 30.0


# -- files that are not what they seem -------------------------------------------------------


@pytest.mark.parametrize("part", ["task.toml", "instruction.md"])
def test_a_fifo_for_the_config_or_the_prompt_is_refused_not_waited_on(
    tmp_path: Path, part: str
) -> None:
    """Once the loader waited for ever in open(), for a writer that never came."""
    directory = task(tmp_path)
    (directory / part).unlink()
    os.mkfifo(directory / part)
    outcome: dict[str, str] = {}

    def load() -> None:
        try:
            load_task(directory, suite="harbor:x")
        except TaskInputError as exc:
            outcome["error"] = str(exc)

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    thread.join(10)
    if thread.is_alive():  # a writer's open ends the reader's wait
        os.close(os.open(directory / part, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(10)
        pytest.fail(f"the loader waited on the FIFO {part}")
    assert re.search(rf"task fix-greeting: \S+/{part}: not a regular file", outcome["error"])


def test_a_file_larger_than_a_workspace_is_refused_unread_naming_it(tmp_path: Path) -> None:
    """Once an 8 GB sparse file was a MemoryError naming no task (the suite lost), and a
    400 MB one took 20 s and 1.7 GB: now a file is looked at before it is read."""
    limit = WorkspaceSettings().max_workspace_mb
    task(tmp_path, name="good")
    bad = task(tmp_path, name="bad", dockerfile="FROM python\nCOPY . /app/\n")
    with (bad / "environment" / "data.bin").open("wb") as sparse:
        sparse.truncate((limit << 20) + 1)  # no disk taken
    tasks, errors = load_harbor(tmp_path)
    assert [t.spec.id for t in tasks] == ["good"]
    assert errors["bad"] == (
        f"task bad: {bad}/environment/data.bin: {(limit << 20) + 1} bytes: the workspace's "
        f"files would take more than a workspace's {limit} MB"
    )


def test_the_files_of_a_workspace_count_together_against_the_limit(tmp_path: Path) -> None:
    """Each file fits; together (COPY can take one file many times) they do not."""
    copies = "".join(f"COPY greet.py /app/g{n}.py\n" for n in range(3))
    directory = task(tmp_path, dockerfile=f"FROM python\n{copies}")
    (directory / "environment" / "greet.py").write_bytes(b"#" * 400_000)
    load_task(directory, suite="harbor:x", max_mb=2)
    with pytest.raises(TaskInputError, match=r"greet.py: 400000 bytes: .* more than .* 1 MB"):
        load_task(directory, suite="harbor:x", max_mb=1)


def test_tests_and_solution_do_not_count_against_the_workspace(tmp_path: Path) -> None:
    """They are mounted at /tests and /solution, not put in the workspace: once a 1.2 MB
    fixture in tests/ took a 1.2 MB workspace past 2 MB, blamed as the workspace's."""
    directory = task(tmp_path, dockerfile="FROM python\nCOPY . /app/\n")
    (directory / "environment" / "data.bin").write_bytes(b"x" * 1_200_000)
    (directory / "tests" / "fixture.bin").write_bytes(b"y" * 1_200_000)
    (directory / "solution" / "fixture.bin").write_bytes(b"z" * 1_200_000)
    files = load_task(directory, suite="harbor:x", max_mb=2).files.manifest.files()
    assert "data.bin" in [entry.path for entry in files]


def test_a_task_file_past_the_loaders_cap_is_refused_unread_naming_it(tmp_path: Path) -> None:
    """(tests/ and solution/ each meet a workspace's size first: `test_harbor_review_loader`.)"""
    directory = task(tmp_path)
    size = (harbor_dockerfile.MAX_TASK_FILES_MB << 20) + 1
    with (directory / "instruction.md").open("wb") as sparse:
        sparse.truncate(size)  # no disk taken
    with pytest.raises(TaskInputError) as raised:
        load_task(directory, suite="harbor:x")
    assert str(raised.value) == (
        f"task fix-greeting: {directory}/instruction.md: {size} bytes: the task's own files "
        "(task.toml, instruction.md, the Dockerfile, tests/, solution/) would take more than "
        f"{harbor_dockerfile.MAX_TASK_FILES_MB} MB, the most the loader reads"
    )


# -- the layout ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "workdir", ["/tests", "/tests/app", "/logs/verifier", "/logs/verifier/x", "/solution"]
)
def test_a_workdir_the_verifier_mounts_over_is_the_dockerfiles_error(
    tmp_path: Path, workdir: str
) -> None:
    """Once accepted: the verify's /tests or /logs/verifier (the solve's /solution) was mounted
    over the workspace, and a correct solution scored 0."""
    directory = task(tmp_path, dockerfile=f"FROM python\nWORKDIR {workdir}\nCOPY greet.py .\n")
    with pytest.raises(TaskInputError, match=rf"Dockerfile:2: WORKDIR '{workdir}' lies in "):
        load_task(directory, suite="harbor:x")


@pytest.mark.parametrize("workdir", ["/testsuite", "/logs/app", "/solutions"])
def test_a_workdir_beside_the_verifiers_mounts_loads(tmp_path: Path, workdir: str) -> None:
    directory = task(tmp_path, dockerfile=f"FROM python\nWORKDIR {workdir}\nCOPY greet.py .\n")
    workspace = load_task(directory, suite="harbor:x").spec.workspace
    assert workspace is not None and workspace.workdir == workdir


def test_a_stray_task_toml_at_the_suite_root_is_refused_not_hiding_the_tasks(
    tmp_path: Path,
) -> None:
    """Once the root was taken for the only task, and a/ and b/ were never loaded."""
    task(tmp_path, name="a")
    task(tmp_path, name="b")
    (tmp_path / "task.toml").write_text("")
    with pytest.raises(ValueError, match=r"holds task.toml and task directories too \(a, b\)"):
        load_harbor(tmp_path)


# -- validate and verify ---------------------------------------------------------------------


class Failing:
    """A workspace environment whose every reset raises `error`."""

    backend = SimpleNamespace(name="stub")

    def __init__(self, error: Exception) -> None:
        self.error, self.resets = error, 0

    async def reset(self, workspace: object, session_id: str) -> None:
        self.resets += 1
        raise self.error

    async def close(self, session_ids: list[str]) -> int:
        return 0


def test_a_tree_that_does_not_fit_a_workspace_is_that_tasks_verdict_not_the_suites_end(
    tmp_path: Path,
) -> None:
    """Once the TreeError of a 300 MB initial tree ended `tasks validate` for every task."""
    loaded = load_task(task(tmp_path), suite="harbor:x")
    env = Failing(TreeError("the tree does not fit a workspace's 256 MB"))
    report = asyncio.run(
        validate_workspace_tasks([loaded], cast(Any, env), CheckPlan(2, 1), suite="harbor:x")
    )
    (check,) = report.tasks
    assert check.verdict == "broken"
    assert check.canonical[0].status is ExecStatus.ERROR
    assert "does not fit a workspace's 256 MB" in check.canonical[0].detail


def test_a_task_without_a_solution_is_unjudged_and_the_others_validated(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Once one task without solution/ (optional in Harbor's layout) stopped the whole suite."""
    shutil.rmtree(task(tmp_path, name="alone") / "solution")
    tasks = [load_task(tmp_path / "alone", "harbor:x"), load_task(task(tmp_path), "harbor:x")]
    env = Failing(TreeError("stub"))
    with caplog.at_level(logging.WARNING, logger="tempered.tasks"):
        report = asyncio.run(
            validate_workspace_tasks(tasks, cast(Any, env), CheckPlan(1, 1), suite="harbor:x")
        )
    assert [check.task_id for check in report.tasks] == ["fix-greeting"]
    assert env.resets == 2  # its solution and its untouched workspace, none of `alone`'s
    assert "unjudged: alone: no solution to validate with" in caplog.text
    # reported, in a category of its own: once it was only logged, missing from the report
    assert report.unjudged == ["alone"]
    assert '"unjudged":["alone"]' in report.model_dump_json()
    document = report.quarantine_document()
    assert document["unjudged"] == ["alone"] and "alone" not in report.quarantined
    console = Console(record=True, width=120)
    print_summary(console, report)
    assert re.search(r"unjudged \(not validated\) *│ *1 ", console.export_text())


def reward_of(tmp_path: Path, data: bytes) -> float:
    (tmp_path / "reward.txt").write_bytes(data)
    ran = CommandResult(ExecStatus.PASSED, 0, "", "", False, 1)
    return read_reward(tmp_path, Check(kind="script"), ran)


def test_a_reward_longer_than_it_is_read_is_refused(tmp_path: Path) -> None:
    """Once only the first 64 bytes were read: "1", 200 spaces and "0.0" scored 1.0."""
    assert reward_of(tmp_path, b"1" + b" " * 62 + b"\n") == 1.0  # 64 bytes
    with pytest.raises(InvalidTask, match=r"reward.txt holds more than 64 bytes"):
        reward_of(tmp_path, b"1" + b" " * 200 + b"0.0\n")


@pytest.mark.parametrize("text", [b"-0\n", b"-0.0", b" -0e5 "])
def test_a_negative_zero_reward_is_zero(tmp_path: Path, text: bytes) -> None:
    """Once -0 was a score of "-0" in the report."""
    reward = reward_of(tmp_path, text)
    assert reward == 0.0 and math.copysign(1.0, reward) == 1.0


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bwrap")
def test_a_nul_the_sandbox_cannot_take_closes_its_pipe_and_is_no_platform_fault(
    tmp_path: Path,
) -> None:
    """Once its status pipe leaked on every try (only an OSError closed it)."""
    mounts = Mounts(workspace=tmp_path, env={"E": "a\0b"})

    async def attempt() -> tuple[int, int]:
        before = len(os.listdir("/proc/self/fd"))
        with pytest.raises(ValueError, match="null byte"):  # SandboxNotUp is no ValueError
            await CommandRunner().run(
                "true", mounts, session_uid(7), SandboxLimits(), cgroup_name(7)
            )
        return before, len(os.listdir("/proc/self/fd"))

    before, after = asyncio.run(attempt())
    assert after == before
