"""A Harbor Dockerfile's COPY handed the agent files its author kept out (review 62b).

- A source that expanded to nothing (`COPY $SCR /app/`, SCR unset; `COPY ""`) copied the whole
  build context, the Dockerfile and the expected outputs too: the Dockerfile's error now.
- COPY's flags other than --from were dropped: `--exclude=answer_key.txt` put the key in the
  workspace, `--parents` flattened paths, `--chmod=755` was ignored. --chown and --link are
  ignored (harmless), an octal --chmod is applied, any other flag is the Dockerfile's error.
- environment/.dockerignore was not read, so `COPY . /app/` took what it excluded: a COPY
  beside one with patterns is the Dockerfile's error naming it.
- A relative first WORKDIR was taken from /app (`WORKDIR project` as /app/project), where
  Docker takes it from the base image's WORKDIR, which the loader does not read: refused.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.tasks.harbor import TaskInputError, load_task, read_dockerfile
from tests.infra.tasks.harbor_review_tasks import harbor_task


def dockerfile(tmp_path: Path, text: str) -> Path:
    """A build context holding a.txt, answer_key.txt, src/pkg/mod.py and the Dockerfile."""
    context = tmp_path / "environment"
    (context / "src" / "pkg").mkdir(parents=True)
    (context / "a.txt").write_text("a")
    (context / "answer_key.txt").write_text("42")
    (context / "src" / "pkg" / "mod.py").write_text("x = 1\n")
    path = context / "Dockerfile"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "copy",
    [
        "COPY $SCR /app/",
        "ENV SRC=a.txt\nCOPY $SCR /app/",  # a typo
        "COPY ${SRC} /app/",
        'COPY ["${SRC}", "/app/"]',
        'COPY "" /app/',
        "COPY a.txt $SRC /app/",  # one of several
    ],
)
def test_a_copy_source_empty_after_expansion_is_refused(tmp_path: Path, copy: str) -> None:
    path = dockerfile(tmp_path, f"FROM x\nWORKDIR /app\n{copy}\n")
    line = 3 + copy.count("\n")
    with pytest.raises(TaskInputError, match="COPY source is empty after expansion") as error:
        read_dockerfile(path)
    assert str(error.value).startswith(f"{path}:{line}: ")


def test_a_copy_destination_empty_after_expansion_is_refused(tmp_path: Path) -> None:
    path = dockerfile(tmp_path, 'FROM x\nWORKDIR /app\nCOPY ["a.txt", "${DEST}"]\n')
    with pytest.raises(TaskInputError, match=r"Dockerfile:3: COPY destination is empty"):
        read_dockerfile(path)


@pytest.mark.parametrize(
    ("flag", "why"),
    [
        ("--exclude=answer_key.txt", "--exclude"),
        ("--parents", "--parents"),
        ("--chmod=u+x", "octal"),
        ("--chmod=", "octal"),
        ("--chmod=99", "octal"),
        ("--checksum=sha256:0", "--checksum"),
        ("--bogus", "--bogus"),
    ],
)
def test_a_copy_flag_not_taken_is_refused_naming_the_line(
    tmp_path: Path, flag: str, why: str
) -> None:
    path = dockerfile(tmp_path, f"FROM x\nWORKDIR /app\nCOPY {flag} . /app/\n")
    with pytest.raises(TaskInputError, match=rf"Dockerfile:3: COPY .*{why}"):
        read_dockerfile(path)


@pytest.mark.parametrize(
    ("copy", "executable"),
    [
        ("COPY --chmod=755 a.txt /app/run.sh", {"run.sh": True}),
        ("COPY --chmod=0644 a.txt /app/run.sh", {"run.sh": False}),
        ("ENV M=700\nCOPY --chmod=$M a.txt /app/run.sh", {"run.sh": True}),
        ("COPY --chmod=750 src /app/src", {"src/pkg/mod.py": True}),
        ('COPY --chown=1:1 --link --chmod=755 ["a.txt", "run.sh"]', {"run.sh": True}),
        ("COPY --link=false --chown=root a.txt run.sh", {"run.sh": False}),
    ],
)
def test_taken_copy_flags(tmp_path: Path, copy: str, executable: dict[str, bool]) -> None:
    workdir, files, _ = read_dockerfile(dockerfile(tmp_path, f"FROM x\nWORKDIR /app\n{copy}\n"))
    assert workdir == "/app"
    assert {name: file.executable for name, file in files.items()} == executable


def test_a_word_like_a_flag_after_a_source_is_a_source(tmp_path: Path) -> None:
    """Docker reads flags before the sources only: a later `--x` is a file's name."""
    path = dockerfile(tmp_path, "FROM x\nWORKDIR /app\nCOPY a.txt --exclude=a.txt /app/\n")
    with pytest.raises(TaskInputError, match=r"Dockerfile:3: COPY --exclude=a.txt: no such file"):
        read_dockerfile(path)


@pytest.mark.parametrize("name", [".dockerignore", "Dockerfile.dockerignore"])
@pytest.mark.parametrize("copy", ["COPY . /app/", "COPY a.txt /app/"])
def test_a_dockerignore_with_patterns_is_refused_naming_it(
    tmp_path: Path, name: str, copy: str
) -> None:
    path = dockerfile(tmp_path, f"FROM x\nWORKDIR /app\n{copy}\n")
    (path.parent / name).write_text("# the key\nanswer_key.txt\n")
    with pytest.raises(TaskInputError, match=rf"Dockerfile:3: .*{name}") as error:
        read_dockerfile(path)
    assert str(path.parent / name) in str(error.value)


def test_a_dockerignore_without_patterns_or_copy_changes_nothing(tmp_path: Path) -> None:
    path = dockerfile(tmp_path, "FROM x\nWORKDIR /app\nCOPY a.txt /app/\n")
    (path.parent / ".dockerignore").write_text("# nothing kept out\n\n")
    assert sorted(read_dockerfile(path)[1]) == ["a.txt"]
    path.write_text("FROM x\nWORKDIR /app\n")  # no COPY: nothing it could keep out
    (path.parent / ".dockerignore").write_text("answer_key.txt\n")
    assert read_dockerfile(path)[:2] == ("/app", {})


def test_a_dockerignore_that_is_a_link_is_refused(tmp_path: Path) -> None:
    path = dockerfile(tmp_path, "FROM x\nWORKDIR /app\nCOPY a.txt /app/\n")
    (path.parent / ".dockerignore").symlink_to(path.parent / "a.txt")
    with pytest.raises(TaskInputError, match=r"\.dockerignore"):
        read_dockerfile(path)


def test_a_task_whose_dockerignore_keeps_the_key_out_is_that_tasks_error(
    tmp_path: Path,
) -> None:
    directory = harbor_task(tmp_path)  # COPY . .
    (directory / "environment" / "answer_key.txt").write_text("42")
    (directory / "environment" / ".dockerignore").write_text("answer_key.txt\n")
    with pytest.raises(TaskInputError, match=r"environment/\.dockerignore"):
        load_task(directory, suite="harbor:x")


@pytest.mark.parametrize("workdir", ["project", "./project", "$NAME", "${NAME:-project}"])
def test_a_relative_first_workdir_is_refused(tmp_path: Path, workdir: str) -> None:
    path = dockerfile(tmp_path, f"FROM x\nENV NAME=project\nWORKDIR {workdir}\n")
    with pytest.raises(TaskInputError, match=r"Dockerfile:3: WORKDIR .*absolute"):
        read_dockerfile(path)


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        ("WORKDIR /srv\nWORKDIR project", "/srv/project"),  # relative to the one before
        ("WORKDIR /srv/project", "/srv/project"),
        ("", "/app"),  # no WORKDIR: Harbor's /app
    ],
)
def test_a_workdir_after_an_absolute_one_or_none(tmp_path: Path, lines: str, expected: str) -> None:
    path = dockerfile(tmp_path, f"FROM x\n{lines}\n")
    assert read_dockerfile(path)[0] == expected


def test_the_dockerfiles_own_ignore_file_comes_before_dockerignore(tmp_path: Path) -> None:
    """BuildKit reads `Dockerfile.dockerignore` where it exists, `.dockerignore` then unread."""
    path = dockerfile(tmp_path, "FROM x\nWORKDIR /app\nCOPY a.txt /app/\n")
    (path.parent / ".dockerignore").write_text("a.txt\n")
    (path.parent / "Dockerfile.dockerignore").write_text("# none\n")
    assert sorted(read_dockerfile(path)[1]) == ["a.txt"]
