"""Harbor task input the review found mishandled: a file name that is not UTF-8 stopped the
whole suite's load, tests/ too large for any verifier loaded, a WORKDIR above the verifier's
mounts let the agent break them, and errors named internal fields or hid where a file broke."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from contracts.task import MAX_CHECK_S
from infra.tasks.harbor import TaskInputError, load_harbor, load_task
from infra.tasks.harbor_dockerfile import MAX_TASK_MB
from tests.infra.tasks.harbor_review_tasks import harbor_task, put, sparse


@pytest.mark.parametrize("where", ["environment", "tests", "solution"])
def test_a_file_name_that_is_not_utf8_is_that_tasks_error(tmp_path: Path, where: str) -> None:
    """Once PydanticSerializationError out of the loader: no task of the suite loaded."""
    harbor_task(tmp_path, "good")
    put(harbor_task(tmp_path, "bad"), where, b"caf\xe9.txt")
    tasks, errors = load_harbor(tmp_path)
    assert [t.spec.id for t in tasks] == ["good"]
    assert re.fullmatch(rf"task bad: .*/bad/{where}/caf\\xe9\.txt: .*not UTF-8.*", errors["bad"])
    json.dumps(errors)  # printable as `tasks validate --json` prints it


def test_a_directory_name_that_is_not_utf8_is_refused_in_it(tmp_path: Path) -> None:
    harbor_task(tmp_path, "good")
    (harbor_task(tmp_path, "bad") / "tests" / "d").mkdir()
    (tmp_path / "bad" / "tests" / "d" / "x.txt").write_text("x")
    (tmp_path / "bad" / "tests" / "d").rename(tmp_path / "bad" / "tests" / "d\udce9")
    tasks, errors = load_harbor(tmp_path)
    assert "bad" in errors and "d\\xe9" in errors["bad"], errors


def test_a_task_directory_named_in_not_utf8_is_its_error(tmp_path: Path) -> None:
    harbor_task(tmp_path, "good")
    harbor_task(tmp_path, b"caf\xe9")
    tasks, errors = load_harbor(tmp_path)
    assert [t.spec.id for t in tasks] == ["good"]
    assert list(errors) == ["caf\\xe9"] and "caf\\xe9" in errors["caf\\xe9"], errors
    json.dumps(errors)


@pytest.mark.parametrize("where", ["tests", "solution"])
def test_tests_or_a_solution_past_a_workspace_is_refused_at_load(
    tmp_path: Path, where: str
) -> None:
    """Once tests/ up to 1024 MB loaded, and its verify restored it into a workspace's tmpfs
    (256 MB): no verify could ever take it."""
    directory = harbor_task(tmp_path)
    size = (2 << 20) + 1
    sparse(directory / where / "fixture.bin", size)
    with pytest.raises(TaskInputError) as raised:
        load_task(directory, suite="harbor:x", max_mb=2)
    assert f"{where}/fixture.bin: {size} bytes: {where}/ would take more than" in str(raised.value)
    assert "a workspace's 2 MB" in str(raised.value)
    sparse(directory / where / "fixture.bin", (1 << 20))  # 1 MB fits a workspace of 2
    load_task(directory, suite="harbor:x", max_mb=2)


def test_the_default_cap_of_tests_is_a_workspaces_size(tmp_path: Path) -> None:
    directory = harbor_task(tmp_path)
    sparse(directory / "tests" / "fixture.bin", (MAX_TASK_MB << 20) + 1)
    with pytest.raises(
        TaskInputError, match=rf"tests/ would take more than a workspace's {MAX_TASK_MB} MB"
    ):
        load_task(directory, suite="harbor:x")


@pytest.mark.parametrize("workdir", ["/logs", "/logs/"])
def test_a_workdir_above_the_verifiers_mounts_is_refused(tmp_path: Path, workdir: str) -> None:
    """Once `WORKDIR /logs` loaded: the agent could make /logs/verifier a file or a link, the
    verifier's mount failed, and the verify was retried for ever as a platform fault."""
    directory = harbor_task(tmp_path)
    (directory / "environment" / "Dockerfile").write_text(f"FROM x\nWORKDIR {workdir}\nCOPY . .\n")
    with pytest.raises(TaskInputError, match=r"Dockerfile:2: WORKDIR '/logs' holds /logs/verifier"):
        load_task(directory, suite="harbor:x")


@pytest.mark.parametrize("value", ["-1", "0", "inf", "nan", "1e9", '"7200"'])
def test_a_bad_timeout_names_the_tasks_key_and_the_cap(tmp_path: Path, value: str) -> None:
    """Once `timeout_s: Input should be less than or equal to 3600`: a field of Tempered's,
    not task.toml's, and for -1 or 0 no word of the cap."""
    directory = harbor_task(tmp_path)
    (directory / "task.toml").write_text(f"[verifier]\ntimeout_sec = {value}\n")
    with pytest.raises(TaskInputError) as raised:
        load_task(directory, suite="harbor:x")
    message = str(raised.value)
    assert "task.toml: [verifier] timeout_sec: " in message and "timeout_s:" not in message
    assert f"at most {MAX_CHECK_S:g}" in message, message


def test_the_cap_itself_loads(tmp_path: Path) -> None:
    directory = harbor_task(tmp_path)
    (directory / "task.toml").write_text(f"[verifier]\ntimeout_sec = {MAX_CHECK_S}\n")
    check = load_task(directory, suite="harbor:x").tests.manifest.check
    assert check is not None and check.timeout_s == MAX_CHECK_S


def test_an_instruction_that_is_not_utf8_names_the_byte_and_where(tmp_path: Path) -> None:
    directory = harbor_task(tmp_path)
    (directory / "instruction.md").write_bytes(b"Fix it.\nCaf\xe9 au lait\n")
    with pytest.raises(TaskInputError) as raised:
        load_task(directory, suite="harbor:x")
    assert str(raised.value).endswith(
        "instruction.md: not UTF-8: byte 0xe9 at offset 11 (line 2, column 4)"
    ), raised.value
