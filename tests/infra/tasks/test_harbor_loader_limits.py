"""Harbor's task.toml limits ([environment] memory_mb, cpus, storage_mb, gpus, allow_internet;
[agent] timeout_sec): memory applies (tests/infra/tasks/test_harbor_limits_loader.py); each
other one a task sets is said at load, one warning line naming the task, the key and the value.
Once they loaded with no word, and a task asking for 4096 MB whose pytest needed 1 GB scored a
correct answer 0."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from infra.tasks.harbor import TaskInputError, load_harbor, load_task
from tests.infra.tasks.harbor_review_tasks import harbor_task
from tests.paths import REPO_ROOT

LIMITS = (
    "[agent]\ntimeout_sec = 5.0\n"
    "[environment]\nmemory_mb = 4096\ncpus = 4\nstorage_mb = 20480\ngpus = 1\n"
    'memory = "4G"\nstorage = "20G"\nallow_internet = false\n'
)


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def with_toml(tmp_path: Path, extra: str, name: str = "fix-greeting") -> Path:
    directory = harbor_task(tmp_path, name)
    (directory / "task.toml").write_text(extra + "[verifier]\ntimeout_sec = 30.0\n")
    return directory


def test_each_limit_a_task_sets_is_one_warning_naming_task_key_and_value(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = with_toml(tmp_path, LIMITS)
    with caplog.at_level(logging.WARNING, logger="tempered.tasks"):
        load_task(directory, suite="harbor:x")
    warnings = warnings_of(caplog)
    expected = [
        "[agent] timeout_sec = 5.0",
        "[environment] cpus = 4",
        "[environment] storage_mb = 20480",
        "[environment] gpus = 1",
        '[environment] storage = "20G"',
    ]
    assert len(warnings) == len(expected), warnings  # allow_internet = false: what runs anyway
    for line, key in zip(warnings, expected, strict=True):
        assert line.startswith("task fix-greeting: ") and f"{key}: not applied" in line, line
        assert "\n" not in line
    assert "cpus" in warnings[1] and "limits" in warnings[1]


def test_allow_internet_true_is_warned_the_sandbox_has_no_network(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = with_toml(tmp_path, "[environment]\nallow_internet = true\n")
    with caplog.at_level(logging.WARNING, logger="tempered.tasks"):
        load_task(directory, suite="harbor:x")
    (warning,) = warnings_of(caplog)
    assert re.fullmatch(
        r"task fix-greeting: \S+/task.toml: \[environment\] allow_internet = true: not applied: "
        r".*no network.*",
        warning,
    ), warning


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ('[environment]\nmemory_mb = "lots"\n', r"\[environment\] memory_mb: .*not 'lots'"),
        ("[environment]\ncpus = true\n", r"\[environment\] cpus: .*not a boolean"),
        ('[environment]\nallow_internet = "no"\n', r"\[environment\] allow_internet: .*"),
        ("[agent]\ntimeout_sec = [1]\n", r"\[agent\] timeout_sec: .*not an array"),
        ("environment = 3\n", r"\[environment\] is not a table"),
    ],
    ids=["memory-word", "cpus-bool", "internet-word", "agent-array", "not-a-table"],
)
def test_a_limit_of_the_wrong_type_is_the_tasks_error(
    tmp_path: Path, toml: str, message: str
) -> None:
    harbor_task(tmp_path, "good")
    with_toml(tmp_path, toml, name="bad")
    tasks, errors = load_harbor(tmp_path)
    assert [t.spec.id for t in tasks] == ["good"], errors
    assert re.match(rf"task bad: \S+/bad/task.toml: {message}", errors["bad"]), errors


def test_the_bundled_examples_load_without_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    """fix-greeting once set `[agent] timeout_sec = 120.0`, which nothing applies."""
    with caplog.at_level(logging.WARNING, logger="tempered.tasks"):
        tasks, errors = load_harbor(REPO_ROOT / "examples" / "harbor")
    assert not errors and len(tasks) == 3
    assert warnings_of(caplog) == []


def test_a_limit_error_is_a_task_input_error(tmp_path: Path) -> None:
    with pytest.raises(TaskInputError, match=r"\[environment\] storage_mb: "):
        load_task(with_toml(tmp_path, "[environment]\nstorage_mb = 1.5\n"), suite="harbor:x")
