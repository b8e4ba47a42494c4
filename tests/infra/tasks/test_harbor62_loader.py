"""Harbor tasks the loader took that every verify then failed or mis-read (review 62).

- A Dockerfile's `${VAR:-word}`, `${VAR:+word}`, `${VAR-word}`, `${VAR+word}` were taken as
  literal text (`ENV A=${B:+x}` loaded as '${B:+x}'; `WORKDIR $APP` after
  `ENV APP=${APP:-/srv/app}` failed at the WORKDIR line, not where the text was): they are
  expanded as Docker expands them, and a `${` this loader cannot read is the Dockerfile's error
  naming its line.
- A CRLF tests/test.sh (`#!/bin/bash\\r`) loaded, then every verify failed with 127 (the
  kernel looked for `/bin/bash\\r`): refused, naming the file and line 1.
- `[verifier] timeout_sec = 0.001` loaded, and a correct solution scored 0 (timeout) on every
  verify: a check takes at least `harbor_toml.MIN_CHECK_S`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.tasks.harbor import TaskInputError, load_task, read_dockerfile
from tests.infra.tasks.harbor_review_tasks import harbor_task


def dockerfile(tmp_path: Path, text: str) -> Path:
    context = tmp_path / "environment"
    context.mkdir()
    (context / "a.txt").write_text("a")
    path = context / "Dockerfile"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("ENV A=${B:+x}", ""),  # B unset: empty
        ("ENV B=1\nENV A=${B:+x}", "x"),
        ("ENV B=\nENV A=${B:+x}", ""),  # set but empty: `:+` takes it as unset
        ("ENV B=\nENV A=${B+x}", "x"),  # set (empty): `+` takes it as set
        ("ENV A=${B:-dflt}", "dflt"),
        ("ENV B=\nENV A=${B:-dflt}", "dflt"),
        ("ENV B=\nENV A=${B-dflt}", ""),  # set, empty: `-` keeps it
        ("ENV A=${B-dflt}", "dflt"),
        ("ENV B=v\nENV A=${B:-dflt}", "v"),
        ("ENV C=c\nENV A=${B:-$C/x}", "c/x"),  # the word expanded too
        ("ENV C=c\nENV A=${B:-${C:+y}z}", "yz"),  # nested
        ('ENV A="${B:-two words}"', "two words"),
        ("ENV A=${B:-two\\ words}", "two words"),
        ("ENV A=pre${B:-mid}post", "premidpost"),
        ("ENV A='${B:-x}'", "${B:-x}"),  # single quotes: literal
        ("ENV A=${HOME:+set}", "set"),  # the sandbox's BASE_ENV
    ],
)
def test_docker_modifiers_are_expanded_as_docker_expands_them(
    tmp_path: Path, line: str, expected: str
) -> None:
    _, _, env = read_dockerfile(dockerfile(tmp_path, f"FROM x\n{line}\nCOPY a.txt .\n"))
    assert env["A"] == expected


def test_a_default_workdir_from_env_is_used(tmp_path: Path) -> None:
    text = "FROM x\nENV APP=${APP:-/srv/app}\nWORKDIR $APP\nCOPY a.txt .\n"
    workdir, files, _ = read_dockerfile(dockerfile(tmp_path, text))
    assert (workdir, list(files)) == ("/srv/app", ["a.txt"])


def test_a_modifier_in_a_copy_json_array_is_expanded(tmp_path: Path) -> None:
    text = 'FROM x\nWORKDIR /app\nCOPY ["${SRC:-a.txt}", "${DST:-b.txt}"]\n'
    _, files, _ = read_dockerfile(dockerfile(tmp_path, text))
    assert list(files) == ["b.txt"]


@pytest.mark.parametrize(
    "line",
    [
        "ENV A=${B:?must be set}",
        "ENV A=${B#x}",
        "ENV A=${B%x}",
        "ENV A=${B/x/y}",
        "ENV A=${B",
        "ENV A=${B:-x",
        "ENV A=${}",
        "ENV A=${:-x}",
        "ENV A=${B:=x}",
        'COPY ["${B:-a.txt", "."]',
    ],
)
def test_a_substitution_this_loader_cannot_read_is_the_dockerfiles_error(
    tmp_path: Path, line: str
) -> None:
    path = dockerfile(tmp_path, f"FROM x\nWORKDIR /app\n{line}\nCOPY a.txt .\n")
    with pytest.raises(TaskInputError, match=rf"^{path}:3: .*\$\{{"):
        read_dockerfile(path)


@pytest.mark.parametrize(
    "data",
    [b"#!/bin/bash\r\necho 0 > /logs/verifier/reward.txt\r\n", b"#!/bin/sh -e\r\n", b"#!\r\n"],
    ids=["bash", "argument", "bare"],
)
def test_a_crlf_test_sh_is_refused(tmp_path: Path, data: bytes) -> None:
    directory = harbor_task(tmp_path)
    (directory / "tests" / "test.sh").write_bytes(data)
    with pytest.raises(
        TaskInputError, match=rf"^task fix-greeting: {directory}/tests/test.sh:1: CRLF line ending"
    ):
        load_task(directory, suite="harbor:x")


def test_the_review_crlf_task_is_refused() -> None:
    """The reviewer's task (count-lines with a CRLF test.sh), where it is still at hand."""
    directory = Path("/tmp/review-harbor62/crlf")
    if not directory.is_dir():
        pytest.skip("the review's task directory is gone")
    with pytest.raises(TaskInputError, match=r"tests/test.sh:1: CRLF line ending"):
        load_task(directory, suite="harbor:x")


@pytest.mark.parametrize("value", ["0.001", "0.5", '"0.9"', "1e-9"])
def test_a_timeout_below_the_floor_is_refused(tmp_path: Path, value: str) -> None:
    directory = harbor_task(tmp_path)
    (directory / "task.toml").write_text(f"[verifier]\ntimeout_sec = {value}\n")
    with pytest.raises(
        TaskInputError, match=r"task.toml: \[verifier\] timeout_sec: .*at least 1 s"
    ):
        load_task(directory, suite="harbor:x")


def test_the_floor_itself_loads(tmp_path: Path) -> None:
    directory = harbor_task(tmp_path)
    (directory / "task.toml").write_text("[verifier]\ntimeout_sec = 1\n")
    check = load_task(directory, suite="harbor:x").tests.manifest.check
    assert check is not None and check.timeout_s == 1.0
