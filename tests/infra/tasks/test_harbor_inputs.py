"""Harbor task input the loader once mishandled: Dockerfile lines that escaped as another
exception (and stopped every task of the directory), task files that were links to the host,
Dockerfile faults blamed on task.toml, and valid Dockerfiles Docker builds that were refused."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from infra.tasks import harbor_dockerfile
from infra.tasks.harbor import TaskInputError, load_harbor, load_task, read_dockerfile
from tests.paths import REPO_ROOT

EXAMPLES = REPO_ROOT / "examples" / "harbor"


def task(tmp_path: Path, dockerfile: str, name: str = "fix-greeting") -> Path:
    """A copy of the fix-greeting example (greet.py in its build context) with `dockerfile`."""
    directory = Path(shutil.copytree(EXAMPLES / "fix-greeting", tmp_path / name))
    (directory / "environment" / "Dockerfile").write_text(dockerfile)
    return directory


def workspace(directory: Path) -> tuple[str, list[str]]:
    loaded = load_task(directory, suite="harbor:x")
    assert loaded.spec.workspace is not None
    return loaded.spec.workspace.workdir, [e.path for e in loaded.files.manifest.files()]


HOSTILE = {
    "absolute-glob": "COPY /*.py /app/",
    "double-star": "COPY **.py /app/",
    "double-star-dir": "COPY src**/x /app/",
    "nul-source": "COPY gr\0eet.py /app/",
    "nul-workdir": "WORKDIR /app/a\0b",
    "nul-env": "ENV A=a\0b",
    "link-loop": "COPY loop /app/",
    "fifo": "COPY pipe /app/",
    "bad-json": 'COPY ["greet.py", /app/',
    "empty-source": 'COPY "" /app/',
    "empty-workdir": 'WORKDIR ""',
    "root": "COPY / /app/",
    "parent-glob": "COPY ../*/task.toml /app/",
    "bracket": "COPY [ /app/",
    "spaced-workdir": "WORKDIR /srv/my app",
}

WHOLE_CONTEXT = {HOSTILE["root"]}  # an empty source is refused (test_harbor62b_copy.py)
"""The lines that copy the build context whole, the test's link and FIFO in it."""


@pytest.mark.parametrize("line", HOSTILE.values(), ids=HOSTILE.keys())
def test_no_dockerfile_line_escapes_the_loader_or_stops_the_other_tasks(
    tmp_path: Path, line: str
) -> None:
    """Once `COPY /*.py` raised NotImplementedError, `COPY **.py` ValueError (pathlib's glob),
    a NUL a ValueError, a link loop a RuntimeError: out of load_harbor, every task lost. A
    line that copies the whole context copies the link too: the link's error, naming it."""
    task(tmp_path, "FROM python\nCOPY greet.py /app/\n", name="good")
    bad = task(tmp_path, f"FROM python\n{line}\n", name="bad")
    (bad / "environment" / "loop").symlink_to("loop")
    os.mkfifo(bad / "environment" / "pipe")
    tasks, errors = load_harbor(tmp_path)
    assert "good" in [t.spec.id for t in tasks]
    at_fault = "loop: is a link" if line in WHOLE_CONTEXT else "Dockerfile"
    assert not errors or errors["bad"].startswith(f"task bad: {bad}/environment/{at_fault}")


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("COPY **.py /app/", r"Dockerfile:2: COPY \*\*\.py: a pattern this loader cannot read"),
        ("COPY gr\0eet.py /app/", r"Dockerfile:2: a NUL character"),
        ("COPY loop /app/", r"Dockerfile:2: COPY loop: .*loop"),
        ("COPY pipe /app/", r"Dockerfile:2: COPY pipe: .* is neither a file nor a directory"),
    ],
)
def test_what_cannot_be_copied_is_the_dockerfiles_error_by_line(
    tmp_path: Path, line: str, message: str
) -> None:
    directory = task(tmp_path, f"FROM python\n{line}\n")
    (directory / "environment" / "loop").symlink_to("loop")
    os.mkfifo(directory / "environment" / "pipe")
    with pytest.raises(TaskInputError, match=message):
        load_task(directory, suite="harbor:x")


@pytest.mark.parametrize("source", ["/*.py", "/greet.py", "//greet.py", "/"])
def test_a_copy_source_with_a_leading_slash_is_in_the_context_as_docker_reads_it(
    tmp_path: Path, source: str
) -> None:
    """Once `/greet.py` was the host's /greet.py (outside the context) and `/*.py` an escape."""
    directory = task(tmp_path, f"FROM python\nCOPY {source} /app/\n")
    expected = ["Dockerfile", "greet.py"] if source == "/" else ["greet.py"]
    assert workspace(directory) == ("/app", expected)


def test_an_unreadable_file_is_the_loaders_error_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once a PermissionError out of load_harbor (every task lost). Run as root, so a mode of
    000 would not stop the read: the read fails here instead."""
    task(tmp_path, "FROM python\nCOPY greet.py /app/\n", name="good")
    bad = task(tmp_path, "FROM python\nCOPY greet.py /app/\n", name="bad")
    read_regular = harbor_dockerfile.read_regular
    for part in ("environment/greet.py", "tests/test_greet.py"):
        unreadable = bad / part

        def refuse(path: Path, *args: Any, unreadable: Path = unreadable, **kw: Any) -> bytes:
            if path == unreadable:
                raise PermissionError(13, "Permission denied", str(path))
            return read_regular(path, *args, **kw)

        with monkeypatch.context() as patch:
            patch.setattr(harbor_dockerfile, "read_regular", refuse)
            tasks, errors = load_harbor(tmp_path)
        assert [t.spec.id for t in tasks] == ["good"]
        assert errors == {"bad": f"task bad: {unreadable}: unreadable (Permission denied)"}


@pytest.mark.parametrize("part", ["instruction.md", "task.toml"])
def test_the_prompt_and_the_config_may_not_be_links(tmp_path: Path, part: str) -> None:
    """Once `instruction.md -> /etc/...` made a host file the prompt (sent to the model)."""
    directory = task(tmp_path, "FROM python\nCOPY greet.py /app/\n")
    secret = tmp_path / "secret"
    shutil.copy(directory / part, secret)  # the secret is a valid file of its kind
    (directory / part).unlink()
    (directory / part).symlink_to(secret)
    with pytest.raises(TaskInputError, match=rf"task fix-greeting: .*/{part}: is a link"):
        load_task(directory, suite="harbor:x")


@pytest.mark.parametrize(
    ("dockerfile", "message"),
    [
        ("WORKDIR /srv/my app\n", r"Dockerfile:2: WORKDIR '/srv/my app': String should match"),
        (  # a file, then a directory at its path
            "COPY greet.py /app/lib\nCOPY tests /app/lib\n",
            r"Dockerfile:3: /app/lib is a file an earlier COPY put there, not a directory",
        ),
        ("COPY tests /app/lib/\nCOPY greet.py /app/lib/x/a.py\n", None),  # fine
        (  # a directory, then a file at its path (the files of `tests` go into lib/x)
            "COPY tests /app/lib/x\nCOPY greet.py /app/lib/\nCOPY greet.py /app/lib/x/y.py/\n",
            None,
        ),
        (
            "COPY greet.py /app/a\nCOPY greet.py /app/a/\n",
            r"Dockerfile:3: /app/a is a file an earlier COPY put there",
        ),
        (
            "COPY greet.py /app/a\nWORKDIR /app/a\n",
            r"Dockerfile:3: /app/a is a file an earlier COPY put there",
        ),
    ],
)
def test_a_bad_workdir_or_file_tree_is_the_dockerfiles_error_not_task_tomls(
    tmp_path: Path, dockerfile: str, message: str | None
) -> None:
    directory = task(tmp_path, "FROM python\n" + dockerfile)
    (directory / "environment" / "tests").mkdir()
    (directory / "environment" / "tests" / "t.py").write_text("t")
    if message is None:
        load_task(directory, suite="harbor:x")
        return
    with pytest.raises(TaskInputError, match=message) as caught:
        load_task(directory, suite="harbor:x")
    assert "task.toml" not in str(caught.value)


def test_a_bad_split_is_still_task_tomls_error(tmp_path: Path) -> None:
    directory = task(tmp_path, "FROM python\nCOPY greet.py /app/\n")
    (directory / "task.toml").write_text('[metadata]\nsplit = "later"\n')
    with pytest.raises(TaskInputError, match=r"task.toml: split: Input should be"):
        load_task(directory, suite="harbor:x")


@pytest.mark.parametrize(
    ("dockerfile", "expected"),
    [
        ('WORKDIR "/srv/app"\nCOPY greet.py .\n', ("/srv/app", ["greet.py"])),
        ("ENV B=/srv\nWORKDIR \"$B\"/'app'\nCOPY greet.py .\n", ("/srv/app", ["greet.py"])),
        (  # a destination that is a directory already takes the file into it
            "COPY lib /app/lib\nCOPY greet.py /app/lib\n",
            ("/app", ["lib/b.py", "lib/greet.py"]),
        ),
        (  # WORKDIR makes its directory (and its parents)
            "WORKDIR /app/sub\nWORKDIR /app\nCOPY greet.py sub\nCOPY greet.py /app/sub2\n",
            ("/app", ["sub/greet.py", "sub2"]),
        ),
        ("\ufeffFROM python\nCOPY greet.py /app/\n", ("/app", ["greet.py"])),  # a UTF-8 BOM
        ("COPY\tgreet.py /app/\n", ("/app", ["greet.py"])),  # a tab after the instruction
        ("WORKDIR //srv//app\nCOPY greet.py .\n", ("/srv/app", ["greet.py"])),
    ],
    ids=["quoted-workdir", "workdir-words", "into-a-dir", "workdir-dirs", "bom", "tab", "slashes"],
)
def test_dockerfiles_docker_builds_load(
    tmp_path: Path, dockerfile: str, expected: tuple[str, list[str]]
) -> None:
    if not dockerfile.startswith("\ufeff"):
        dockerfile = "FROM python\n" + dockerfile
    directory = task(tmp_path, dockerfile)
    (directory / "environment" / "lib").mkdir()
    (directory / "environment" / "lib" / "b.py").write_text("b")
    assert workspace(directory) == expected


def test_read_dockerfile_reads_a_bom(tmp_path: Path) -> None:
    (tmp_path / "Dockerfile").write_bytes("\ufeffFROM a\nENV A=1\n".encode())
    assert read_dockerfile(tmp_path / "Dockerfile") == ("/app", {}, {"A": "1"})


@pytest.mark.parametrize("part", ["environment", "tests", "solution"])
def test_a_task_toml_fixture_in_a_tasks_own_directories_is_no_task(
    tmp_path: Path, part: str
) -> None:
    """Once the task named directly was refused as "holds task.toml and task directories
    too": its environment/, tests/ and solution/ are its own, whatever they hold."""
    directory = task(tmp_path, "FROM python\nCOPY greet.py /app/\n")
    (directory / part / "task.toml").write_text('version = "1.0"\n')
    tasks, errors = load_harbor(directory)
    assert [t.spec.id for t in tasks] == ["fix-greeting"] and errors == {}
