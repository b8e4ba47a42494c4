"""A Dockerfile's continued lines and COPY's quoted words read as Docker reads them, and a
COPY heredoc or an empty tests/test.sh refused naming what is wrong. Once `WORKDIR /ap\\` +
`p` read as '/ap p' (refused), `COPY a.txt '$D'` expanded $D inside single quotes, a heredoc
was "no such file <<EOF", and an empty test.sh loaded."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.tasks.harbor import TaskInputError, load_harbor, load_task, read_dockerfile
from tests.infra.tasks.harbor_review_tasks import harbor_task


def dockerfile(tmp_path: Path, text: str, files: dict[str, str] | None = None) -> Path:
    context = tmp_path / "environment"
    context.mkdir()
    for name, content in (files or {}).items():
        (context / name).write_text(content)
    path = context / "Dockerfile"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "workdir"),
    [
        ("FROM a\nWORKDIR /ap\\\np\n", "/app"),
        ("FROM a\nWORKDIR /srv\\\n/app\n", "/srv/app"),
        ("FROM a\nWORKDIR /srv/\\\n  # a comment inside\napp\n", "/srv/app"),
        ("FROM a\nWORKDIR \\\n  /srv\n", "/srv"),
        ("FROM a\nWORKDIR /sr\\  \nv\n", "/srv"),
        ("FROM a\nWORKDIR /srv/\\\n\napp\n", "/srv/app"),
    ],
    ids=["no-space", "slash", "comment-inside", "indent-kept", "trailing-blank", "empty-line"],
)
def test_a_continued_line_is_joined_as_docker_joins_it(
    tmp_path: Path, text: str, workdir: str
) -> None:
    assert read_dockerfile(dockerfile(tmp_path, text))[0] == workdir


def test_a_continued_instruction_keeps_the_next_lines_leading_space(tmp_path: Path) -> None:
    text = "FROM a\nWORKDIR /app\nCOPY a.txt\\\n b.txt\\\n  sub/\n"
    _, files, _ = read_dockerfile(dockerfile(tmp_path, text, {"a.txt": "a", "b.txt": "b"}))
    assert sorted(files) == ["sub/a.txt", "sub/b.txt"]


@pytest.mark.parametrize(
    ("copy", "target"),
    [
        ("COPY a.txt '$D'", "$D"),
        ('COPY a.txt "$D"', "zz"),
        ("COPY a.txt $D", "zz"),
        ("COPY a.txt '${D}x'", "${D}x"),
        ("COPY a.txt \\$D", "$D"),
        ('COPY ["a.txt", "$D"]', "zz"),
    ],
    ids=["single", "double", "bare", "braces-single", "escaped", "json"],
)
def test_copy_expands_variables_outside_single_quotes_only(
    tmp_path: Path, copy: str, target: str
) -> None:
    text = f"FROM a\nWORKDIR /app\nENV D=zz\n{copy}\n"
    _, files, _ = read_dockerfile(dockerfile(tmp_path, text, {"a.txt": "x"}))
    assert list(files) == [target]


@pytest.mark.parametrize("copy", ["COPY <<EOF /app/x.txt", "COPY <<-EOF x.txt", 'COPY <<"EOF" .'])
def test_a_copy_heredoc_is_said_to_be_unsupported(tmp_path: Path, copy: str) -> None:
    text = f"FROM a\nWORKDIR /app\n{copy}\nhello\nEOF\n"
    with pytest.raises(TaskInputError, match=r"Dockerfile:3: COPY heredocs .* are not supported"):
        read_dockerfile(dockerfile(tmp_path, text))


@pytest.mark.parametrize("content", ["", "\n \n\t\n"], ids=["empty", "blank"])
def test_an_empty_test_script_is_refused_at_load_naming_it(tmp_path: Path, content: str) -> None:
    harbor_task(tmp_path, "good")
    (harbor_task(tmp_path, "bad") / "tests" / "test.sh").write_text(content)
    tasks, errors = load_harbor(tmp_path)
    assert [t.spec.id for t in tasks] == ["good"], errors
    assert errors["bad"].startswith("task bad: ") and "/bad/tests/test.sh: empty" in errors["bad"]
    with pytest.raises(TaskInputError, match=r"tests/test\.sh: empty"):
        load_task(tmp_path / "bad", suite="harbor:x")
