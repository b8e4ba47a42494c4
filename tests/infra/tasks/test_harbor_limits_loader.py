"""Harbor's `[environment] memory_mb` (and the older `memory = "4G"`) is carried by the loaded
task (`WorkspaceSpec.memory_mb`) and no longer warned of as "not applied"; a size past a
sandbox's bounds (`SandboxLimits.memory_mb`: 16 to 65536 MB) is the task's error at load,
naming the task, task.toml, the key and the bound. The limits nothing applies (cpus, whose
sandbox has no CPU share; storage_mb, whose workspace quota is the worker's; gpus;
allow_internet; [agent] timeout_sec) are still one warning each. A task that states no memory
sends its workspace as before: no `memory_mb` on the wire, which an older sandbox worker
(refusing unknown fields) would refuse."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
from temporalio.contrib.pydantic import pydantic_data_converter

from contracts.task import WorkspaceSpec
from infra.tasks.harbor import TaskInputError, load_harbor, load_task
from tests.infra.tasks.harbor_review_tasks import harbor_task

CONVERTER = pydantic_data_converter.payload_converter


def with_toml(tmp_path: Path, extra: str, name: str = "fix-greeting") -> Path:
    directory = harbor_task(tmp_path, name)
    (directory / "task.toml").write_text(extra + "[verifier]\ntimeout_sec = 30.0\n")
    return directory


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def memory_of(tmp_path: Path, environment: str) -> int | None:
    loaded = load_task(with_toml(tmp_path, f"[environment]\n{environment}"), suite="harbor:x")
    assert loaded.spec.workspace is not None
    return loaded.spec.workspace.memory_mb


@pytest.mark.parametrize(
    ("environment", "mb"),
    [
        ("memory_mb = 4096\n", 4096),
        ('memory_mb = "2048"\n', 2048),  # Harbor's int field takes a numeric string
        ("memory_mb = 16\n", 16),
        ("memory_mb = 65536\n", 65536),
        ('memory = "4G"\n', 4096),
        ('memory = "0.5g"\n', 512),
        ('memory = " 512M "\n', 512),
        ('memory = "1048576K"\n', 1024),
        ('memory_mb = 2048\nmemory = "2G"\n', 2048),  # both, the same size
        ("cpus = 2\n", None),
    ],
)
def test_the_tasks_memory_is_carried_in_mb(tmp_path: Path, environment: str, mb: int) -> None:
    assert memory_of(tmp_path, environment) == mb


def test_a_stated_memory_is_no_warning_the_other_limits_still_are(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    toml = (
        '[agent]\ntimeout_sec = 5.0\n[environment]\nmemory_mb = 4096\nmemory = "4G"\n'
        'cpus = 4\nstorage_mb = 20480\nstorage = "20G"\ngpus = 1\n'
    )
    with caplog.at_level(logging.WARNING, logger="tempered.tasks"):
        load_task(with_toml(tmp_path, toml), suite="harbor:x")
    warnings = warnings_of(caplog)  # the path holds the test's name: what follows it
    assert not [line for line in warnings if "memory" in line.split("task.toml: ")[1]], warnings
    keys = [re.search(r"(\[\w+\] \w+) = ", line)[1] for line in warnings]  # type: ignore[index]
    assert keys == [
        "[agent] timeout_sec",
        "[environment] cpus",
        "[environment] storage_mb",
        "[environment] storage",
        "[environment] gpus",
    ], warnings
    assert all("not applied" in line for line in warnings)


@pytest.mark.parametrize(
    ("environment", "message"),
    [
        ("memory_mb = 100000\n", r"\[environment\] memory_mb = 100000: .*at most 65536 MB"),
        ("memory_mb = 8\n", r"\[environment\] memory_mb = 8: .*at least 16 MB"),
        ("memory_mb = 0\n", r"\[environment\] memory_mb = 0: .*at least 16 MB"),
        ('memory = "128G"\n', r"\[environment\] memory = \"128G\": 131072 MB.*at most 65536 MB"),
        ('memory = "4GB"\n', r"\[environment\] memory: '4GB' is not a size"),
        ('memory = "nanG"\n', r"\[environment\] memory: 'nanG' is not a size"),
        ('memory = "lots"\n', r"\[environment\] memory: 'lots' is not a size"),
        (
            'memory_mb = 4096\nmemory = "2G"\n',
            r"\[environment\] memory_mb = 4096 and memory = \"2G\" \(2048 MB\) differ",
        ),
    ],
    ids=["above", "below", "zero", "string-above", "GB", "nan", "word", "conflict"],
)
def test_a_memory_outside_the_bounds_is_the_tasks_error_naming_key_and_bound(
    tmp_path: Path, environment: str, message: str
) -> None:
    harbor_task(tmp_path, "good")
    with_toml(tmp_path, f"[environment]\n{environment}", name="bad")
    tasks, errors = load_harbor(tmp_path)
    assert [t.spec.id for t in tasks] == ["good"], errors
    assert re.match(rf"task bad: \S+/bad/task.toml: {message}", errors["bad"]), errors
    if "differ" not in message and "not a size" not in message:
        assert "SandboxLimits.memory_mb" in errors["bad"], errors


def test_a_bound_error_is_a_task_input_error(tmp_path: Path) -> None:
    with pytest.raises(TaskInputError, match=r"task fix-greeting: .*memory_mb = 70000"):
        load_task(with_toml(tmp_path, "[environment]\nmemory_mb = 70000\n"), suite="harbor:x")


def test_a_workspace_without_memory_is_sent_as_before(tmp_path: Path) -> None:
    loaded = load_task(with_toml(tmp_path, ""), suite="harbor:x")
    assert loaded.spec.workspace is not None and loaded.spec.workspace.memory_mb is None
    [payload] = CONVERTER.to_payloads([loaded.spec.workspace])
    assert b"memory_mb" not in payload.data
    stated = loaded.spec.workspace.model_copy(update={"memory_mb": 1024})
    [payload] = CONVERTER.to_payloads([stated])
    assert b'"memory_mb":1024' in payload.data
    assert CONVERTER.from_payloads([payload], [WorkspaceSpec]) == [stated]
