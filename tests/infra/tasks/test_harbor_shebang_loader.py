"""The Harbor loader refuses a tests/test.sh whose `#!` line no command can name, naming the file
(every verify of it would fail: `checks.shebang`), and takes any interpreter the line names."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from infra.tasks.harbor import TaskInputError, load_task
from tests.paths import REPO_ROOT

EXAMPLE = REPO_ROOT / "examples" / "harbor" / "fix-greeting"


def with_test_sh(tmp_path: Path, data: bytes) -> Path:
    directory = Path(shutil.copytree(EXAMPLE, tmp_path / "fix-greeting"))
    (directory / "tests" / "test.sh").write_bytes(data)
    return directory


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"#!/bin/sh " + b"x" * 300 + b"\n", "longer than 255 bytes"),
        (b"#!/bin/sh\x00\n", "holds a NUL"),
        (b"#!/bin/caf\xe9\n", "not UTF-8"),
    ],
    ids=["long", "nul", "latin-1"],
)
def test_a_shebang_no_command_can_name_is_refused(tmp_path: Path, data: bytes, why: str) -> None:
    directory = with_test_sh(tmp_path, data)
    with pytest.raises(
        TaskInputError, match=rf"^task fix-greeting: {directory}/tests/test.sh: its #! line .*{why}"
    ):
        load_task(directory, suite="harbor:x")


@pytest.mark.parametrize(  # an empty one is refused: test_harbor_loader_dockerfile_words.py
    "data", [b"#!/usr/bin/env python3\nprint()\n", b"echo 1\n", b"#!/bin/sh -e\n"]
)
def test_any_interpreter_loads(tmp_path: Path, data: bytes) -> None:
    assert load_task(with_test_sh(tmp_path, data), suite="harbor:x").spec.workspace is not None
